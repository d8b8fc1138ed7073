"""The hardware spec record: the facts of one device (CPU or GPU) and where each figure came from.

A spec is either measured on this machine (`ksearch.hardware.local`) or a catalog entry taken from a datasheet.
Every ceiling (bandwidth, peak FLOP/s, exp rate) is a lower bound on time for the roofline floor
(`ksearch.hardware.roofline`), so each one names its source: `source` for the whole record, `sources` per figure
where they differ, `measured` for how a figure was measured.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Names of the ceilings a spec carries; also the keys of `HardwareSpec.measured` and `HardwareSpec.sources`
# (peak FLOP/s per dtype as "peak_flops.<dtype>").
CEILINGS = ("memory_bandwidth_gbs", "peak_flops", "exp_rate_per_s")


class CacheLevel(BaseModel):
    """One level of a cache hierarchy, as seen by one core."""

    model_config = ConfigDict(extra="forbid")

    level: int = Field(ge=1, description="1 for L1, 2 for L2, ...")
    kind: Literal["data", "instruction", "unified"] = "unified"
    size_bytes: int = Field(gt=0, description="capacity of one instance, in bytes")
    shared_by_cores: int = Field(default=1, ge=1, description="physical cores sharing one instance")


class Measurement(BaseModel):
    """How one ceiling was measured: which probe, on how many threads, over how many bytes, how often."""

    model_config = ConfigDict(extra="forbid")

    probe: str = Field(description="probe name, e.g. 'stream_triad'")
    unit: str = Field(description="unit of best and median, e.g. 'GB/s', 'FLOP/s', 'exp/s'")
    best: float = Field(gt=0, description="best (highest) rate over the repeats, in `unit`")
    median: float = Field(gt=0, description="median rate over the repeats, in `unit`")
    threads: int = Field(ge=1, description="OpenMP threads the probe ran on")
    repeats: int = Field(ge=1, description="timed repeats (after warm-up)")
    bytes: int | None = Field(default=None, ge=0, description="working set of the probe in bytes, all threads")
    compile_flags: list[str] = Field(default_factory=list)
    notes: str = Field(default="", description="anything else needed to read the number (vectorized, ...)")
    runs: int = Field(default=1, ge=1, description="separate probe processes (interleaved with the other probes) "
                                                    "whose best is `best`")
    busy_cores: float | None = Field(default=None, ge=0, description=(
        "cores of other processes' work during the quietest of the runs (ksearch.hardware.load); None: not "
        "metered (a GPU probe, or a spec older than the meter)"))
    vectorized: bool | None = Field(default=None, description="the timed loop ran on SIMD lanes (exp probe); "
                                                               "None: not applicable or unknown")


class CacheBandwidth(BaseModel):
    """Measured bandwidth of working sets that fit one cache level, all usable cores streaming their own arrays."""

    model_config = ConfigDict(extra="forbid")

    level: int = Field(ge=1, description="1 for L1, 2 for L2, ...")
    gbs: float = Field(gt=0, description="best bandwidth, GB/s (1e9 bytes/s, read + written)")
    working_set_bytes: int = Field(gt=0, description="bytes the probe streamed over, all threads together")
    capacity_bytes: int = Field(gt=0, description=(
        "capacity of the level across the cores a kernel may use (per-core size x usable cores for a private "
        "level, size x instances for a shared one), bytes; a working set up to roofline.FIT_SLACK x this gets "
        "this bandwidth"))


def last_level_cache_bytes(caches: list[CacheLevel]) -> int | None:
    """Size in bytes of one instance of the last data/unified cache level in `caches`, or None if there is none."""
    data = [c for c in caches if c.kind != "instruction"]
    return max(data, key=lambda c: (c.level, c.size_bytes)).size_bytes if data else None


class HardwareSpec(BaseModel):
    """The facts of one device: detected facts, ceilings, and where each figure came from.

    Ceilings: `memory_bandwidth_gbs` in GB/s (1e9 bytes/s, read + written), `peak_flops` in FLOP/s per dtype name
    (an FMA counts 2 FLOP), `exp_rate_per_s` in exp evaluations per second (whole device, all cores / SMs).
    Fields a CPU lacks (`shared_memory_per_block_bytes`, `max_threads_per_block`) and a GPU lacks (`simd_isa`)
    are optional or empty.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="short identifier, e.g. 'local-cpu-amd-epyc' or 'h100-sxm'")
    kind: Literal["cpu", "gpu"]
    vendor: str = ""
    model: str = ""
    cores: int = Field(ge=1, description="physical cores (CPU) or SMs / compute units (GPU)")
    threads: int = Field(ge=1, description="hardware threads (CPU) or max resident threads (GPU)")
    simd_isa: list[str] = Field(default_factory=list, description="SIMD extensions, e.g. ['avx2', 'fma', 'avx512f']")
    simd_width_bits: int | None = Field(default=None, gt=0, description="widest SIMD register, in bits")
    simd_width: int = Field(ge=1, description="float32 lanes per SIMD register / warp / SIMD-group")
    caches: list[CacheLevel] = Field(default_factory=list)
    memory_bandwidth_gbs: float = Field(gt=0, description="main-memory bandwidth, GB/s (read + written)")
    peak_flops: dict[str, float] = Field(description="peak FLOP/s per dtype name, e.g. {'float32': 2.3e11}")
    exp_rate_per_s: float | None = Field(default=None, gt=0, description="exp evaluations per second")
    shared_memory_per_block_bytes: int | None = Field(default=None, gt=0)
    max_threads_per_block: int | None = Field(default=None, gt=0, description="None for a CPU")
    source: str = Field(description="'measured on this machine by ksearch probes <date>' or a datasheet URL")
    sources: dict[str, str] = Field(
        default_factory=dict, description="per-figure source where it differs from `source`, keyed by field name"
    )
    measured: dict[str, Measurement] = Field(
        default_factory=dict, description="how each measured ceiling was measured, keyed like `sources`"
    )
    fingerprint: str | None = Field(default=None, description="cache key of a measured spec")
    cache_bandwidth_gbs: dict[str, CacheBandwidth] = Field(default_factory=dict, description=(
        "bandwidth of working sets that fit a cache level, keyed 'L1', 'L2', 'L3'; empty: main memory only"))
    provisional: str | None = Field(default=None, description=(
        "why this spec was not cached (probed under load, or a figure outside the plausible range): usable by "
        "the process that measured it, probed again by the next one; None: a trusted measurement or a datasheet"))

    @model_validator(mode="after")
    def _check(self) -> HardwareSpec:
        for dtype, rate in self.peak_flops.items():
            if rate <= 0:
                raise ValueError(f"peak_flops[{dtype!r}] must be > 0 FLOP/s, got {rate!r}")
        known = set(type(self).model_fields)
        for key in [*self.sources, *self.measured]:
            if key.split(".", 1)[0] not in known:
                raise ValueError(f"sources/measured key {key!r} names no HardwareSpec field")
        return self

    def source_of(self, figure: str) -> str:
        """Where `figure` (a field name, or 'peak_flops.<dtype>') came from."""
        return self.sources.get(figure) or self.sources.get(figure.split(".", 1)[0]) or self.source

    def last_level_cache_bytes(self) -> int | None:
        """Size in bytes of one instance of the last data/unified cache level, or None if unknown."""
        return last_level_cache_bytes(self.caches)
