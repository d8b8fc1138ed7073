import pytest

from ksearch.errors import HardwareError
from ksearch.hardware.roofline import achieved_gbs, bound, floor_s, pct_of_floor, roofline

# tiny_spec: 10 GB/s, 1e11 FLOP/s float32, 1e9 exp/s


def test_memory_bound(tiny_spec):
    r = roofline(1e9, 1e9, 0, tiny_spec)  # 0.1 s of memory, 0.01 s of compute
    assert r.memory_s == pytest.approx(0.1) and r.compute_s == pytest.approx(0.01) and r.exp_s == 0
    assert r.floor_s == pytest.approx(0.1) and r.bound == "memory"


def test_compute_bound(tiny_spec):
    assert floor_s(1e6, 1e11, 0, tiny_spec) == pytest.approx(1.0)
    assert bound(1e6, 1e11, 0, tiny_spec) == "compute"


def test_exp_bound(tiny_spec):
    assert floor_s(1e6, 1e6, 2e9, tiny_spec) == pytest.approx(2.0)
    assert bound(1e6, 1e6, 2e9, tiny_spec) == "exp"


def test_ties_go_to_memory_and_zero_work_has_zero_floor(tiny_spec):
    assert bound(1e9, 1e10, 1e8, tiny_spec) == "memory"  # 0.1 s each
    assert roofline(0, 0, 0, tiny_spec).floor_s == 0.0


def test_missing_exp_rate_drops_the_exp_term(tiny_spec):
    no_exp = tiny_spec.model_copy(update={"exp_rate_per_s": None})
    assert roofline(1e9, 0, 1e12, no_exp).bound == "memory"


def test_bad_inputs(tiny_spec):
    with pytest.raises(ValueError, match="bytes"):
        floor_s(-1, 0, 0, tiny_spec)
    with pytest.raises(ValueError, match="nan"):
        floor_s(0, float("nan"), 0, tiny_spec)
    with pytest.raises(HardwareError, match="float16"):
        floor_s(0, 1, 0, tiny_spec, dtype="float16")


def test_pct_of_floor():
    assert pct_of_floor(0.2, 0.1) == pytest.approx(50.0)
    assert pct_of_floor(0.1, 0.1) == pytest.approx(100.0)
    assert pct_of_floor(0.05, 0.1) == pytest.approx(200.0)  # faster than the floor: suspect
    with pytest.raises(ValueError, match="time_s"):
        pct_of_floor(0.0, 0.1)


def test_achieved_gbs():
    assert achieved_gbs(2e9, 0.5) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="-1"):
        achieved_gbs(1e9, -1)


def test_tensor_peak_bounds_matmul_flops_where_the_spec_has_it(tiny_spec):
    gpu = tiny_spec.model_copy(update={"kind": "gpu", "peak_flops": {"float32": 1e11, "tensor_float16": 1e12}})
    assert floor_s(1e6, 1e12, 0, gpu, dtype="tensor_float16") == pytest.approx(1.0)
    bare_gpu = tiny_spec.model_copy(update={"kind": "gpu"})  # no matrix-unit figure: no compute term, not FP32's
    assert roofline(1e6, 1e12, 0, bare_gpu, dtype="tensor_float16").compute_s == 0
    cpu = tiny_spec.model_copy(update={"kind": "cpu"})  # kernels compute in fp32 there: the FP32 peak
    assert roofline(1e6, 1e12, 0, cpu, dtype="tensor_float16").compute_s == pytest.approx(10.0)


def test_measured_gpu_spec_gains_the_catalog_tensor_peaks(tiny_spec):
    from ksearch.hardware.gpu import with_catalog_tensor_peaks

    h200 = tiny_spec.model_copy(update={"kind": "gpu", "model": "NVIDIA H200"})
    spec = with_catalog_tensor_peaks(h200)
    assert spec.peak_flops["tensor_float16"] == pytest.approx(989.5e12)
    assert spec.peak_flops["float32"] == tiny_spec.peak_flops["float32"]  # measured figures are kept
    assert "catalog" in spec.source_of("peak_flops.tensor_float16")
    unknown = tiny_spec.model_copy(update={"kind": "gpu", "model": "Some Future GPU"})
    assert with_catalog_tensor_peaks(unknown) == unknown


