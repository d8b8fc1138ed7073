"""Measured ceilings of the local CPU: small C probes compiled with the system compiler and run as subprocesses.

Probes (sources in `probe_src/`, package data), each run on all threads with OpenMP, best of several repeats:
- `stream.c`: STREAM-like copy, triad and read (a sum) over float64 arrays of max(4 x LLC, 256 MB) in total -> GB/s
  (bytes read + written, no write-allocate traffic counted), after McCalpin's STREAM; the fastest kernel is the
  ceiling (a mostly-reading kernel can reach the read rate).
- `cachebw.c`: the same three kernels over arrays private to each thread and small enough to stay in one cache
  level, repeated inside one parallel region -> GB/s of that level.
- `fma.c`: 12 independent FP32 vector FMA chains per thread held in registers -> FLOP/s (an FMA counts 2 FLOP).
- `exp.c`: exp over an L1-resident array, built with -ffast-math -> exp/s, the faster of two variants timed
  alternately: expf vectorized through glibc's libmvec, and a polynomial exp2f as fast generated kernels write it
  (Cody-Waite reduction, degree-6 minimax polynomial in FMAs, 2^n through the exponent bits), which counts only when
  the probe's own check against exp2 in double finds it accurate to POLY_MAX_REL_ERR over [-126, 126]. The
  polynomial loop's vectorization is checked in its disassembly (objdump), libmvec's by its _ZGV symbol; both loops
  are also timed with vectorization off.
This module runs one probe once; `ksearch.hardware.ceilings` repeats them interleaved under a load meter.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware.cpu import CpuInfo
from ksearch.hardware.spec import Measurement

PROBE_VERSION = 3  # 3: stream read kernel, cache levels, best of interleaved runs. Bump when a probe changes what it measures: it invalidates cached specs
BASE_FLAGS = ["-O3", "-march=native", "-fopenmp"]
PROBE_FLAGS = {  # probe -> extra compile flags (-ffast-math only where the number depends on it)
    "stream": [],
    "fma": ["-ffp-contract=fast"],
    "exp": ["-ffast-math"],
    "cachebw": [],
}
MIN_STREAM_BYTES = 256 * 10**6
COMPILE_TIMEOUT_S = 60.0
POLY_MAX_REL_ERR = 2e-7  # the polynomial exp2f counts only if this accurate (fp32: 1 ulp is 1.2e-7 at most)
POLY_SYMBOL = "ksearch_vec_exp2_poly"  # the timed polynomial loop in exp.c


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
    """Compile probe `probe` ('stream', 'fma', 'exp' or 'cachebw') into `out_dir` and return the executable.
    Raises HardwareError if the build fails."""
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
    return _bandwidth(r, "stream", int(r.get("bytes", nbytes)), threads)


def _measure_cache(exe: Path, per_thread_bytes: int, threads: int, seconds: float, timeout_s: float) -> Measurement:
    """One run of the cache probe over `per_thread_bytes` per thread (see cachebw.c)."""
    r = run_probe(exe, [str(per_thread_bytes), str(seconds)], threads, timeout_s)
    return _bandwidth(r, "cachebw", int(r.get("bytes", per_thread_bytes * threads)), threads)


def _bandwidth(r: dict, probe: str, nbytes: int, threads: int) -> Measurement:
    """The fastest of the copy, triad and read kernels of a bandwidth probe's output `r`."""
    rates = {k: _positive(r, f"{k}_best_gbs", probe) for k in ("copy", "triad", "read") if f"{k}_best_gbs" in r}
    if not rates:
        raise HardwareError(f"probe {probe!r} reported no bandwidth: {r!r}")
    kernel = max(rates, key=rates.__getitem__)
    per = {"copy": 16, "triad": 24, "read": 8}
    listed = ", ".join(f"{k} best {v:.1f} GB/s ({per[k]} B/elem)" for k, v in rates.items())
    where = "arrays private to each thread" if probe == "cachebw" else "float64 arrays shared by the threads"
    return Measurement(
        probe=f"{probe}_{kernel}",
        unit="GB/s",
        best=rates[kernel],
        median=min(_positive(r, f"{kernel}_median_gbs", probe), rates[kernel]),
        threads=int(r.get("threads", threads)),
        repeats=int(r.get("repeats", 1)),
        bytes=nbytes,
        compile_flags=compile_flags(probe),
        notes=f"{where}; {listed}; the highest is the ceiling; bytes read + written, write-allocate not counted",
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


def disassembly(exe: Path, symbol: str) -> str | None:
    """`objdump -d` of one function of `exe`, or None when objdump is missing, fails or does not find `symbol`."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    try:
        done = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", f"--disassemble={symbol}", str(exe)],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or f"<{symbol}>:" not in done.stdout:
        return None
    return done.stdout


# A packed-float32 FMA on 256/512-bit registers (x86: vfmadd231ps %zmm...) or on 4 x float32 NEON lanes (arm64).
_VECTOR_FMA = re.compile(r"\bvfn?m(?:add|sub)\w*ps\b[^\n]*%[yz]mm|\bfml[as]\s+v\d+\.4s")


def vector_fma_count(asm: str) -> int:
    """Number of packed float32 FMA instructions (ymm/zmm on x86, .4s on arm64) in a disassembly."""
    return len(_VECTOR_FMA.findall(asm))


def _poly_notes(r: dict, exe: Path) -> tuple[bool, str]:
    """(accurate enough to count, description) of the polynomial exp2f variant of the exp probe."""
    err = r.get("poly_max_rel_err")
    accurate = isinstance(err, (int, float)) and 0 <= err <= POLY_MAX_REL_ERR
    asm = disassembly(exe, POLY_SYMBOL)
    ratio = _positive(r, "poly_best_per_s", "exp") / _positive(r, "poly_scalar_per_s", "exp")
    if asm is not None:
        fmas = vector_fma_count(asm)
        how = f"{fmas} vector FMAs in its loop (objdump)" if fmas else "NOT vectorized (no vector FMA in objdump)"
    else:
        how = "vectorized" if ratio > 1.5 else "NOT vectorized"
        how += " (judged by speed; objdump unavailable)"
    accuracy = (
        f"max rel err {err:.2g} vs exp2 in double over [-126, 126] ({r.get('poly_checked')} points)"
        if isinstance(err, (int, float)) else "accuracy unchecked"
    )
    if not accurate:
        accuracy += f", above {POLY_MAX_REL_ERR:g}: NOT counted"
    return accurate, f"{how}, {ratio:.1f}x its scalar loop, {accuracy}"


def _measure_exp(exe: Path, threads: int, seconds: float, timeout_s: float) -> Measurement:
    r = run_probe(exe, [str(seconds)], threads, timeout_s)
    lib_best, lib_scalar = _positive(r, "libmvec_best_per_s", "exp"), _positive(r, "libmvec_scalar_per_s", "exp")
    libmvec = re.search(rb"_ZGV\w*v_expf", exe.read_bytes()) is not None  # glibc vector expf, e.g. _ZGVeN16v_expf
    lib_how = "vectorized through libmvec" if libmvec and lib_best > 1.5 * lib_scalar else "NOT vectorized"
    poly_best = _positive(r, "poly_best_per_s", "exp")
    poly_ok, poly_how = _poly_notes(r, exe)
    poly_wins = poly_ok and poly_best > lib_best
    key = "poly" if poly_wins else "libmvec"
    vectorized = ("NOT vectorized" not in poly_how) if poly_wins else lib_how.startswith("vectorized")
    n = int(r.get("n", 2048))
    return Measurement(
        probe="exp2f_poly" if poly_wins else "expf_libmvec",
        unit="exp/s",
        best=poly_best if poly_wins else lib_best,
        median=_positive(r, f"{key}_median_per_s", "exp"),
        threads=int(r.get("threads", threads)),
        repeats=int(r.get(f"{key}_repeats", 1)),
        bytes=2 * 4 * n * threads,
        compile_flags=compile_flags("exp"),
        vectorized=vectorized,
        notes=(
            f"faster of two, timed alternately: {'polynomial exp2f' if poly_wins else 'libmvec expf'} won. "
            f"Polynomial exp2f (degree 6, Cody-Waite, 2^n via exponent bits): best {poly_best:.4g} exp/s, "
            f"{poly_how}. libmvec expf: best {lib_best:.4g} exp/s, {lib_how}, {lib_best / lib_scalar:.1f}x its "
            f"scalar loop. {n} floats per thread, L1-resident"
        ),
    )
