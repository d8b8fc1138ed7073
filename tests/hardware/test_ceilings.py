"""Probes that cannot poison the cache: interleaved repeats keep the best, a spec probed under load or with an
implausible figure is provisional (used by this process, never cached), old cached specs still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ksearch.errors import HardwareError
from ksearch.hardware import cache, ceilings, plausible, probes
from ksearch.hardware.cache import load_or_measure, load_spec, save_spec, spec_path
from ksearch.hardware.cpu import detect_cpu

from .fakeprobes import FakeMeter as _Meter
from .loadgen import detached_loops

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc' on PATH")

def _cached_files(home: Path) -> list[Path]:
    return sorted((home / "hardware").glob("*.json")) if (home / "hardware").exists() else []


def test_quiet_plausible_probes_are_cached(fake, ksearch_home):
    fake()
    spec = load_or_measure(seconds_per_probe=0.03)
    assert spec.provisional is None, spec.provisional
    assert load_spec(spec.fingerprint) == spec and len(_cached_files(ksearch_home)) == 1


def test_repeats_are_interleaved_and_keep_the_best(fake):
    log = fake({"stream": [5.0, 20.0, 9.0], "fma": [3e10, 2e10, 1e11], "exp": [6e9, 1e9, 2e9]})
    spec = load_or_measure(seconds_per_probe=0.03)
    assert (spec.memory_bandwidth_gbs, spec.peak_flops["float32"], spec.exp_rate_per_s) == (20.0, 1e11, 6e9)
    m = spec.measured["memory_bandwidth_gbs"]
    assert m.runs == ceilings.ROUNDS >= 3 and m.repeats == 3 * ceilings.ROUNDS and m.probe == "stream_read"
    assert m.median <= m.best and "best of 3 runs" in m.notes
    calls = log.read_text().split()
    levels = len(ceilings.cache_plan(detect_cpu(), m.threads))
    one_round = ["stream", "fma", "exp"] + ["cachebw"] * levels
    assert calls == one_round * ceilings.ROUNDS  # stream, fma, exp, the cache levels, then again


def test_probes_under_load_are_provisional_and_not_cached(fake, ksearch_home, monkeypatch):
    fake(busy=1.5)  # others used 1.5 cores during every run
    spec = load_or_measure(seconds_per_probe=0.03)
    assert spec.provisional and "probed under load (others used 1.50 cores" in spec.provisional
    assert _cached_files(ksearch_home) == []
    assert load_or_measure() is spec  # usable by this process without probing again
    monkeypatch.setattr(cache, "_provisional", {})  # the next process...
    fake(busy=0.0)
    again = load_or_measure(seconds_per_probe=0.03)  # ... probes again, on a quiet machine this time
    assert again.provisional is None and len(_cached_files(ksearch_home)) == 1


def test_one_quiet_run_is_enough(fake, monkeypatch):
    fake(busy=0.0)
    per_round = 3 + len(ceilings.cache_plan(detect_cpu(), 2))
    runs = iter([1.5] * per_round + [0.1] * per_round + [1.5] * per_round)  # only the second round is quiet

    class Meter(_Meter):
        def __init__(self, exclude_sessions=()):
            self.busy = next(runs)

    monkeypatch.setattr(ceilings, "LoadMeter", Meter)
    spec = load_or_measure(seconds_per_probe=0.03)
    assert spec.provisional is None and spec.measured["peak_flops.float32"].busy_cores == 0.1


@pytest.mark.parametrize("probe, value, key", [("stream", 0.004, "memory_bandwidth_gbs"),
                                               ("fma", 2e7, "peak_flops.float32"),
                                               ("exp", 1e6, "exp_rate_per_s"),
                                               ("cachebw", 0.01, "cache_bandwidth_gbs.L")])
def test_an_implausible_figure_is_not_cached(fake, ksearch_home, probe, value, key):
    fake({probe: [value]})
    spec = load_or_measure(seconds_per_probe=0.03)
    assert spec.provisional and key in spec.provisional and "is below" in spec.provisional
    assert _cached_files(ksearch_home) == []


@needs_cc
def test_real_probes_under_synthetic_load_are_not_cached(ksearch_home, monkeypatch):
    monkeypatch.setattr(cache, "_provisional", {})
    monkeypatch.setattr(probes, "stream_bytes", lambda info: 48 * 10**6)  # quicker; still a DRAM-sized stream
    with detached_loops() as pids:
        spec = load_or_measure(seconds_per_probe=0.06)
    assert pids
    assert spec.provisional and "probed under load" in spec.provisional, spec.provisional
    assert _cached_files(ksearch_home) == []


def test_save_refuses_a_provisional_spec(ksearch_home, tiny_spec):
    with pytest.raises(HardwareError, match="provisional"):
        save_spec(tiny_spec.model_copy(update={"provisional": "probed under load"}))


def test_a_spec_cached_before_the_load_meter_still_loads(ksearch_home, tiny_spec):
    old = json.loads(tiny_spec.model_dump_json())
    for key in ("provisional", "cache_bandwidth_gbs"):
        del old[key]
    for m in old["measured"].values():
        for key in ("runs", "busy_cores", "vectorized"):
            del m[key]
    spec_path(tiny_spec.fingerprint).parent.mkdir(parents=True, exist_ok=True)
    spec_path(tiny_spec.fingerprint).write_text(json.dumps(old))
    loaded = load_spec(tiny_spec.fingerprint)
    assert loaded == tiny_spec and loaded.provisional is None and loaded.cache_bandwidth_gbs == {}


def test_a_cached_implausible_spec_is_a_miss(ksearch_home, tiny_spec):
    poisoned = tiny_spec.model_copy(update={"memory_bandwidth_gbs": 0.05})  # a 2-core CPU streams > 1 GB/s
    save_spec(poisoned)
    assert plausible.implausible(poisoned) and load_spec(tiny_spec.fingerprint) is None


def test_cpu_ranges_follow_the_detected_facts(tiny_spec):
    r = plausible.cpu_ranges(tiny_spec)  # 2 cores, 4 threads (2 per core), 8 lanes; the measurement ran 4 threads
    assert r["memory_bandwidth_gbs"].lo == pytest.approx(1.0) and r["memory_bandwidth_gbs"].hi == 4 * 200
    assert r["peak_flops.float32"].lo == pytest.approx(1 * 8 * 2 * 0.5 * 0.5e9)
    assert r["exp_rate_per_s"].lo == pytest.approx(0.5e9 * 8 / 32)
    scalar = tiny_spec.model_copy(update={"measured": {"exp_rate_per_s": tiny_spec.measured[
        "memory_bandwidth_gbs"].model_copy(update={"vectorized": False, "threads": 4})}})
    assert plausible.cpu_ranges(scalar)["exp_rate_per_s"].lo == pytest.approx(0.5e9 / 32)
    assert plausible.implausible(tiny_spec) == []


def test_gpu_ranges_come_from_the_catalog(tiny_spec):
    h200 = tiny_spec.model_copy(update={"kind": "gpu", "model": "NVIDIA H200", "memory_bandwidth_gbs": 4000.0,
                                        "peak_flops": {"float32": 60e12}, "exp_rate_per_s": 3.9e12})
    assert plausible.implausible(h200) == []
    slow = h200.model_copy(update={"memory_bandwidth_gbs": 40.0})
    assert plausible.implausible(slow)[0].startswith("memory_bandwidth_gbs 40 is below 1200")
    unknown = slow.model_copy(update={"model": "Some Future GPU"})
    assert plausible.implausible(unknown) == []


def test_cache_plan_halves_each_threads_share_of_a_level():
    from ksearch.hardware.cpu import CpuInfo
    from ksearch.hardware.spec import CacheLevel

    info = CpuInfo(cores=8, threads=16, caches=[
        CacheLevel(level=1, kind="data", size_bytes=48 << 10), CacheLevel(level=1, kind="instruction", size_bytes=1),
        CacheLevel(level=2, size_bytes=2 << 20), CacheLevel(level=3, size_bytes=32 << 20, shared_by_cores=4)])
    plan = {p.level: p for p in ceilings.cache_plan(info, threads=8)}  # 8 threads: 4 cores, 2 threads each
    assert plan[1].per_thread_bytes == (48 << 10) * 4 // 8 // 2 and plan[1].capacity_bytes == 4 * (48 << 10)
    assert plan[2].capacity_bytes == 4 * (2 << 20)
    # the 4 cores fit one L3 when packed (the probe's arrays), but may sit on two (the roofline's capacity)
    assert plan[3].per_thread_bytes == (32 << 20) // 8 // 2 and plan[3].capacity_bytes == 2 * (32 << 20)
