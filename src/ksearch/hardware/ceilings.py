"""The local CPU's ceilings, measured so that a busy machine cannot poison them.

Every probe (`ksearch.hardware.probes`) runs ROUNDS times, interleaved with the others (stream, fma, exp, the cache
levels, then again), each run with its share of the time budget and under a load meter (`ksearch.hardware.load`:
CPU used by other processes while it ran). A figure is the best of its runs; its `Measurement` records how many
runs there were and the load during the quietest one (`busy_cores`). Whether the result may be cached is decided
by `ksearch.hardware.local` from those readings and `ksearch.hardware.plausible`.

Cache levels: for each data cache level the CPU reports, the probe streams arrays private to each thread, half
of the thread's share of the level (`cache_plan`). A level's capacity for the roofline is its size times the
instances the usable cores can reach (per core for a private level; for a shared one, as many instances as there
are usable cores, at most all of them: the lenient reading, since a higher bandwidth is the safe error of a floor).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ksearch.hardware import probes
from ksearch.hardware.cpu import CpuInfo
from ksearch.hardware.load import LoadMeter, LoadReading
from ksearch.hardware.spec import Measurement

ROUNDS = 3
CACHE_RUN_S = 0.05  # at most this long per cache-level run (small arrays: many repeats fit)
MAIN = {"memory_bandwidth_gbs": "stream", "peak_flops.float32": "fma", "exp_rate_per_s": "exp"}


@dataclass(frozen=True)
class CachePlan:
    """How one cache level is probed and how far its bandwidth reaches."""

    key: str  # 'cache_bandwidth_gbs.L2'
    level: int
    per_thread_bytes: int  # the probe's arrays on each thread
    capacity_bytes: int  # the level's capacity across the usable cores (see the module docstring)


def cache_plan(info: CpuInfo, threads: int) -> list[CachePlan]:
    """One CachePlan per data/unified cache level of `info` (the largest instance of each level), for a probe on
    `threads` threads."""
    tpc = max(1, info.threads // max(1, info.cores))
    cores = max(1, -(-threads // tpc))  # physical cores the threads occupy, packed
    out = []
    for level in sorted({c.level for c in info.caches if c.kind != "instruction"}):
        c = max((c for c in info.caches if c.level == level and c.kind != "instruction"), key=lambda c: c.size_bytes)
        instances_packed = max(1, -(-cores // c.shared_by_cores))
        instances_spread = max(instances_packed, min(cores, max(1, info.cores // c.shared_by_cores)))
        per_thread = c.size_bytes * instances_packed // threads // 2
        out.append(CachePlan(f"cache_bandwidth_gbs.L{level}", level, max(per_thread, 3 * 8 * 64),
                             c.size_bytes * instances_spread))
    return out


_build_lock = threading.Lock()
_build_dir: tempfile.TemporaryDirectory | None = None
_built: dict[tuple[str, tuple[str, ...]], Path] = {}


def built_probes(names: list[str], cc: list[str]) -> dict[str, Path]:
    """The probes `names` compiled with `cc`, in parallel, once per process (kept in a private temporary
    directory removed at exit). Raises HardwareError when a build fails."""
    global _build_dir
    with _build_lock:
        if _build_dir is None:
            _build_dir = tempfile.TemporaryDirectory(prefix="ksearch-probes-")
        todo = [n for n in names if (n, tuple(cc)) not in _built]
        root = Path(_build_dir.name) / str(len(_built))
        dirs = {n: root / n for n in todo}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
            exes = dict(zip(todo, pool.map(lambda n: probes.compile_probe(n, dirs[n], cc), todo)))
        for n, exe in exes.items():
            _built[(n, tuple(cc))] = exe
        return {n: _built[(n, tuple(cc))] for n in names}


def merge_runs(runs: list[tuple[Measurement, LoadReading]]) -> Measurement:
    """One Measurement from several runs of a probe: the best run's figures and notes, the median of the runs'
    medians (capped at the best), repeats summed, `runs` counted, `busy_cores` the quietest run's reading."""
    best = max((m for m, _ in runs), key=lambda m: m.best)
    quiet = min(r.busy_cores for _, r in runs)
    loads = ", ".join(f"{r.busy_cores:.2f}" for _, r in runs)
    notes = (f"{best.notes}; best of {len(runs)} runs interleaved with the other probes, others used {loads} of "
             f"{runs[0][1].usable_cores} cores during them")
    return best.model_copy(update={
        "median": min(best.best, statistics.median(m.median for m, _ in runs)),
        "repeats": sum(m.repeats for m, _ in runs), "runs": len(runs), "busy_cores": quiet, "notes": notes})


def measure_ceilings(info: CpuInfo, *, seconds_per_probe: float = 0.5, threads: int | None = None,
                     cc: list[str] | None = None, timeout_s: float = 60.0, rounds: int = ROUNDS,
                     keys: list[str] | None = None) -> dict[str, Measurement]:
    """Run the probes `rounds` times interleaved, each run metered; the best of each, keyed like
    `HardwareSpec.measured`: 'memory_bandwidth_gbs' (GB/s), 'peak_flops.float32' (FLOP/s), 'exp_rate_per_s'
    (exp/s), 'cache_bandwidth_gbs.L<n>' (GB/s) for each cache level of `info`.

    `keys` limits the probes to those figures ('cache_bandwidth_gbs' for all levels). `seconds_per_probe` is the
    timed budget of each main probe over all its runs (compile, start-up and allocation come on top; a cache level
    takes at most CACHE_RUN_S a run); `threads` defaults to the CPUs this process may run on.
    Raises HardwareError when a build or probe fails.
    """
    cc = cc or probes.find_compiler()
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else info.threads
    want = set(keys) if keys is not None else None
    plans = [p for p in cache_plan(info, threads)
             if want is None or p.key in want or "cache_bandwidth_gbs" in want]
    main = {k: v for k, v in MAIN.items() if want is None or k in want}
    exes = built_probes(sorted(set(main.values()) | ({"cachebw"} if plans else set())), cc)
    share = seconds_per_probe / max(1, rounds)
    cache_s = min(CACHE_RUN_S, share / 2)
    runs: dict[str, list[tuple[Measurement, LoadReading]]] = {}
    for _ in range(max(1, rounds)):
        for key, probe in main.items():
            meter = LoadMeter()
            if probe == "stream":
                m = probes._measure_stream(exes[probe], info, threads, share, timeout_s)
            elif probe == "fma":
                m = probes._measure_fma(exes[probe], threads, share, timeout_s)
            else:
                m = probes._measure_exp(exes[probe], threads, share, timeout_s)
            runs.setdefault(key, []).append((m, meter.reading()))
        for plan in plans:
            meter = LoadMeter()
            m = probes._measure_cache(exes["cachebw"], plan.per_thread_bytes, threads, cache_s, timeout_s)
            runs.setdefault(plan.key, []).append((m, meter.reading()))
    return {key: merge_runs(r) for key, r in runs.items()}
