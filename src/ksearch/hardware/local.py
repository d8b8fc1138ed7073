"""The spec of the local CPU: detected facts plus ceilings measured by the probes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

from ksearch.hardware.cpu import CpuInfo, detect_cpu
from ksearch.hardware.probes import PROBE_VERSION, compiler_version, find_compiler, measure_ceilings
from ksearch.hardware.spec import HardwareSpec


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
    """Detect the local CPU and measure its ceilings (about 3 x `seconds_per_probe` s plus compiles).

    Raises HardwareError when the compiler is missing or a probe fails or times out.
    """
    info = info or detect_cpu()
    cc = cc or find_compiler()
    version = compiler_version(cc)
    measured = measure_ceilings(info, seconds_per_probe=seconds_per_probe, cc=cc)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    return HardwareSpec(
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
        source=f"measured on this machine by ksearch probes {today} ({version})",
        sources={f: "detected from /proc/cpuinfo, sysfs or lscpu" for f in ("model", "cores", "simd_isa", "caches")},
        measured=measured,
        fingerprint=local_fingerprint(info, version),
    )
