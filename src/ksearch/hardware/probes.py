"""Measured ceilings of the local CPU: small C probes compiled with the system compiler and run as subprocesses.

Probes (sources in `probe_src/`, package data), each run on all threads with OpenMP, best of several repeats:
- `stream.c`: STREAM-like copy and triad over float64 arrays of max(4 x LLC, 256 MB) in total -> GB/s
  (bytes read + written, no write-allocate traffic counted), after McCalpin's STREAM.
- `fma.c`: 12 independent FP32 vector FMA chains per thread held in registers -> FLOP/s (an FMA counts 2 FLOP).
- `exp.c`: expf over an L1-resident array, built with -ffast-math so glibc's libmvec vectorizes it -> exp/s;
  the same loop with vectorization off is timed alongside to check the vector path was taken.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware.cpu import CpuInfo
from ksearch.hardware.spec import Measurement

PROBE_VERSION = 1  # bump when a probe changes what it measures: it invalidates cached specs
BASE_FLAGS = ["-O3", "-march=native", "-fopenmp"]
PROBE_FLAGS = {  # probe -> extra compile flags (-ffast-math only where the number depends on it)
    "stream": [],
    "fma": ["-ffp-contract=fast"],
    "exp": ["-ffast-math"],
}
MIN_STREAM_BYTES = 256 * 10**6
COMPILE_TIMEOUT_S = 60.0


def find_compiler(cc: str | None = None) -> list[str]:
    """The C compiler command as argv: `cc`, else `config.c_compiler()` ($CC, default 'cc').

    Raises HardwareError if it is not on PATH.
    """
    cc = cc or config.c_compiler()
    command = shlex.split(cc)
    if not command or shutil.which(command[0]) is None:
        raise HardwareError(f"C compiler {cc!r} not found on PATH (set $CC)")
    return command


def compiler_version(cc: list[str]) -> str:
    """First line of `cc --version`, e.g. 'cc (Debian 12.2.0-14) 12.2.0'. Raises HardwareError if it fails."""
    try:
        done = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HardwareError(f"C compiler {shlex.join(cc)!r} does not run: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise HardwareError(f"C compiler {shlex.join(cc)!r} --version failed: {done.stderr.strip()[-500:]}")
    return lines[0].strip()


def compile_flags(probe: str) -> list[str]:
    """Compile flags of one probe ('stream', 'fma' or 'exp')."""
    return [*BASE_FLAGS, *PROBE_FLAGS[probe]]


def compile_probe(probe: str, out_dir: Path, cc: list[str]) -> Path:
    """Compile probe `probe` into `out_dir` and return the executable. Raises HardwareError if the build fails."""
    if probe not in PROBE_FLAGS:
        raise HardwareError(f"unknown probe {probe!r}; known: {sorted(PROBE_FLAGS)}")
    src_dir = files("ksearch.hardware") / "probe_src"
    for name in ("common.c", f"{probe}.c"):
        (out_dir / name).write_text((src_dir / name).read_text())
    exe = out_dir / probe
    argv = [*cc, *compile_flags(probe), "-o", str(exe), str(out_dir / f"{probe}.c"), "-lm"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise HardwareError(f"compiling probe {probe!r} timed out after {COMPILE_TIMEOUT_S} s") from exc
    except OSError as exc:
        raise HardwareError(f"compiling probe {probe!r} with {shlex.join(cc)!r} failed: {exc}") from exc
    if done.returncode != 0:
        raise HardwareError(f"compiling probe {probe!r} failed: {shlex.join(argv)}\n{done.stderr.strip()[-2000:]}")
    return exe


def run_probe(exe: Path, args: list[str], threads: int, timeout_s: float) -> dict:
    """Run a compiled probe on `threads` OpenMP threads and return its JSON output.

    Raises HardwareError naming the probe when it times out (after `timeout_s` seconds), fails or prints nonsense.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}
    try:
        done = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise HardwareError(f"probe {exe.name!r} timed out after {timeout_s} s") from exc
    except OSError as exc:
        raise HardwareError(f"probe {exe.name!r} did not start: {exc}") from exc
    if done.returncode != 0:
        raise HardwareError(
            f"probe {exe.name!r} exited with {done.returncode}: {done.stderr.strip()[-1000:]}"
        )
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise HardwareError(f"probe {exe.name!r} printed no JSON: {done.stdout[-500:]!r}") from exc
    if not isinstance(result, dict):
        raise HardwareError(f"probe {exe.name!r} printed {result!r}, not a JSON object")
    return result


