"""On-disk cache of the measured local spec: $KSEARCH_HOME/hardware/<fingerprint>.json.

Only trusted specs are cached: a provisional one (probed under load, or with an implausible figure; see
`ksearch.hardware.local`) is kept in this process only, and the next process probes again. A cached file whose
figures have become implausible (written by an older ksearch) is a miss.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware.cpu import detect_cpu
from ksearch.hardware.local import local_fingerprint, measure_local_spec
from ksearch.hardware.plausible import implausible
from ksearch.hardware.probes import compiler_version, find_compiler
from ksearch.hardware.spec import HardwareSpec

#: seconds a process waits for another one's probing (`probe_lock`) before it gives up
PROBE_LOCK_WAIT_S = 900.0

# Provisional specs measured by this process: (hardware dir, fingerprint) -> spec. Never written to disk.
_provisional: dict[tuple[str, str], HardwareSpec] = {}


def home_dir() -> Path:
    """ksearch's data directory: `config.home_dir()` ($KSEARCH_HOME, default ~/.cache/ksearch)."""
    return config.home_dir()


def hardware_dir() -> Path:
    """Directory of cached hardware specs."""
    return home_dir() / "hardware"


def spec_path(fingerprint: str) -> Path:
    """File of the cached spec with this fingerprint."""
    return hardware_dir() / f"{fingerprint}.json"


