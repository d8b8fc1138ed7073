"""Detection of the local CPU: model, cores, threads, SIMD extensions, caches. No root needed.

Sources, in order: /proc/cpuinfo, /sys/devices/system/cpu/cpu0/cache, then `lscpu`, then `os` / `platform`.
The parsers are pure functions over text so they can be tested on hand-made input.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

from ksearch.hardware.spec import CacheLevel, last_level_cache_bytes

CPUINFO = Path("/proc/cpuinfo")
SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

# /proc/cpuinfo flag -> name in HardwareSpec.simd_isa (x86 "flags", Arm "Features").
_ISA_NAMES = {
    "sse2": "sse2", "ssse3": "ssse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "avx": "avx", "avx2": "avx2",
    "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512cd": "avx512cd",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16", "avx_vnni": "avxvnni", "amx_tile": "amx-tile", "amx_bf16": "amx-bf16",
    "amx_int8": "amx-int8", "asimd": "neon", "asimdhp": "neon-fp16", "asimddp": "neon-dotprod",
    "sve": "sve", "sve2": "sve2", "bf16": "bf16", "i8mm": "i8mm",
}  # fmt: skip

_ARM_VENDORS = {"0x41": "ARM", "0x61": "Apple", "0x51": "Qualcomm", "0x48": "HiSilicon", "0x4e": "NVIDIA"}


class CpuInfo(BaseModel):
    """Detected facts of the local CPU (no ceilings: those are measured by `ksearch.hardware.probes`)."""

    vendor: str = "unknown"
    model: str = "unknown"
    cores: int = Field(ge=1, description="physical cores")
    threads: int = Field(ge=1, description="hardware threads (logical CPUs)")
    simd_isa: list[str] = Field(default_factory=list)
    simd_width_bits: int = Field(default=128, gt=0, description="widest SIMD register, in bits")
    caches: list[CacheLevel] = Field(default_factory=list)

    @property
    def simd_width(self) -> int:
        """float32 lanes in the widest SIMD register."""
        return max(1, self.simd_width_bits // 32)

    def last_level_cache_bytes(self) -> int | None:
        """Size in bytes of one instance of the last data/unified cache level, or None if unknown."""
        return last_level_cache_bytes(self.caches)


def parse_cpuinfo(text: str) -> dict:
    """Parse /proc/cpuinfo text into {vendor, model, cores, threads, flags} (keys absent when unknown)."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    out: dict = {}
    core_ids: set[tuple[str, str]] = set()
    processors = 0
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip().lower()] = value.strip()
        if "processor" in fields and fields["processor"].isdigit():
            processors += 1
        if "core id" in fields:
            core_ids.add((fields.get("physical id", "0"), fields["core id"]))
        for key in ("model name", "hardware", "cpu model"):
            if key in fields and "model" not in out:
                out["model"] = fields[key]
        if "vendor_id" in fields:
            out.setdefault("vendor", fields["vendor_id"])
        elif "cpu implementer" in fields:
            out.setdefault("vendor", _ARM_VENDORS.get(fields["cpu implementer"].lower(), fields["cpu implementer"]))
        flags = fields.get("flags") or fields.get("features")
        if flags:
            out.setdefault("flags", flags.split())
    if processors:
        out["threads"] = processors
    if core_ids:
        out["cores"] = len(core_ids)
    return out


def isa_from_flags(flags: list[str]) -> tuple[list[str], int]:
    """SIMD extension names (in `_ISA_NAMES` order) and the widest SIMD register in bits for a list of CPU flags."""
    have = set(flags)
    isa = [name for flag, name in _ISA_NAMES.items() if flag in have]
    if "avx512f" in have:
        width = 512
    elif "avx" in have:
        width = 256
    else:
        width = 128  # SSE2 (x86-64 baseline) or NEON; SVE width is not in /proc/cpuinfo
    return isa, width


def _parse_size(text: str) -> int | None:
    """'32K' / '32 KiB' / '1 MiB (2 instances)' -> bytes."""
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        return None
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _count_cpus(cpu_list: str) -> int:
    """'0-3,8' -> 5."""
    n = 0
    for part in cpu_list.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            n += int(hi) - int(lo) + 1
        elif part:
            n += 1
    return n


def read_sysfs_caches(root: Path = SYSFS_CACHE, threads_per_core: int = 1) -> list[CacheLevel]:
    """Caches of cpu0 from sysfs (`root`/index*/{level,type,size,shared_cpu_list}); [] when unreadable."""
    caches = []
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip().lower()
            size = _parse_size((index / "size").read_text())
            shared_path = index / "shared_cpu_list"
            shared = _count_cpus(shared_path.read_text()) if shared_path.exists() else 1
        except (OSError, ValueError):
            continue
        if size:
            caches.append(
                CacheLevel(
                    level=level,
                    kind=kind if kind in ("data", "instruction", "unified") else "unified",
                    size_bytes=size,
                    shared_by_cores=max(1, shared // max(1, threads_per_core)),
                )
            )
    return caches


def parse_lscpu(text: str, cores: int) -> dict:
    """Parse `lscpu` text into {vendor, model, flags, caches} (keys absent when unknown)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    out: dict = {}
    if "Model name" in fields:
        out["model"] = fields["Model name"]
    if "Vendor ID" in fields:
        out["vendor"] = fields["Vendor ID"]
    if "Flags" in fields:
        out["flags"] = fields["Flags"].split()
    caches = []
    for key, value in fields.items():
        m = re.fullmatch(r"L(\d)([di]?) cache", key)
        total = _parse_size(value) if m else None
        if not m or not total:
            continue
        inst = re.search(r"\((\d+) instances?\)", value)
        instances = int(inst.group(1)) if inst else 1
        kind = {"d": "data", "i": "instruction", "": "unified"}[m.group(2)]
        caches.append(
            CacheLevel(
                level=int(m.group(1)),
                kind=kind,
                size_bytes=total // instances,
                shared_by_cores=max(1, cores // instances),
            )
        )
    if caches:
        out["caches"] = caches
    return out


def _lscpu_text() -> str:
    exe = shutil.which("lscpu")
    if not exe:
        return ""
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=10, env={"LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def detect_cpu() -> CpuInfo:
    """Detect the local CPU's model, cores, threads, SIMD extensions and caches. Never needs root."""
    try:
        info = parse_cpuinfo(CPUINFO.read_text())
    except OSError:
        info = {}
    threads = info.get("threads") or os.cpu_count() or 1
    cores = min(info.get("cores") or threads, threads)
    caches = read_sysfs_caches(SYSFS_CACHE, threads_per_core=max(1, threads // cores))
    if not caches or "model" not in info or "flags" not in info:
        fallback = parse_lscpu(_lscpu_text(), cores)
        for key, value in fallback.items():
            info.setdefault(key, value)
        caches = caches or fallback.get("caches", [])
    isa, width = isa_from_flags(info.get("flags", []))
    return CpuInfo(
        vendor=info.get("vendor") or "unknown",
        model=info.get("model") or platform.processor() or platform.machine() or "unknown",
        cores=cores,
        threads=threads,
        simd_isa=isa,
        simd_width_bits=width,
        caches=caches,
    )
