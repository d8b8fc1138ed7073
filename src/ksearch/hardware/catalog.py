"""The hardware catalog: datasheet figures of known devices, each with its source.

Data lives in ``catalog/*.yaml`` beside this module (one file per vendor family); docs/hardware-catalog.md describes
the format and the sources policy. Every figure is a `Figure`: a value with the source it came from (and how it was
derived, when it was), or null with a note saying why it is unknown. Nothing is unsourced.

Use:
- `get(name)` -> `CatalogEntry` (names are case-insensitive, with aliases: "h100", "H100-SXM", "m2-max");
- `limits(name)` -> `Limits`: the hard limits a static check or a prompt needs;
- `to_spec(name)` -> `HardwareSpec` for roofline math and prompts;
- `entries()`, `names()`, `close_matches(name)`.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ksearch import yamlio
from ksearch.errors import HardwareError
from ksearch.hardware.spec import CacheLevel, HardwareSpec

CATALOG_DIR = Path(__file__).with_name("catalog")

#: Every figure name an entry may carry, with its unit and meaning. ``peak_flops.<dtype>`` names a dtype:
#: plain dtypes (float32, float16, float64) are the vector/SIMD ALU rate, ``tensor_*`` the tensor-core/matrix rate
#: (dense, no sparsity).
FIGURES: dict[str, tuple[str, str]] = {
    "memory_bandwidth_gbs": ("GB/s", "main-memory bandwidth (1e9 bytes/s)"),
    "memory_gb": ("GB", "memory size (largest configuration for Apple chips)"),
    "peak_flops.float32": ("FLOP/s", "FP32 vector peak (FMA = 2 FLOP)"),
    "peak_flops.float16": ("FLOP/s", "FP16 vector/SIMD peak"),
    "peak_flops.bfloat16": ("FLOP/s", "BF16 vector/SIMD peak"),
    "peak_flops.float64": ("FLOP/s", "FP64 vector peak"),
    "peak_flops.tensor_float64": ("FLOP/s", "FP64 tensor-core peak"),
    "peak_flops.tensor_tf32": ("FLOP/s", "TF32 tensor-core peak, dense"),
    "peak_flops.tensor_float16": ("FLOP/s", "FP16 tensor-core peak, dense"),
    "peak_flops.tensor_bfloat16": ("FLOP/s", "BF16 tensor-core peak, dense"),
    "peak_flops.tensor_float8": ("FLOP/s", "FP8 tensor-core peak, dense"),
    "peak_flops.tensor_float4": ("FLOP/s", "FP4 tensor-core peak, dense"),
    "exp_rate_per_s": ("exp/s", "special-function (exp2) evaluations per second, whole device"),
    "cores": ("", "SMs (NVIDIA) or GPU cores (Apple)"),
    "fp32_lanes_per_core": ("", "FP32 ALUs per SM / GPU core"),
    "clock_mhz": ("MHz", "GPU boost clock"),
    "simd_width": ("", "threads per warp / SIMD-group"),
    "max_threads_per_block": ("", "max threads per block / threadgroup"),
    "max_threads_per_sm": ("", "max resident threads per SM / core"),
    "shared_memory_per_block_bytes": ("B", "shared/threadgroup memory per block without opt-in (static)"),
    "shared_memory_per_block_optin_bytes": ("B", "shared/threadgroup memory per block, opt-in maximum"),
    "shared_memory_per_sm_bytes": ("B", "shared memory per SM / core"),
    "registers_per_sm_bytes": ("B", "register file per SM / core"),
    "l2_cache_bytes": ("B", "L2 cache, whole device"),
    "slc_bytes": ("B", "system-level cache (Apple)"),
}

#: Figures every entry states, either with a value and its source or as null with a note.
REQUIRED = (
    "memory_bandwidth_gbs", "memory_gb", "peak_flops.float32", "peak_flops.float64", "exp_rate_per_s", "cores",
    "clock_mhz", "simd_width", "max_threads_per_block", "shared_memory_per_block_bytes",
    "shared_memory_per_block_optin_bytes", "registers_per_sm_bytes", "l2_cache_bytes",
)


class Source(BaseModel):
    """A document a figure comes from: a title, and a URL where there is one."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1)
    url: str | None = None

    def __str__(self) -> str:
        return f"{self.title} <{self.url}>" if self.url else self.title


class Figure(BaseModel):
    """One figure: a value with its source (and derivation), or null with a note saying why it is unknown."""

    model_config = ConfigDict(extra="forbid")

    value: int | float | None = None
    source: str | None = Field(default=None, description="key of the file's `sources`, resolved to its text on load")
    derived: str | None = Field(default=None, description="how the value was derived, and from what")
    note: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Figure:
        if self.value is not None and not (self.source and self.source.strip()):
            raise ValueError(f"figure value {self.value!r} has no source")
        if self.value is None and not (self.note and self.note.strip()):
            raise ValueError("a null figure needs a note saying why it is unknown")
        if self.value is not None and self.value <= 0:
            raise ValueError(f"figure value must be > 0, got {self.value!r}")
        return self


