import json

import pytest
import yaml
from typer.testing import CliRunner

from ksearch.cli_hardware import app
from ksearch.errors import HardwareError
from ksearch.hardware import catalog
from ksearch.hardware.roofline import roofline
from ksearch.hardware.spec import HardwareSpec

runner = CliRunner()

REQUIRED_ENTRIES = [
    "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm", "h100-pcie", "h200", "b200",
    "m1", "m1-pro", "m1-max", "m1-ultra", "m2", "m2-pro", "m2-max", "m2-ultra",
    "m3", "m3-pro", "m3-max", "m4", "m4-pro", "m4-max",
]


def test_required_entries_present():
    names = {e.name for e in catalog.entries()}
    assert set(REQUIRED_ENTRIES) <= names


@pytest.mark.parametrize("entry", catalog.entries(), ids=lambda e: e.name)
def test_every_figure_is_sourced_or_explained(entry):
    assert set(catalog.REQUIRED) <= set(entry.figures)
    for key, fig in entry.figures.items():
        assert key in catalog.FIGURES
        if fig.value is None:
            assert fig.note and fig.note.strip(), f"{entry.name}.{key}: null without a note"
        else:
            assert fig.source and fig.source.strip(), f"{entry.name}.{key}: unsourced"
            assert fig.value > 0


def test_every_source_key_in_the_yaml_is_defined():
    # a source key that names no entry of `sources` is an error at load time, not a silent literal
    for path in catalog.CATALOG_DIR.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        for key, src in data["sources"].items():
            assert src["title"], (path.name, key)


def test_unsourced_figure_is_rejected():
    with pytest.raises(ValueError, match="no source"):
        catalog.Figure(value=1.0)
    with pytest.raises(ValueError, match="note"):
        catalog.Figure(value=None)
    catalog.Figure(value=None, note="not published")


def test_unknown_source_key_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({
        "vendor": "X", "sources": {}, "entries": [{"name": "x1", "model": "X1", "figures": {
            "memory_bandwidth_gbs": {"value": 1, "source": "nowhere"}}}]}))
    with pytest.raises(HardwareError, match="unknown source key 'nowhere'"):
        catalog._load_file(tmp_path / "x.yaml")


def test_names_are_case_insensitive_with_aliases():
    for name in ("h100", "H100-SXM", "h100_sxm5", "NVIDIA H100 SXM"):
        assert catalog.get(name).name == "h100-sxm"
    assert catalog.get("m2-max").name == "m2-max"
    assert catalog.get("Apple-M2-Max").name == "m2-max"
    assert catalog.get("A100").name == "a100-sxm4-40gb"


def test_unknown_name_names_close_matches():
    with pytest.raises(HardwareError, match="h100-sxm"):
        catalog.get("h10")
    assert "m2-max" in catalog.close_matches("m2-mx")


def test_limits_h100():
    lim = catalog.limits("h100")
    assert lim.shared_memory_per_block_bytes == 48 * 1024
    assert lim.shared_memory_per_block_optin_bytes == 227 * 1024
    assert lim.max_threads_per_block == 1024
    assert lim.simd_width == 32
    assert lim.memory_bandwidth_gbs == 3350


@pytest.mark.parametrize("name", ["m1-max", "m2-max", "m4"])
def test_limits_apple(name):
    lim = catalog.limits(name)
    assert lim.shared_memory_per_block_bytes == 32768
    assert lim.shared_memory_per_block_optin_bytes == 32768
    assert lim.simd_width == 32
    assert lim.max_threads_per_block == 1024


def test_apple_unpublished_figures_are_null():
    e = catalog.get("m1-max")
    assert e.value("exp_rate_per_s") is None and e.figures["exp_rate_per_s"].note
    assert e.value("peak_flops.float64") is None


def test_derived_figures_say_from_what():
    h100 = catalog.get("h100")
    assert "16 exp2/clock/SM" in h100.figures["exp_rate_per_s"].derived
    assert "derived:" in h100.source_of("exp_rate_per_s")
    # 16 exp/clock/SM x SMs x clock, the clock implied by FP32 = SMs x 128 x 2 x clock
    assert h100.value("exp_rate_per_s") == pytest.approx(h100.value("peak_flops.float32") / 16)
    a100 = catalog.get("a100")
    assert a100.value("exp_rate_per_s") == pytest.approx(16 * 108 * 1.41e9)


