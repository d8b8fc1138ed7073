"""reprobe: the ceiling that set a floor measured again before a rejection; never lower; cached when quiet."""

from __future__ import annotations

import shutil
import time

import pytest

from ksearch.hardware import cache
from ksearch.hardware.cache import load_spec, save_spec
from ksearch.hardware.reprobe import reprobe

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc' on PATH")


@pytest.fixture
def local(tiny_spec, monkeypatch):
    """tiny_spec under this machine's fingerprint, no cache levels."""
    monkeypatch.setattr(cache, "_provisional", {})
    return tiny_spec.model_copy(update={"fingerprint": cache.current_fingerprint()})


@needs_cc
def test_a_poisoned_bandwidth_is_measured_again_and_only_it(local):
    poisoned = local.model_copy(update={"memory_bandwidth_gbs": 0.002})  # 1000s of times too low anywhere
    reprobe(poisoned, "compute", seconds=0.02)  # builds the probes of this process once
    t = time.perf_counter()
    fixed = reprobe(poisoned, "memory")
    took = time.perf_counter() - t
    assert fixed.memory_bandwidth_gbs > 1.0 and fixed.measured["memory_bandwidth_gbs"].probe.startswith("stream_")
    before, after = poisoned.measured.get("memory_bandwidth_gbs"), fixed.measured["memory_bandwidth_gbs"]
    # measured again: its runs add to the old record's; the note is the better run's (the old one's where a busy
    # machine made the new run slower)
    assert after.runs > (before.runs if before is not None else 0)
    assert "re-probed" in after.notes or (before is not None and after.best == before.best), after
    assert fixed.cache_bandwidth_gbs or not fixed.caches  # the cache levels were measured too
    # only the memory probes ran (the compute and exp records are untouched): seconds, not the whole probe suite
    for key in ("exp_rate_per_s", *(k for k in poisoned.measured if k.startswith("peak_flops."))):
        assert fixed.measured.get(key) == poisoned.measured.get(key), key
    assert took < 30.0, f"reprobe('memory') took {took:.1f} s"  # a hang guard: ~1-4 s on 2 cores, quiet to busy


def test_quiet_figures_raise_the_spec_and_the_cache(fake, local):
    save_spec(local)
    fake({"stream": [30.0, 40.0]}, busy=0.0)
    fixed = reprobe(local.model_copy(update={"memory_bandwidth_gbs": 3.0}), "memory")
    assert fixed.memory_bandwidth_gbs == 40.0 and fixed.measured["memory_bandwidth_gbs"].runs == 1 + 2  # its run, then 2 more
    assert set(fixed.cache_bandwidth_gbs) >= {f"L{c.level}" for c in fixed.caches if c.kind != "instruction"}
    assert load_spec(local.fingerprint).memory_bandwidth_gbs == 40.0  # the cached spec, raised
    assert fixed.peak_flops == local.peak_flops and fixed.exp_rate_per_s == local.exp_rate_per_s


def test_busy_figures_raise_the_spec_but_not_the_cache(fake, local):
    save_spec(local)
    fake({"stream": [30.0]}, busy=1.5)
    fixed = reprobe(local, "memory")
    assert fixed.memory_bandwidth_gbs == 30.0
    assert load_spec(local.fingerprint) == local


def test_a_ceiling_never_goes_down(fake, local):
    fake({"fma": [5e10], "exp": [2e8]}, busy=0.0)
    fixed = reprobe(local, "compute")
    assert fixed.peak_flops["float32"] == local.peak_flops["float32"] == 1e11
    assert "peak_flops.float32" not in fixed.measured  # a slower run does not become the figure's record
    assert reprobe(local, "exp").exp_rate_per_s == local.exp_rate_per_s == 1e9


def test_only_the_bound_is_measured(fake, local):
    log = fake({"exp": [4e9]}, busy=0.0)
    fixed = reprobe(local, "exp")
    assert set(log.read_text().split()) == {"exp"} and fixed.exp_rate_per_s == 4e9
    assert fixed.memory_bandwidth_gbs == local.memory_bandwidth_gbs


def test_a_quiet_reprobe_makes_a_provisional_spec_trusted(fake, local):
    busy_fma = local.measured["memory_bandwidth_gbs"].model_copy(update={"busy_cores": 1.8, "runs": 3})
    provisional = local.model_copy(update={"provisional": "peak_flops.float32 probed under load",
                                           "measured": {"peak_flops.float32": busy_fma}})
    fake({"fma": [2e11]}, busy=0.0)
    fixed = reprobe(provisional, "compute")
    assert fixed.provisional is None and load_spec(local.fingerprint) == fixed


def test_another_machines_spec_is_corrected_but_not_cached(fake, tiny_spec, ksearch_home):
    fake({"stream": [50.0]}, busy=0.0)
    assert reprobe(tiny_spec, "memory").memory_bandwidth_gbs == 50.0  # tiny_spec's fingerprint is no machine's
    assert not (ksearch_home / "hardware" / f"{tiny_spec.fingerprint}.json").exists()


def test_a_gpu_ceiling_is_raised_to_the_datasheet(tiny_spec):
    h200 = tiny_spec.model_copy(update={"kind": "gpu", "model": "NVIDIA H200", "memory_bandwidth_gbs": 40.0,
                                        "peak_flops": {"float32": 1e12}, "exp_rate_per_s": 1e10})
    fixed = reprobe(h200, "memory")
    assert fixed.memory_bandwidth_gbs == 4800 and "datasheet" in fixed.source_of("memory_bandwidth_gbs")
    assert fixed.peak_flops == h200.peak_flops
    assert reprobe(h200, "compute").peak_flops["float32"] == 67e12
    assert reprobe(h200, "exp").exp_rate_per_s == pytest.approx(4.1875e12)
    fast = h200.model_copy(update={"memory_bandwidth_gbs": 5000.0})
    assert reprobe(fast, "memory") == fast  # never lowered to the datasheet
    unknown = h200.model_copy(update={"model": "Some Future GPU"})
    assert reprobe(unknown, "memory") == unknown


def test_an_unknown_bound_is_refused(tiny_spec):
    with pytest.raises(ValueError, match="'bandwidth'"):
        reprobe(tiny_spec, "bandwidth")