class CatalogEntry(BaseModel):
    """One catalog device: names, description and its figures (see `FIGURES`), each with its source."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    aliases: list[str] = Field(default_factory=list)
    vendor: str
    model: str
    arch: str = ""
    kind: Literal["gpu", "cpu"] = "gpu"
    figures: dict[str, Figure]
    file: str = Field(default="", description="catalog file the entry came from")

    @model_validator(mode="after")
    def _check(self) -> CatalogEntry:
        unknown = sorted(set(self.figures) - set(FIGURES))
        if unknown:
            raise ValueError(f"{self.name}: unknown figure(s) {unknown}; known: {sorted(FIGURES)}")
        missing = [f for f in REQUIRED if f not in self.figures]
        if missing:
            raise ValueError(f"{self.name}: required figure(s) missing {missing} (give null with a note if unknown)")
        return self

    def value(self, figure: str) -> float | None:
        """The value of `figure`, or None when unknown or absent."""
        f = self.figures.get(figure)
        return f.value if f else None

    def int_value(self, figure: str) -> int | None:
        v = self.value(figure)
        return None if v is None else int(v)

    def source_of(self, figure: str) -> str | None:
        """Where `figure` came from (with its derivation), or None when it is unknown."""
        f = self.figures.get(figure)
        if f is None or f.value is None:
            return None
        return f"{f.source}; derived: {f.derived}" if f.derived else f.source

    def peak_flops(self) -> dict[str, float]:
        """Known peak FLOP/s per dtype key (``float32``, ``tensor_bfloat16``, ...)."""
        return {k.split(".", 1)[1]: f.value for k, f in self.figures.items()
                if k.startswith("peak_flops.") and f.value is not None}

    def all_names(self) -> list[str]:
        return [self.name, *self.aliases]


class Limits(BaseModel):
    """Hard limits of one device, for static checks and prompts. Bytes, threads, lanes, GB/s."""

    model_config = ConfigDict(extra="forbid")

    name: str
    shared_memory_per_block_bytes: int = Field(description="without opt-in: 48 KB static on NVIDIA, 32 KB on Apple")
    shared_memory_per_block_optin_bytes: int = Field(description="opt-in maximum (= the above where none exists)")
    max_threads_per_block: int
    simd_width: int
    memory_bandwidth_gbs: float


def normalize(name: str) -> str:
    """Lower-case, spaces/underscores to '-', vendor prefix ('nvidia-') dropped: 'NVIDIA H100_SXM' -> 'h100-sxm'."""
    n = re.sub(r"[\s_]+", "-", name.strip().lower())
    return re.sub(r"^nvidia-", "", n)


def _load_file(path: Path) -> list[CatalogEntry]:
    try:
        data = yamlio.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise HardwareError(f"catalog {path.name}: cannot read: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise HardwareError(f"catalog {path.name}: expected a mapping with an 'entries' list")
    try:
        sources = {k: Source.model_validate(v) for k, v in (data.get("sources") or {}).items()}
    except ValidationError as e:
        raise HardwareError(f"catalog {path.name}: bad source: {e}") from None
    defaults = (data.get("defaults") or {})
    out = []
    for raw in data["entries"]:
        raw = dict(raw)
        figures = {**defaults, **(raw.pop("figures", None) or {})}
        resolved = {}
        for key, fig in figures.items():
            fig = dict(fig or {})
            src = fig.get("source")
            if src is not None:
                if src not in sources:
                    raise HardwareError(f"catalog {path.name}: {raw.get('name')}.{key}: unknown source key {src!r}; "
                                        f"known: {sorted(sources)}")
                fig["source"] = str(sources[src])
            resolved[key] = fig
        raw.setdefault("vendor", data.get("vendor", ""))
        try:
            out.append(CatalogEntry.model_validate({**raw, "figures": resolved, "file": path.name}))
        except ValidationError as e:
            raise HardwareError(f"catalog {path.name}: entry {raw.get('name')!r}: {e}") from None
    return out


@lru_cache(maxsize=1)
def _catalog() -> tuple[tuple[CatalogEntry, ...], dict[str, CatalogEntry]]:
    entries: list[CatalogEntry] = []
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        entries += _load_file(path)
    index: dict[str, CatalogEntry] = {}
    for e in entries:
        for n in e.all_names():
            key = normalize(n)
            if key in index and index[key] is not e:
                raise HardwareError(f"catalog: name {n!r} of {e.name} already names {index[key].name}")
            index[key] = e
    return tuple(entries), index


def entries() -> list[CatalogEntry]:
    """All catalog entries, in file order (apple.yaml, then nvidia.yaml)."""
    return list(_catalog()[0])


def names() -> list[str]:
    """Every name and alias the catalog answers to."""
    return sorted(_catalog()[1])


def close_matches(name: str, n: int = 5) -> list[str]:
    """Canonical names of the entries whose names or aliases are close to `name`."""
    key = normalize(name)
    index = _catalog()[1]
    hits = difflib.get_close_matches(key, list(index), n=n * 3, cutoff=0.6)
    hits += [k for k in index if key and (key in k or k in key)]
    out: list[str] = []
    for k in hits:
        if index[k].name not in out:
            out.append(index[k].name)
    return out[:n]


def find(name: str) -> CatalogEntry | None:
    """The entry named `name` (case-insensitive, aliases allowed), or None."""
    return _catalog()[1].get(normalize(name))


def get(name: str) -> CatalogEntry:
    """The entry named `name`. Raises HardwareError naming close matches when there is none."""
    entry = find(name)
    if entry is None:
        near = close_matches(name)
        hint = f"; close matches: {', '.join(near)}" if near else ""
        raise HardwareError(f"unknown hardware {name!r}{hint} (`ksearch hardware list` shows all)")
    return entry


def limits(name: str) -> Limits:
    """Hard limits of entry `name` (shared/threadgroup memory per block, threads per block, SIMD width, bandwidth)."""
    e = get(name)
    static = e.int_value("shared_memory_per_block_bytes")
    values = {"shared_memory_per_block_bytes": static,
              "shared_memory_per_block_optin_bytes": e.int_value("shared_memory_per_block_optin_bytes") or static,
              "max_threads_per_block": e.int_value("max_threads_per_block"),
              "simd_width": e.int_value("simd_width"), "memory_bandwidth_gbs": e.value("memory_bandwidth_gbs")}
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise HardwareError(f"catalog entry {e.name} lacks {missing}")
    return Limits(name=e.name, **values)


def to_spec(name: str) -> HardwareSpec:
    """Entry `name` as a HardwareSpec (for roofline math and prompts); every figure keeps its source.

    ``peak_flops`` keys are the catalog's dtype keys (``float32``, ``float16``, ``tensor_bfloat16``...); ``threads`` is
    cores x max resident threads per SM, or cores x max threads per block where the former is unpublished (said in
    ``sources['threads']``); shared memory per block is the opt-in maximum. Raises HardwareError when the entry lacks
    a figure a spec needs (core count, bandwidth or an FP32 peak).
    """
    e = get(name)
    cores, bw, flops = e.int_value("cores"), e.value("memory_bandwidth_gbs"), e.peak_flops()
    missing = [k for k, v in (("cores", cores), ("memory_bandwidth_gbs", bw), ("peak_flops", flops)) if not v]
    if missing:
        raise HardwareError(f"catalog entry {e.name} cannot become a HardwareSpec: no {', '.join(missing)} "
                            f"(unpublished; see `ksearch hardware show {e.name}`)")
    sources: dict[str, str] = {}

    def src(field: str, figure: str) -> None:
        s = e.source_of(figure)
        if s:
            sources[field] = s

    per_sm, per_block = e.int_value("max_threads_per_sm"), e.int_value("max_threads_per_block") or 1
    threads = cores * (per_sm or per_block)
    if per_sm:
        sources["threads"] = f"derived: cores x max threads per SM ({e.source_of('max_threads_per_sm')})"
    else:
        sources["threads"] = "stand-in: cores x max threads per threadgroup (resident-thread limit unpublished)"
    caches = []
    for figure in ("l2_cache_bytes", "slc_bytes"):
        size = e.int_value(figure)
        if size:
            caches.append(CacheLevel(level=2 if figure == "l2_cache_bytes" else 3, kind="unified", size_bytes=size,
                                     shared_by_cores=cores))
            src("caches", figure)
    for field, figure in (("memory_bandwidth_gbs", "memory_bandwidth_gbs"), ("cores", "cores"),
                          ("simd_width", "simd_width"), ("exp_rate_per_s", "exp_rate_per_s"),
                          ("max_threads_per_block", "max_threads_per_block"),
                          ("shared_memory_per_block_bytes", "shared_memory_per_block_optin_bytes")):
        src(field, figure)
    for dtype in flops:
        src(f"peak_flops.{dtype}", f"peak_flops.{dtype}")
    return HardwareSpec(
        name=e.name, kind=e.kind, vendor=e.vendor, model=e.model, cores=cores, threads=threads,
        simd_width=e.int_value("simd_width") or 32, caches=caches, memory_bandwidth_gbs=bw, peak_flops=flops,
        exp_rate_per_s=e.value("exp_rate_per_s"),
        shared_memory_per_block_bytes=e.int_value("shared_memory_per_block_optin_bytes")
        or e.int_value("shared_memory_per_block_bytes"),
        max_threads_per_block=e.int_value("max_threads_per_block"),
        source=f"hardware catalog entry {e.name} ({e.file}); per-figure sources in `sources`", sources=sources,
    )
