import pytest
from pydantic import ValidationError

from ksearch.hardware.spec import CacheLevel, HardwareSpec


def test_round_trips_through_json(tiny_spec):
    assert HardwareSpec.model_validate_json(tiny_spec.model_dump_json()) == tiny_spec


def test_gpu_catalog_entry_fits_with_a_source_per_figure():
    gpu = HardwareSpec(
        name="h100-sxm",
        kind="gpu",
        vendor="NVIDIA",
        model="H100 SXM5",
        cores=132,
        threads=132 * 2048,
        simd_width=32,
        memory_bandwidth_gbs=3350,
        peak_flops={"float32": 67e12, "bfloat16": 989e12},
        shared_memory_per_block_bytes=227 * 1024,
        max_threads_per_block=1024,
        source="https://example.com/h100-datasheet",
        sources={"peak_flops.bfloat16": "dense tensor core, datasheet"},
    )
    assert gpu.exp_rate_per_s is None and gpu.simd_isa == []
    assert gpu.source_of("peak_flops.bfloat16") == "dense tensor core, datasheet"
    assert gpu.source_of("memory_bandwidth_gbs") == "https://example.com/h100-datasheet"


def test_rejects_bad_values(tiny_spec):
    data = tiny_spec.model_dump()
    with pytest.raises(ValidationError, match="float32"):
        HardwareSpec.model_validate({**data, "peak_flops": {"float32": 0.0}})
    with pytest.raises(ValidationError, match="no_such_field"):
        HardwareSpec.model_validate({**data, "sources": {"no_such_field": "x"}})
    with pytest.raises(ValidationError):
        HardwareSpec.model_validate({**data, "kind": "tpu"})


def test_last_level_cache_skips_instruction_caches(tiny_spec):
    caches = [CacheLevel(level=1, kind="instruction", size_bytes=64), CacheLevel(level=2, size_bytes=1024)]
    assert tiny_spec.model_copy(update={"caches": caches}).last_level_cache_bytes() == 1024
    assert tiny_spec.last_level_cache_bytes() == 8 * 2**20