def test_evaluator_without_the_tasks_peak_records_no_floor_instead_of_crashing(tiny_spec):
    from types import SimpleNamespace

    from ksearch.eval.evaluator import Evaluator
    from ksearch.records import Status, WorkloadResult
    from ksearch.tasks import load_task

    task = load_task("attention-prefill")
    definition = task.definition.model_copy(update={"cost": task.definition.cost.model_copy(
        update={"flops_on": "float16"})})  # a valid key this CPU spec lacks
    said = []
    ev = SimpleNamespace(definition=definition, hardware=tiny_spec, progress=said.append)
    res = WorkloadResult(workload="mha-odd", status=Status.PASSED, median_ms=1.0)
    fill = getattr(Evaluator, "roofline_of", None) or Evaluator._roofline  # renamed by the judge's rework
    fill(ev, task.workload("mha-odd"), res)
    assert res.floor_ms is None and res.achieved_gbs > 0 and "no roofline floor" in said[0]


def _with_caches(spec):
    from ksearch.hardware.spec import CacheBandwidth

    return spec.model_copy(update={"cache_bandwidth_gbs": {  # tiny_spec's DRAM: 10 GB/s
        "L1": CacheBandwidth(level=1, gbs=400.0, working_set_bytes=32 << 10, capacity_bytes=64 << 10),
        "L2": CacheBandwidth(level=2, gbs=200.0, working_set_bytes=1 << 20, capacity_bytes=2 << 20),
        "L3": CacheBandwidth(level=3, gbs=5.0, working_set_bytes=8 << 20, capacity_bytes=32 << 20)}})


def test_a_working_set_that_fits_a_cache_gets_its_bandwidth(tiny_spec):
    from ksearch.hardware.roofline import FIT_SLACK, bandwidth_for

    spec = _with_caches(tiny_spec)
    assert bandwidth_for(spec, 4096) == (400.0, "L1")
    assert bandwidth_for(spec, FIT_SLACK * (64 << 10)) == (400.0, "L1")  # up to FIT_SLACK x the capacity
    assert bandwidth_for(spec, FIT_SLACK * (64 << 10) + 1) == (200.0, "L2")
    assert bandwidth_for(spec, 16 << 20) == (10.0, "DRAM")  # L3 measured below DRAM: never lowers the bandwidth
    assert bandwidth_for(spec, 1 << 30) == (10.0, "DRAM")
    assert bandwidth_for(tiny_spec, 4096) == (10.0, "DRAM")  # no cache figures: main memory
    with pytest.raises(ValueError, match="working_set_bytes"):
        bandwidth_for(spec, -1)


def test_roofline_takes_the_working_set_default_the_bytes_moved(tiny_spec):
    spec = _with_caches(tiny_spec)
    small = roofline(2e5, 0, 0, spec)  # 200 kB moved and touched: over 2 x L1, inside L2
    assert (small.memory_level, small.bandwidth_gbs) == ("L2", 200.0)
    assert small.memory_s == pytest.approx(2e5 / 200e9) and small.floor_s == small.memory_s
    big = roofline(1e5, 0, 0, spec, working_set_bytes=1e9)  # the same bytes out of a 1 GB working set: DRAM
    assert (big.memory_level, big.memory_s) == ("DRAM", pytest.approx(1e5 / 10e9))
    assert floor_s(1e5, 0, 0, spec, working_set_bytes=1e9) == pytest.approx(1e-5)
    assert pct_of_floor(small.floor_s, small.floor_s) == pytest.approx(100.0)
