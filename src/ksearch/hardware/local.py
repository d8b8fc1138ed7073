"""The spec of the local CPU: detected facts plus ceilings measured by the probes, and whether it may be cached.

A spec is *provisional* (`HardwareSpec.provisional` says why; `ksearch.hardware.cache` does not save it) when
every run of some probe ran while other processes used more than the load meter's busy threshold
(`ksearch.hardware.load.busy_threshold`), or when a figure falls outside its plausible range
(`ksearch.hardware.plausible`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

from ksearch.hardware.ceilings import cache_plan, measure_ceilings
from ksearch.hardware.cpu import CpuInfo, detect_cpu
from ksearch.hardware.load import busy_threshold
from ksearch.hardware.plausible import implausible
from ksearch.hardware.probes import PROBE_VERSION, compiler_version, find_compiler
from ksearch.hardware.spec import CacheBandwidth, HardwareSpec, Measurement


def local_fingerprint(info: CpuInfo, compiler: str) -> str:
    """Cache key of a measured spec: hash of (cpu model, cores, threads, compiler version, probe version)."""
    key = json.dumps([info.model, info.cores, info.threads, compiler, PROBE_VERSION])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def local_name(info: CpuInfo) -> str:
    """Short identifier of the local CPU, e.g. 'local-cpu-amd-epyc'."""
    slug = re.sub(r"[^a-z0-9]+", "-", info.model.lower()).strip("-")
    return f"local-cpu-{slug}" if slug else "local-cpu"


def measure_local_spec(
    *, info: CpuInfo | None = None, cc: list[str] | None = None, seconds_per_probe: float = 0.5
) -> HardwareSpec:
    """Detect the local CPU and measure its ceilings (about 3 x `seconds_per_probe` s plus compiles and the cache
    levels' runs); the spec is provisional when the probes ran under load or a figure is implausible.

    Raises HardwareError when the compiler is missing or a probe fails or times out.
    """
    info = info or detect_cpu()
    cc = cc or find_compiler()
    version = compiler_version(cc)
    measured = measure_ceilings(info, seconds_per_probe=seconds_per_probe, cc=cc)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    threads = next(iter(measured.values())).threads
    levels = {}
    for plan in cache_plan(info, threads):
        m = measured.get(plan.key)
        if m is not None:
            levels[plan.key.split(".", 1)[1]] = CacheBandwidth(level=plan.level, gbs=m.best,
                                                               working_set_bytes=m.bytes or 1,
                                                               capacity_bytes=plan.capacity_bytes)
    spec = HardwareSpec(
        name=local_name(info),
        kind="cpu",
        vendor=info.vendor,
        model=info.model,
        cores=info.cores,
        threads=info.threads,
        simd_isa=info.simd_isa,
        simd_width_bits=info.simd_width_bits,
        simd_width=info.simd_width,
        caches=info.caches,
        memory_bandwidth_gbs=measured["memory_bandwidth_gbs"].best,
        peak_flops={"float32": measured["peak_flops.float32"].best},
        exp_rate_per_s=measured["exp_rate_per_s"].best,
        cache_bandwidth_gbs=levels,
        source=f"measured on this machine by ksearch probes {today} ({version})",
        sources={f: "detected from /proc/cpuinfo, sysfs or lscpu" for f in ("model", "cores", "simd_isa", "caches")},
        measured=measured,
        fingerprint=local_fingerprint(info, version),
    )
    return spec.model_copy(update={"provisional": provisional_reason(spec)})


def under_load(measured: dict[str, Measurement]) -> list[str]:
    """One line per metered measurement whose every run was busy (its quietest run's `busy_cores` above
    `busy_threshold` of its threads)."""
    return [f"{key} probed under load (others used {m.busy_cores:.2f} cores during the quietest of {m.runs} runs, "
            f"threshold {busy_threshold(m.threads):.2f})"
            for key, m in measured.items() if m.busy_cores is not None and m.busy_cores > busy_threshold(m.threads)]


def provisional_reason(spec: HardwareSpec) -> str | None:
    """Why `spec` must not be cached (probed under load, implausible figures), or None."""
    reasons = under_load(spec.measured) + implausible(spec)
    return "; ".join(reasons) or None


def numpy_spec(info: CpuInfo | None = None, repeats: int = 3) -> HardwareSpec:
    """The local CPU's detected facts with ceilings NumPy measures in this process, for where no C compiler builds
    the probes (the null target's kernels are NumPy themselves): memory bandwidth from copying a 256 MiB array
    (read + written bytes), FP32 FLOP/s from a 1024^3 matrix product (BLAS, its threads), exp evaluations per second
    from ``np.exp`` over 4 Mi floats (one thread); best of ``repeats`` each, about a second in all. Always
    provisional (`HardwareSpec.provisional`): never cached, and a time below its floor is never rejected on it."""
    import time

    import numpy as np

    info = info or detect_cpu()

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return max(min(times), 1e-9)

    src = np.ones(64 << 20, np.float32)
    dst = np.empty_like(src)
    copy_s = best(lambda: np.copyto(dst, src))
    a = np.ones((1024, 1024), np.float32)
    matmul_s = best(lambda: a @ a)
    x = np.linspace(-4, 4, 4 << 20, dtype=np.float32)
    exp_s = best(lambda: np.exp(x))
    return HardwareSpec(
        name=local_name(info), kind="cpu", vendor=info.vendor, model=info.model, cores=info.cores,
        threads=info.threads, simd_isa=info.simd_isa, simd_width_bits=info.simd_width_bits,
        simd_width=info.simd_width, caches=info.caches,
        memory_bandwidth_gbs=2 * src.nbytes / copy_s / 1e9,
        peak_flops={"float32": 2 * 1024 ** 3 / matmul_s},
        exp_rate_per_s=x.size / exp_s,
        source=f"measured with NumPy {np.__version__} in this process (no C compiler for the probes)",
        sources={f: "detected from /proc/cpuinfo, sysfs or lscpu" for f in ("model", "cores", "simd_isa", "caches")},
        provisional="ceilings measured with NumPy, not the C probes (no C compiler here)",
    )
