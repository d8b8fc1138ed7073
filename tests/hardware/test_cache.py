import pytest

from ksearch import config
from ksearch.errors import HardwareError
from ksearch.hardware import cache, local
from ksearch.hardware.cache import home_dir, load_or_measure, load_spec, save_spec, spec_path


def test_home_dir_reads_ksearch_home(ksearch_home, monkeypatch):
    assert home_dir() == ksearch_home
    monkeypatch.delenv("KSEARCH_HOME")
    assert home_dir().parts[-2:] == (".cache", "ksearch")


def test_round_trip(ksearch_home, tiny_spec):
    path = save_spec(tiny_spec)
    assert path == ksearch_home / "hardware" / "0123456789abcdef.json"
    assert load_spec("0123456789abcdef") == tiny_spec
    assert load_spec("ffffffffffffffff") is None


def test_corrupt_file_is_a_miss(ksearch_home, tiny_spec):
    save_spec(tiny_spec)
    spec_path("0123456789abcdef").write_text("{not json")
    assert load_spec("0123456789abcdef") is None


def test_save_needs_a_fingerprint(ksearch_home, tiny_spec):
    with pytest.raises(HardwareError, match="tiny"):
        save_spec(tiny_spec.model_copy(update={"fingerprint": None}))


def test_load_or_measure_uses_the_cache(ksearch_home, tiny_spec, monkeypatch):
    calls = []

    def fake_measure(**kwargs):
        calls.append(kwargs)
        return tiny_spec.model_copy(update={"fingerprint": cache.current_fingerprint()})

    monkeypatch.setattr(cache, "measure_local_spec", fake_measure)
    first = load_or_measure()
    assert load_or_measure() == first and len(calls) == 1
    load_or_measure(refresh=True)
    assert len(calls) == 2
    assert cache.cached_local_spec() == first


def test_fingerprint_depends_on_compiler():
    info = local.detect_cpu()
    assert local.local_fingerprint(info, "gcc 12") != local.local_fingerprint(info, "gcc 13")


def test_cache_dir_comes_from_config(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "home_dir", lambda: tmp_path / "from-config")
    assert home_dir() == tmp_path / "from-config"
    assert spec_path("ab") == tmp_path / "from-config" / "hardware" / "ab.json"


def _gpu(monkeypatch, tiny_spec, bandwidth):
    from ksearch.hardware import gpu

    facts = {"name": "NVIDIA H200", "cc": "90", "sms": 132, "driver": 1, "runtime": 1}
    spec = tiny_spec.model_copy(update={"kind": "gpu", "model": "NVIDIA H200", "memory_bandwidth_gbs": bandwidth,
                                        "peak_flops": {"float32": 6e13}, "exp_rate_per_s": 4e12,
                                        "fingerprint": gpu.gpu_fingerprint(facts)})
    monkeypatch.setattr(gpu, "gpu_facts", lambda: facts)
    monkeypatch.setattr(gpu, "measure_gpu_spec", lambda: spec)
    monkeypatch.setattr(cache, "_provisional", {})
    return gpu, spec


def test_a_gpu_spec_outside_its_datasheet_range_is_not_cached(ksearch_home, tiny_spec, monkeypatch):
    gpu, spec = _gpu(monkeypatch, tiny_spec, bandwidth=50.0)  # an H200 streams ~4000 GB/s, not 50
    got = gpu.load_or_measure_gpu()
    assert got.provisional and "memory_bandwidth_gbs 50 is below 1200" in got.provisional
    assert load_spec(spec.fingerprint) is None
    assert gpu.load_or_measure_gpu().provisional == got.provisional  # kept for this process


def test_a_plausible_gpu_spec_is_cached(ksearch_home, tiny_spec, monkeypatch):
    gpu, spec = _gpu(monkeypatch, tiny_spec, bandwidth=4000.0)
    assert gpu.load_or_measure_gpu().provisional is None and load_spec(spec.fingerprint) == spec
