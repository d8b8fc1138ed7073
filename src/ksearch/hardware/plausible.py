"""Plausible ranges of measured ceilings, derived from detected facts (CPU) or datasheet figures (GPU).

A ceiling measured on a busy machine comes out low, and a low ceiling makes the roofline floor too high: the
judge then rejects honest kernels as faster than the floor. The load meter catches most of that; these ranges
catch what it misses (contention it cannot see, a broken probe) before a figure is cached. They are deliberately
wide: a figure outside them is wrong, a figure inside them may still be off by a few times (the judge re-probes a
ceiling before it rejects anything, `ksearch.hardware.reprobe`).

CPU, for a probe run on T threads of a CPU with `threads_per_core` hardware threads per core and L float32 lanes:
- cores the figure may rest on: high = T (every thread a full core), low = max(0.5, T / threads_per_core / 2) (the
  threads may be SMT siblings, also of virtual CPUs the hypervisor does not say are siblings);
- clock: FREQ_LO_HZ to FREQ_HI_HZ;
- FP32 FMA: low = cores_lo x L x 2 FLOP x 0.5 (wide vectors at half rate: double-pumped or one port) x FREQ_LO;
  high = T x L x 2 x 4 FMA pipes x FREQ_HI;
- exp: low = cores_lo x FREQ_LO x (L when the probe's loop was vectorized, else 1) / EXP_CYCLES_PER_VECTOR;
  high = T x L x FREQ_HI (one vector of exps a cycle);
- main memory: low = cores_lo x DRAM_GBS_PER_CORE_LO; high = T x DRAM_GBS_PER_CORE_HI;
- a cache level: low = cores_lo x CACHE_BYTES_PER_CYCLE_LO x FREQ_LO; high = T x CACHE_BYTES_PER_CYCLE_HI x FREQ_HI.
GPU: each measured ceiling within [GPU_LO, GPU_HI] x the catalog's datasheet figure of that model (no range for a
model or figure the catalog lacks).
"""

from __future__ import annotations

from dataclasses import dataclass

from ksearch.hardware.spec import HardwareSpec

FREQ_LO_HZ = 0.5e9
FREQ_HI_HZ = 6.0e9
FMA_PIPES_HI = 4  # Apple's performance cores issue 4 NEON FMAs a cycle; x86 cores 2
EXP_CYCLES_PER_VECTOR = 32  # the probe's polynomial is ~11 vector instructions; half-rate units double that
DRAM_GBS_PER_CORE_LO = 1.0  # one core of any CPU of the last 15 years streams well over 1 GB/s
DRAM_GBS_PER_CORE_HI = 200.0  # Apple M-series cores reach ~100 GB/s each
CACHE_BYTES_PER_CYCLE_LO = 4.0
CACHE_BYTES_PER_CYCLE_HI = 512.0  # 2-3 loads of 64 B plus a store per cycle, with room to spare
GPU_LO, GPU_HI = 0.25, 1.25


@dataclass(frozen=True)
class Range:
    """A plausible range [lo, hi] of one figure, in the figure's unit, and how it was derived."""

    lo: float
    hi: float
    why: str


def figure_value(spec: HardwareSpec, key: str) -> float | None:
    """The value of a ceiling key ('memory_bandwidth_gbs', 'peak_flops.float32', 'exp_rate_per_s',
    'cache_bandwidth_gbs.L2', ...) in `spec`, or None when the spec lacks it."""
    if key == "memory_bandwidth_gbs":
        return spec.memory_bandwidth_gbs
    if key == "exp_rate_per_s":
        return spec.exp_rate_per_s
    head, _, tail = key.partition(".")
    if head == "peak_flops":
        return spec.peak_flops.get(tail)
    if head == "cache_bandwidth_gbs":
        level = spec.cache_bandwidth_gbs.get(tail)
        return level.gbs if level else None
    return None