def stream_bytes(info: CpuInfo) -> int:
    """Total bytes of the STREAM arrays: max(4 x all last-level caches, 256 MB), capped at 1/4 of RAM."""
    llc = info.last_level_cache_bytes() or 0
    shared = max((c.shared_by_cores for c in info.caches if c.size_bytes == llc), default=1)
    total = max(4 * llc * max(1, info.cores // shared), MIN_STREAM_BYTES)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        total = min(total, max(ram // 4, 64 * 10**6))
    except (ValueError, OSError, AttributeError):
        pass
    return int(total)


def _positive(result: dict, key: str, probe: str) -> float:
    value = result.get(key)
    if not isinstance(value, (int, float)) or not value > 0:
        raise HardwareError(f"probe {probe!r} reported {key}={value!r}, expected a positive number")
    return float(value)


def _measure_stream(exe: Path, info: CpuInfo, threads: int, seconds: float, timeout_s: float) -> Measurement:
    nbytes = stream_bytes(info)
    r = run_probe(exe, [str(nbytes), str(seconds)], threads, timeout_s)
    copy, triad = _positive(r, "copy_best_gbs", "stream"), _positive(r, "triad_best_gbs", "stream")
    kernel = "copy" if copy > triad else "triad"
    return Measurement(
        probe=f"stream_{kernel}",
        unit="GB/s",
        best=max(copy, triad),
        median=_positive(r, f"{kernel}_median_gbs", "stream"),
        threads=int(r.get("threads", threads)),
        repeats=int(r.get("repeats", 1)),
        bytes=int(r.get("bytes", nbytes)),
        compile_flags=compile_flags("stream"),
        notes=(
            f"float64 arrays; copy best {copy:.1f} GB/s (16 B/elem), triad best {triad:.1f} GB/s (24 B/elem); "
            "the higher is the ceiling; bytes read + written, write-allocate not counted"
        ),
    )


def _measure_fma(exe: Path, threads: int, seconds: float, timeout_s: float) -> Measurement:
    r = run_probe(exe, [str(seconds)], threads, timeout_s)
    return Measurement(
        probe="fma_fp32",
        unit="FLOP/s",
        best=_positive(r, "best_flops", "fma"),
        median=_positive(r, "median_flops", "fma"),
        threads=int(r.get("threads", threads)),
        repeats=int(r.get("repeats", 1)),
        bytes=0,
        compile_flags=compile_flags("fma"),
        notes=f"{r.get('chains')} independent FMA chains x {r.get('lanes')} float32 lanes per thread; FMA = 2 FLOP",
    )


def _measure_exp(exe: Path, threads: int, seconds: float, timeout_s: float) -> Measurement:
    r = run_probe(exe, [str(seconds)], threads, timeout_s)
    best, scalar = _positive(r, "best_per_s", "exp"), _positive(r, "scalar_per_s", "exp")
    libmvec = b"_ZGV" in exe.read_bytes()  # glibc vector-math symbols, e.g. _ZGVeN16v_expf
    vectorized = libmvec and best > 1.5 * scalar
    n = int(r.get("n", 2048))
    return Measurement(
        probe="expf_vector",
        unit="exp/s",
        best=best,
        median=_positive(r, "median_per_s", "exp"),
        threads=int(r.get("threads", threads)),
        repeats=int(r.get("repeats", 1)),
        bytes=2 * 4 * n * threads,
        compile_flags=compile_flags("exp"),
        notes=(
            f"{'vectorized through libmvec' if vectorized else 'NOT vectorized'}: "
            f"{best / scalar:.1f}x the scalar loop ({scalar:.3g} exp/s); {n} floats per thread, L1-resident"
        ),
    )


def measure_ceilings(
    info: CpuInfo,
    *,
    seconds_per_probe: float = 0.5,
    threads: int | None = None,
    cc: list[str] | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Measurement]:
    """Compile and run the three probes; returns measurements keyed like `HardwareSpec.measured`.

    Keys: 'memory_bandwidth_gbs' (GB/s), 'peak_flops.float32' (FLOP/s), 'exp_rate_per_s' (exp/s).
    `seconds_per_probe` is the timed budget of each probe (compile and allocation come on top);
    `threads` defaults to the CPUs this process may run on. Raises HardwareError when a build or probe fails.
    """
    cc = cc or find_compiler()
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else info.threads
    with tempfile.TemporaryDirectory(prefix="ksearch-probes-") as tmp:
        exes = {probe: compile_probe(probe, Path(tmp), cc) for probe in PROBE_FLAGS}
        return {
            "memory_bandwidth_gbs": _measure_stream(exes["stream"], info, threads, seconds_per_probe, timeout_s),
            "peak_flops.float32": _measure_fma(exes["fma"], threads, seconds_per_probe, timeout_s),
            "exp_rate_per_s": _measure_exp(exes["exp"], threads, seconds_per_probe, timeout_s),
        }