@pytest.mark.parametrize("entry", [e for e in catalog.entries() if e.value("cores")], ids=lambda e: e.name)
def test_to_spec_keeps_sources(entry):
    spec = catalog.to_spec(entry.name)
    assert isinstance(spec, HardwareSpec)
    assert spec.peak_flops["float32"] == entry.value("peak_flops.float32")
    assert any(w in spec.source_of("memory_bandwidth_gbs") for w in ("datasheet", "Newsroom", "specifications",
                                                                        "AnandTech"))  # a public document
    assert spec.source_of("peak_flops.float32") == entry.source_of("peak_flops.float32")
    HardwareSpec.model_validate_json(spec.model_dump_json())  # round-trips


def test_to_spec_feeds_the_roofline():
    spec = catalog.to_spec("h200")
    r = roofline(4.8e9, 0, 4.1875e12, spec)
    assert r.memory_s == pytest.approx(1e-3) and r.exp_s == pytest.approx(1.0) and r.bound == "exp"
    assert catalog.to_spec("m1-max").exp_rate_per_s is None


def test_to_spec_without_core_count_is_a_clean_error():
    with pytest.raises(HardwareError, match="b200.*cores"):
        catalog.to_spec("b200")


# --- CLI ---------------------------------------------------------------------------------------------------------


def test_list_shows_catalog_and_local_cpu(ksearch_home):
    result = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for text in ("h100-sxm", "m2-max", "b200", "local devices", "cpu"):
        assert text in result.stdout


def test_list_json(ksearch_home):
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    names = {e["name"] for e in data["catalog"]}
    assert set(REQUIRED_ENTRIES) <= names
    h100 = next(e for e in data["catalog"] if e["name"] == "h100-sxm")
    assert h100["figures"]["memory_bandwidth_gbs"] == 3350
    assert data["local"][0]["kind"] == "cpu"


def test_list_uses_the_cached_cpu_spec(ksearch_home, tiny_spec):
    from ksearch.hardware import cache

    cache.save_spec(tiny_spec.model_copy(update={"fingerprint": cache.current_fingerprint()}))
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    local = json.loads(result.stdout)["local"][0]
    assert local["measured"] and local["spec"]["memory_bandwidth_gbs"] == 10.0


@pytest.mark.parametrize("alias", ["h100", "H100-SXM", "h100-sxm5"])
def test_show_name_json_with_aliases(alias):
    result = runner.invoke(app, ["show", alias, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["name"] == "h100-sxm"
    assert data["figures"]["shared_memory_per_block_optin_bytes"]["value"] == 232448
    assert "CUDA C++ Programming Guide" in data["figures"]["shared_memory_per_block_optin_bytes"]["source"]


def test_show_name_table_has_sources():
    result = runner.invoke(app, ["show", "m2-max"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for text in ("m2-max", "400 GB/s", "Metal Feature Set Tables", "unknown", "exp_rate_per_s"):
        assert text in result.stdout


def test_show_unknown_name_is_one_line_and_exit_2():
    result = runner.invoke(app, ["show", "h10"], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert "unknown hardware 'h10'" in result.output and "h100-sxm" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_show_name_with_gpu_flag_is_refused():
    result = runner.invoke(app, ["show", "h100", "--gpu"])
    assert result.exit_code == 2


def test_device_names_as_the_driver_reports_them_find_their_entries():
    """cudaGetDeviceProperties names (what the measured spec's model holds): the tensor-core peaks the roofline
    takes from the catalog depend on finding them."""
    from ksearch.hardware import catalog

    assert catalog.find("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert catalog.find("NVIDIA H200").name == "h200"
    assert catalog.find("NVIDIA A100-SXM4-80GB").name == "a100-sxm4-80gb"
    assert catalog.find("NVIDIA H200 NVL") is None  # another part (lower clocks and peaks): not the SXM entry