def save_spec(spec: HardwareSpec) -> Path:
    """Write `spec` atomically under its fingerprint; returns the file. Raises HardwareError without a
    fingerprint or when the spec is provisional (it must not outlive this process)."""
    if not spec.fingerprint:
        raise HardwareError(f"spec {spec.name!r} has no fingerprint to be cached under")
    if spec.provisional:
        raise HardwareError(f"spec {spec.name!r} is provisional and is not cached: {spec.provisional}")
    path = spec_path(spec.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(spec.model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load_spec(fingerprint: str) -> HardwareSpec | None:
    """The cached spec with this fingerprint, or None when absent, unreadable, provisional or implausible (it is
    then re-measured). Specs cached before the load meter (no `provisional`, no cache levels) load as they are."""
    path = spec_path(fingerprint)
    try:
        spec = HardwareSpec.model_validate_json(path.read_text())
    except (OSError, ValueError, ValidationError):
        return None
    if spec.provisional or implausible(spec):
        return None
    return spec


def current_fingerprint() -> str:
    """Fingerprint of this machine's CPU and compiler. Raises HardwareError when the compiler is missing."""
    return local_fingerprint(detect_cpu(), compiler_version(find_compiler()))


def cached_local_spec() -> HardwareSpec | None:
    """The cached spec of this machine, or None if it has not been measured (with this compiler)."""
    return load_spec(current_fingerprint())


_held = threading.local()


@contextmanager
def probe_lock(wait_s: float | None = None) -> Iterator[None]:
    """Held while this process probes the hardware: an exclusive flock on ``$KSEARCH_HOME/hardware/probe.lock``,
    so that processes sharing a home (two runs started at once) probe one at a time, never each under the
    other's load, and the second finds what the first cached. Re-entrant within a process. Waits up to ``wait_s``
    (default `PROBE_LOCK_WAIT_S`) for another process's probing, then raises HardwareError."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    path = hardware_dir() / "probe.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError as e:
        raise HardwareError(f"cannot take the hardware probing lock {path}: {e.strerror or e}") from None
    try:
        limit = PROBE_LOCK_WAIT_S if wait_s is None else wait_s
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HardwareError(f"another ksearch process has been probing the hardware for over "
                                        f"{limit:g} s (it holds {path})") from None
                time.sleep(0.05)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
    finally:
        f.close()


def load_or_measure(refresh: bool = False, *, seconds_per_probe: float = 0.5) -> HardwareSpec:
    """The local spec from the cache, or measured when absent or `refresh` is set: cached when trusted, else
    kept for this process only (provisional: see `HardwareSpec.provisional`) and measured again by the next.
    Measured under `probe_lock`: a process that waited for another's probing takes the spec it cached.

    Raises HardwareError when the compiler is missing or a probe fails or times out.
    """
    info, cc = detect_cpu(), find_compiler()
    fingerprint = local_fingerprint(info, compiler_version(cc))
    if not refresh:
        spec = load_spec(fingerprint) or provisional_spec(fingerprint)
        if spec is not None:
            return spec
    asked = time.time()
    with probe_lock():
        if not refresh or _cached_since(fingerprint, asked):  # measured by another process while this one waited
            spec = load_spec(fingerprint)
            if spec is not None:
                return spec
        return remember(measure_local_spec(info=info, cc=cc, seconds_per_probe=seconds_per_probe))


def _cached_since(fingerprint: str, t: float) -> bool:
    """Whether the cached spec of ``fingerprint`` was written at or after ``t`` (seconds since the epoch)."""
    try:
        return spec_path(fingerprint).stat().st_mtime >= t
    except OSError:
        return False


def remember(spec: HardwareSpec) -> HardwareSpec:
    """Keep a measured `spec` (with a fingerprint) as this machine's: saved when trusted, else (provisional) kept
    for this process only, where `provisional_spec` finds it. Returns `spec`."""
    if not spec.fingerprint:
        return spec
    memo = (str(hardware_dir()), spec.fingerprint)
    if spec.provisional:
        _provisional[memo] = spec
    else:
        _provisional.pop(memo, None)
        save_spec(spec)
    return spec


def provisional_spec(fingerprint: str) -> HardwareSpec | None:
    """The provisional spec this process measured under `fingerprint` (see `remember`), or None."""
    return _provisional.get((str(hardware_dir()), fingerprint))


def catalog_spec(device_name: str, what: str) -> HardwareSpec:
    """The hardware catalog's spec of the device a runtime reports by name (MLX's
    ``mx.device_info()["device_name"]``: "Apple M2 Max", "NVIDIA H200"): datasheet figures, not measured ones.
    ``what``: the device in words, for the message. Raises HardwareError when the device is not in the catalog
    (the message lists close names)."""
    from ksearch.hardware import catalog

    entry = catalog.find(device_name) or \
        catalog.find(device_name.lower().replace("apple", "").replace("nvidia", "").strip())
    if entry is None:
        raise HardwareError(f"the {what} {device_name!r} is not in the hardware catalog (`ksearch hardware list`); "
                            f"close: {catalog.close_matches(device_name)}")
    return catalog.to_spec(entry.name)


def stored_spec(stored: dict | None, kind: str) -> HardwareSpec | None:
    """A run's stored spec (``stored``, `Store.hardware()`) when it is a valid, trusted (not provisional),
    plausible spec of this machine's device of ``kind`` (``cpu`` | ``gpu``: what the run's target runs on), so that
    a resumed run keeps the figures it started with; else None (the caller measures again)."""
    if not stored:
        return None
    try:
        spec = HardwareSpec.model_validate(stored)
    except ValidationError:
        return None
    if spec.provisional or implausible(spec) or not _same_device(kind, spec):
        return None
    return spec


def _same_device(kind: str, spec: HardwareSpec) -> bool:
    """Whether `spec` describes the device of ``kind`` here: the CPU's model, cores and threads; a measured
    GPU's name and SM count. A catalog spec (no measurement) answers False: looking it up again costs nothing."""
    if spec.kind != kind:
        return False
    if spec.kind == "cpu":
        info = detect_cpu()
        return (spec.model, spec.cores, spec.threads) == (info.model, info.cores, info.threads)
    if not (spec.fingerprint or "").startswith("gpu-"):
        return False
    try:
        from ksearch.hardware.gpu import gpu_facts

        facts = gpu_facts()
    except HardwareError:
        return False
    return (spec.model, spec.cores) == (facts["name"], facts["sms"])
