"""Roofline math: the least time a workload can take on a device, and how close a timing gets to it.

Pure functions. floor = max(bytes / bandwidth, flops / peak, transcendentals / exp_rate), after Williams,
Waterman & Patterson, "Roofline: an insightful visual performance model" (CACM 2009), with an exp ceiling added.
The bandwidth depends on the working set: a workload whose data fits a cache level can stream at that level's
bandwidth (`HardwareSpec.cache_bandwidth_gbs`), so its floor uses it (`bandwidth_for`). The floor is a sanity
bound, so every choice here errs on the lenient side (a higher bandwidth, a lower floor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ksearch.errors import HardwareError
from ksearch.hardware.spec import HardwareSpec

Bound = Literal["memory", "compute", "exp"]

#: A working set up to FIT_SLACK x a level's capacity still gets that level's bandwidth: with reuse, partial hits
#: and exclusive (victim) caches whose capacities add up, a kernel can run faster than the next level alone allows.
FIT_SLACK = 2.0


@dataclass(frozen=True)
class Roofline:
    """Floor of one workload on one device; all times in seconds. `bound` names the largest term."""

    memory_s: float
    compute_s: float
    exp_s: float
    floor_s: float
    bound: Bound
    bandwidth_gbs: float = 0.0  # the bandwidth memory_s was computed with, GB/s
    memory_level: str = "DRAM"  # where it comes from: 'DRAM' (main memory) or a cache level, 'L2'


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def peak_for(spec: HardwareSpec, dtype: str) -> float | None:
    """FLOP/s of the peak a roofline uses for FLOPs in ``dtype`` (a ``peak_flops`` key): the spec's own figure
    for ``dtype``; for a tensor key (``tensor_float16``...) the spec lacks, its ``float32`` peak on a CPU (no
    matrix units modelled: the kernels compute in fp32 there) and None on a GPU (its matrix-unit peak is
    unknown: no compute term rather than one from the far slower vector units, which would put the floor above
    what tensor-core kernels reach and make the judge reject them as too fast); None for any other missing key."""
    if dtype in spec.peak_flops:
        return spec.peak_flops[dtype]
    if dtype.startswith("tensor_") and spec.kind == "cpu":
        return spec.peak_flops.get("float32")
    return None


def bandwidth_for(spec: HardwareSpec, working_set_bytes: float) -> tuple[float, str]:
    """(GB/s, level) a working set of `working_set_bytes` can stream at: the highest of main memory's bandwidth
    and the bandwidths of every cache level whose capacity (`CacheBandwidth.capacity_bytes`, across the usable
    cores) times FIT_SLACK holds it; level is 'DRAM' or the level's key ('L1', 'L2', ...). A cache figure below
    main memory's never lowers the bandwidth. Raises ValueError on a negative working set."""
    ws = _non_negative("working_set_bytes", working_set_bytes)
    best, where = spec.memory_bandwidth_gbs, "DRAM"
    for key, level in spec.cache_bandwidth_gbs.items():
        if ws <= FIT_SLACK * level.capacity_bytes and level.gbs > best:
            best, where = level.gbs, key
    return best, where


def roofline(
    bytes: float, flops: float, transcendentals: float, spec: HardwareSpec, *, dtype: str = "float32",
    working_set_bytes: float | None = None,
) -> Roofline:
    """Each term of the floor and the floor itself, in seconds.

    bytes: bytes moved to and from memory (read + written); flops: floating-point operations in `dtype`
    (an FMA counts 2); transcendentals: exp (or similar special-function) evaluations; working_set_bytes: the
    bytes the kernel touches (default: `bytes`), which picks the bandwidth (`bandwidth_for`: a cache level's
    when the working set fits it, else spec.memory_bandwidth_gbs; GB/s = 1e9 B/s).
    Uses the peak `peak_for(spec, dtype)` picks (FLOP/s; a tensor key the GPU spec lacks: no compute term),
    spec.exp_rate_per_s (exp/s; the exp term is 0 when the spec has no exp rate). Ties go to memory, then compute.
    Raises ValueError on a negative input, HardwareError when the spec has no peak for a non-tensor `dtype`.
    """
    nbytes = _non_negative("bytes", bytes)
    gbs, level = bandwidth_for(spec, nbytes if working_set_bytes is None else working_set_bytes)
    nflops = _non_negative("flops", flops)
    nexp = _non_negative("transcendentals", transcendentals)
    peak = peak_for(spec, dtype)
    if peak is None and nflops > 0 and not dtype.startswith("tensor_"):
        raise HardwareError(f"hardware {spec.name!r} has no peak_flops for dtype {dtype!r}: {sorted(spec.peak_flops)}")
    memory_s = nbytes / (gbs * 1e9)
    compute_s = nflops / peak if nflops > 0 and peak else 0.0
    exp_s = nexp / spec.exp_rate_per_s if spec.exp_rate_per_s and nexp > 0 else 0.0
    terms: dict[Bound, float] = {"memory": memory_s, "compute": compute_s, "exp": exp_s}
    bound = max(terms, key=terms.__getitem__)  # first of equal maxima wins: memory, compute, exp
    return Roofline(memory_s=memory_s, compute_s=compute_s, exp_s=exp_s, floor_s=terms[bound], bound=bound,
                    bandwidth_gbs=gbs, memory_level=level)


def floor_s(bytes: float, flops: float, transcendentals: float, spec: HardwareSpec, *, dtype: str = "float32",
            working_set_bytes: float | None = None) -> float:
    """The roofline floor in seconds: max(bytes/bandwidth, flops/peak[dtype], transcendentals/exp_rate).

    Units and `working_set_bytes` as in `roofline`. Raises ValueError on a negative input.
    """
    return roofline(bytes, flops, transcendentals, spec, dtype=dtype, working_set_bytes=working_set_bytes).floor_s


def bound(bytes: float, flops: float, transcendentals: float, spec: HardwareSpec, *, dtype: str = "float32",
          working_set_bytes: float | None = None) -> Bound:
    """Which term sets the floor: 'memory', 'compute' or 'exp'. Units as in `roofline`."""
    return roofline(bytes, flops, transcendentals, spec, dtype=dtype, working_set_bytes=working_set_bytes).bound


def pct_of_floor(time_s: float, floor_s: float) -> float:
    """100 * floor_s / time_s: 100 means at the floor; over 100 means faster than the floor, i.e. suspect.

    time_s and floor_s in seconds. Raises ValueError unless time_s > 0 and floor_s >= 0.
    """
    if not time_s > 0:
        raise ValueError(f"time_s must be > 0 s, got {time_s!r}")
    return 100.0 * _non_negative("floor_s", floor_s) / time_s


def achieved_gbs(bytes: float, time_s: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes/s) for `bytes` moved in `time_s` seconds.

    Raises ValueError unless time_s > 0 and bytes >= 0.
    """
    if not time_s > 0:
        raise ValueError(f"time_s must be > 0 s, got {time_s!r}")
    return _non_negative("bytes", bytes) / time_s / 1e9
