"""The spec of the local NVIDIA GPU: facts from the CUDA runtime (through CuPy) plus measured ceilings.

Probes are small CuPy RawKernels timed with CUDA events (best and median of the repeats):
- ``copy``: device-to-device copy of a 1 GiB float4 buffer; bandwidth counts bytes read + written;
- ``fma``: 8 independent fmaf chains per thread, 8 blocks of 256 threads per SM; an FMA counts 2 FLOP;
- ``exp2``: 8 independent chains of ``exp2f`` (compiled with --use_fast_math: one MUFU ex2.approx each,
  plus one multiply) per thread; counts exp2 evaluations per second, the special-function rate a scan's
  ``exp(dt*A)`` pays once log2(e) is folded into A.
Cached like the CPU spec (`ksearch.hardware.cache`) under a fingerprint of GPU name, compute capability,
driver and runtime versions and the probe version.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

from ksearch.errors import HardwareError
from ksearch.hardware.spec import CacheLevel, HardwareSpec, Measurement

PROBE_VERSION = "gpu-1"
_FLAGS = ("--use_fast_math", "-std=c++17")

_SOURCE = r"""
extern "C" __global__ void copy4(const float4 *__restrict__ src, float4 *__restrict__ dst, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
extern "C" __global__ void fma8(float *out, int iters, float a, float b) {
    float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    for (int i = 0; i < iters; i++) {
        x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
        x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
extern "C" __global__ void exp2x8(float *out, int iters, float s) {
    float x0 = threadIdx.x * 1e-3f, x1 = x0 + .1f, x2 = x0 + .2f, x3 = x0 + .3f, x4 = x0 + .4f, x5 = x0 + .5f,
          x6 = x0 + .6f, x7 = x0 + .7f;
    for (int i = 0; i < iters; i++) {
        x0 = exp2f(x0 * s); x1 = exp2f(x1 * s); x2 = exp2f(x2 * s); x3 = exp2f(x3 * s);
        x4 = exp2f(x4 * s); x5 = exp2f(x5 * s); x6 = exp2f(x6 * s); x7 = exp2f(x7 * s);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
"""


def _cupy():
    try:
        import cupy
    except ImportError:
        raise HardwareError("cupy not installed: no GPU spec (pip install cupy-cuda12x or cupy-cuda13x)") from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise HardwareError("no CUDA device")
    except HardwareError:
        raise
    except Exception as e:
        raise HardwareError(f"no CUDA device ({type(e).__name__}: {e})") from None
    return cupy


def gpu_facts(device: int = 0) -> dict:
    """Detected facts of a CUDA device: name, sms, threads_per_sm, memory_bytes, shared_per_block_bytes
    (opt-in maximum), l2_bytes, max_threads_per_block, cc ("90"), driver and runtime versions.
    Raises HardwareError without CuPy or a device."""
    cp = _cupy()
    p = cp.cuda.runtime.getDeviceProperties(device)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return {"name": name, "sms": int(p["multiProcessorCount"]), "threads_per_sm": int(p["maxThreadsPerMultiProcessor"]),
            "memory_bytes": int(p["totalGlobalMem"]),
            "shared_per_block_bytes": int(p.get("sharedMemPerBlockOptin") or p["sharedMemPerBlock"]),
            "l2_bytes": int(p["l2CacheSize"]), "max_threads_per_block": int(p["maxThreadsPerBlock"]),
            "cc": f"{p['major']}{p['minor']}", "driver": cp.cuda.runtime.driverGetVersion(),
            "runtime": cp.cuda.runtime.runtimeGetVersion()}


def gpu_fingerprint(facts: dict) -> str:
    key = json.dumps([facts["name"], facts["cc"], facts["sms"], facts["driver"], facts["runtime"], PROBE_VERSION])
    return "gpu-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _time(cp, fn, repeats: int) -> list[float]:
    """Seconds per call of ``fn`` (CUDA events), after one warm-up call."""
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    out = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return out


def _measurement(probe: str, unit: str, work: float, seconds: list[float], threads: int, nbytes: int | None,
                 notes: str) -> Measurement:
    rates = sorted(work / s for s in seconds)
    return Measurement(probe=probe, unit=unit, best=rates[-1], median=rates[len(rates) // 2], threads=threads,
                       repeats=len(seconds), bytes=nbytes, compile_flags=list(_FLAGS), notes=notes)


def measure_gpu_ceilings(facts: dict, repeats: int = 10) -> dict[str, Measurement]:
    """Copy bandwidth, FP32 FMA rate and exp2 rate of the current device (see the module docstring)."""
    cp = _cupy()
    mod = cp.RawModule(code=_SOURCE, options=_FLAGS)
    copy4, fma8, exp2x8 = (mod.get_function(n) for n in ("copy4", "fma8", "exp2x8"))
    nbytes = min(1 << 30, facts["memory_bytes"] // 8)
    n4 = nbytes // 16
    src, dst = cp.ones(n4 * 4, cp.float32), cp.empty(n4 * 4, cp.float32)
    blocks = facts["sms"] * 8
    copy_s = _time(cp, lambda: copy4((blocks * 4,), (256,), (src, dst, cp.int64(n4))), repeats)
    src = dst = None  # the device buffers freed (the lambda holds their cells)
    out = cp.empty(blocks * 256, cp.float32)
    threads = blocks * 256
    iters = 1024
    fma_s = _time(cp, lambda: fma8((blocks,), (256,), (out, cp.int32(iters), cp.float32(0.999), cp.float32(1e-3))),
                  repeats)
    exp_s = _time(cp, lambda: exp2x8((blocks,), (256,), (out, cp.int32(iters), cp.float32(-0.5))), repeats)
    return {
        "memory_bandwidth_gbs": _measurement("cuda_copy", "GB/s", 2 * n4 * 16 / 1e9, copy_s, blocks * 4 * 256,
                                             2 * n4 * 16, "device-to-device float4 copy; read + written"),
        "peak_flops.float32": _measurement("cuda_fma", "FLOP/s", 2.0 * 8 * iters * threads, fma_s, threads, None,
                                           "8 independent fmaf chains per thread; FMA = 2 FLOP"),
        "exp_rate_per_s": _measurement("cuda_exp2", "exp/s", 8.0 * iters * threads, exp_s, threads, None,
                                       "8 independent exp2f chains per thread (ex2.approx with --use_fast_math)"),
    }


def measure_gpu_spec(repeats: int = 10) -> HardwareSpec:
    """Detect the local GPU and measure its ceilings (about a second). Raises HardwareError without one."""
    facts = gpu_facts()
    measured = measure_gpu_ceilings(facts, repeats)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    slug = re.sub(r"[^a-z0-9]+", "-", facts["name"].lower()).strip("-")
    return HardwareSpec(
        name=f"local-gpu-{slug}" if slug else "local-gpu", kind="gpu", vendor="NVIDIA", model=facts["name"],
        cores=facts["sms"], threads=facts["sms"] * facts["threads_per_sm"], simd_width=32,
        caches=[CacheLevel(level=2, kind="unified", size_bytes=facts["l2_bytes"], shared_by_cores=facts["sms"])],
        memory_bandwidth_gbs=measured["memory_bandwidth_gbs"].best,
        peak_flops={"float32": measured["peak_flops.float32"].best},
        exp_rate_per_s=measured["exp_rate_per_s"].best,
        shared_memory_per_block_bytes=facts["shared_per_block_bytes"],
        max_threads_per_block=facts["max_threads_per_block"],
        source=(f"measured on this machine by ksearch CUDA probes {today} (sm_{facts['cc']}, driver "
                f"{facts['driver']}, runtime {facts['runtime']})"),
        sources={f: "CUDA runtime device properties (cupy)" for f in
                 ("model", "cores", "threads", "caches", "shared_memory_per_block_bytes", "max_threads_per_block")},
        measured=measured, fingerprint=gpu_fingerprint(facts),
    )


def load_or_measure_gpu(refresh: bool = False) -> HardwareSpec:
    """The local GPU's spec from the cache, or measured: cached when every figure is within the plausible range
    of the catalog's datasheet figures for this GPU (`ksearch.hardware.plausible.gpu_ranges`), else provisional
    (kept for this process only). Raises HardwareError without a GPU."""
    from ksearch.hardware.cache import load_spec, probe_lock, provisional_spec, remember
    from ksearch.hardware.plausible import implausible

    fingerprint = gpu_fingerprint(gpu_facts())
    if not refresh:
        spec = load_spec(fingerprint) or provisional_spec(fingerprint)
        if spec is not None:
            return with_catalog_tensor_peaks(spec)
    with probe_lock():  # one process probes at a time; one that waited takes what the other cached
        spec = None if refresh else load_spec(fingerprint)
        if spec is None:
            spec = measure_gpu_spec()
            reasons = implausible(spec)
            if reasons:
                spec = spec.model_copy(update={"provisional": "; ".join(reasons)})
            remember(spec)  # the cache keeps measurements only: the catalog's figures are added fresh on every load
    return with_catalog_tensor_peaks(spec)


def with_catalog_tensor_peaks(spec: HardwareSpec) -> HardwareSpec:
    """``spec`` with the hardware catalog's tensor-core peaks (``peak_flops.tensor_*``: datasheet figures, dense)
    of the catalog entry matching its model, each with its source, where the spec has none of its own. The probes
    measure FP32 FMA only, and a roofline for matmul FLOPs on fp16/bf16 inputs needs the matrix units' rate
    (``CostModel.flops_on``). A model the catalog lacks: the spec unchanged."""
    from ksearch.hardware import catalog

    entry = catalog.find(spec.model or "")
    if entry is None:
        return spec
    extra = {k: v for k, v in entry.peak_flops().items() if k.startswith("tensor_") and k not in spec.peak_flops}
    if not extra:
        return spec
    sources = dict(spec.sources)
    for k in extra:
        sources[f"peak_flops.{k}"] = f"hardware catalog {entry.name}: {entry.source_of(f'peak_flops.{k}')} (datasheet)"
    return spec.model_copy(update={"peak_flops": {**spec.peak_flops, **extra}, "sources": sources})
