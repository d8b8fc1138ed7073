import json

from typer.testing import CliRunner

from ksearch.cli_hardware import app
from ksearch.hardware import cache

runner = CliRunner()


def _seed(tiny_spec):
    return cache.save_spec(tiny_spec.model_copy(update={"fingerprint": cache.current_fingerprint()}))


def test_show_json_prints_the_cached_spec(ksearch_home, tiny_spec):
    _seed(tiny_spec)
    result = runner.invoke(app, ["show", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["memory_bandwidth_gbs"] == 10.0


def test_show_prints_facts_and_ceilings(ksearch_home, tiny_spec):
    _seed(tiny_spec)
    result = runner.invoke(app, ["show"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ("tiny", "avx2", "L3 unified", "memory_bandwidth_gbs", "stream_triad", "100.0 GFLOP/s"):
        assert text in result.stdout


def test_missing_compiler_is_a_clean_error(ksearch_home, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    result = runner.invoke(app, ["show"])
    assert result.exit_code == 2 and "no-such-compiler-xyz" in result.output


def test_show_says_why_a_spec_is_provisional_and_lists_cache_levels(ksearch_home, tiny_spec, monkeypatch):
    from ksearch.hardware.spec import CacheBandwidth

    spec = tiny_spec.model_copy(update={
        "provisional": "memory_bandwidth_gbs probed under load",
        "cache_bandwidth_gbs": {"L2": CacheBandwidth(level=2, gbs=321.0, working_set_bytes=1 << 20,
                                                     capacity_bytes=2 << 20)}})
    monkeypatch.setattr("ksearch.cli_hardware.cached_local_spec", lambda: spec)
    result = runner.invoke(app, ["show"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "provisional" in result.stdout and "probed under load" in result.stdout
    assert "cache_bandwidth_gbs.L2" in result.stdout and "321.0 GB/s" in result.stdout