def cpu_ranges(spec: HardwareSpec, usable_cores: int | None = None) -> dict[str, Range]:
    """Plausible ranges of the measured ceilings of a CPU spec (see the module docstring), keyed like
    `HardwareSpec.measured`. Threads per figure: the measurement's own, else `usable_cores`, else spec.threads."""
    tpc = max(1, spec.threads // max(1, spec.cores))
    lanes = max(1, spec.simd_width)
    out: dict[str, Range] = {}
    keys = ["memory_bandwidth_gbs", "peak_flops.float32", "exp_rate_per_s",
            *(f"cache_bandwidth_gbs.{k}" for k in spec.cache_bandwidth_gbs)]
    for key in keys:
        m = spec.measured.get(key)
        t = m.threads if m else (usable_cores or spec.threads)
        lo_cores = max(0.5, t / tpc / 2)
        cores = f"{lo_cores:g}-{t} cores"
        if key == "memory_bandwidth_gbs":
            out[key] = Range(lo_cores * DRAM_GBS_PER_CORE_LO, t * DRAM_GBS_PER_CORE_HI,
                             f"{cores} x {DRAM_GBS_PER_CORE_LO:g}-{DRAM_GBS_PER_CORE_HI:g} GB/s per core")
        elif key == "peak_flops.float32":
            out[key] = Range(lo_cores * lanes * 2 * 0.5 * FREQ_LO_HZ, t * lanes * 2 * FMA_PIPES_HI * FREQ_HI_HZ,
                             f"{cores} x {lanes} lanes x 2 FLOP x 0.5-{FMA_PIPES_HI} FMA/cycle x "
                             f"{FREQ_LO_HZ / 1e9:g}-{FREQ_HI_HZ / 1e9:g} GHz")
        elif key == "exp_rate_per_s":
            vec = lanes if (m is None or m.vectorized is not False) else 1
            out[key] = Range(lo_cores * FREQ_LO_HZ * vec / EXP_CYCLES_PER_VECTOR, t * lanes * FREQ_HI_HZ,
                             f"{cores} x {FREQ_LO_HZ / 1e9:g}-{FREQ_HI_HZ / 1e9:g} GHz x {vec} lanes / "
                             f"{EXP_CYCLES_PER_VECTOR} cycles - {lanes} lanes a cycle")
        else:
            out[key] = Range(lo_cores * CACHE_BYTES_PER_CYCLE_LO * FREQ_LO_HZ / 1e9,
                             t * CACHE_BYTES_PER_CYCLE_HI * FREQ_HI_HZ / 1e9,
                             f"{cores} x {CACHE_BYTES_PER_CYCLE_LO:g}-{CACHE_BYTES_PER_CYCLE_HI:g} B/cycle x "
                             f"{FREQ_LO_HZ / 1e9:g}-{FREQ_HI_HZ / 1e9:g} GHz")
    return out


def gpu_ranges(spec: HardwareSpec) -> dict[str, Range]:
    """Plausible ranges of a GPU spec's ceilings: [GPU_LO, GPU_HI] x the catalog's figure for its model; {} when
    the catalog has no entry for it."""
    from ksearch.hardware import catalog

    entry = catalog.find(spec.model or "")
    if entry is None:
        return {}
    out = {}
    for key in ("memory_bandwidth_gbs", "peak_flops.float32", "exp_rate_per_s"):
        ref = entry.value(key)
        if ref:
            out[key] = Range(GPU_LO * ref, GPU_HI * ref, f"{GPU_LO:g}-{GPU_HI:g} x {ref:.4g} (catalog {entry.name})")
    return out


def implausible(spec: HardwareSpec, usable_cores: int | None = None) -> list[str]:
    """One line per measured ceiling of `spec` outside its plausible range ([] when all fit or nothing was
    measured: a datasheet spec is taken as it is), e.g. 'memory_bandwidth_gbs 0.01 is below 1 (1-2 cores x ...)'."""
    if not spec.measured:
        return []
    ranges = cpu_ranges(spec, usable_cores) if spec.kind == "cpu" else gpu_ranges(spec)
    out = []
    for key, r in ranges.items():
        value = figure_value(spec, key)
        if value is None:
            continue
        if value < r.lo:
            out.append(f"{key} {value:.4g} is below {r.lo:.4g} ({r.why})")
        elif value > r.hi:
            out.append(f"{key} {value:.4g} is above {r.hi:.4g} ({r.why})")
    return out
