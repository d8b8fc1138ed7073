"""Issue 18's failure, end to end: honest memory-bound kernels (a ReLU, a vector add) judged against a spec whose
bandwidth was poisoned (probed under load, 1000s of times too low) must end PASSED, not REJECTED as "faster than
the roofline floor": the judge re-probes the ceiling that set the floor before it rejects (`reprobe`)."""

from __future__ import annotations

import importlib
import shutil

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Status
from ksearch.tasks import load_task

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler 'cc' on PATH")

QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)
N_AXIS = "  n: {type: var, description: elements, min: 1, max: 16777216}\n"
TASKS = {
    "relu": ("""name: relu
axes:
""" + N_AXIS + """inputs:
  x: {shape: [n], dtype: float32, distribution: {kind: normal, mean: 0, std: 1}}
outputs:
  y: {shape: [n], dtype: float32}
tolerance:
  float32: {rtol: 1.0e-6, atol: 1.0e-6}
reference_backend: numpy
reference: |
  import numpy as np


  def run(x):
      return np.maximum(np.asarray(x, np.float64), 0.0)
""", """#include <stdint.h>
void run(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""),
    "vadd": ("""name: vadd
axes:
""" + N_AXIS + """inputs:
  a: {shape: [n], dtype: float32, distribution: {kind: normal, mean: 0, std: 1}}
  b: {shape: [n], dtype: float32, distribution: {kind: normal, mean: 0, std: 1}}
outputs:
  c: {shape: [n], dtype: float32}
tolerance:
  float32: {rtol: 1.0e-6, atol: 1.0e-6}
cost:
  flops: "n"
reference_backend: numpy
reference: |
  import numpy as np


  def run(a, b):
      return np.asarray(a, np.float64) + np.asarray(b, np.float64)
""", """#include <stdint.h>
void run(const float *a, const float *b, float *c, int64_t n) {
    for (int64_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}
"""),
}
WORKLOADS = ('{"name": "small", "purpose": "check", "axes": {"n": 4096}, "inputs": {}}\n'
             '{"name": "large", "purpose": "check", "axes": {"n": 4194304}, "inputs": {}}\n')


def _task(root, name):
    d = root / name
    d.mkdir()
    definition, naive = TASKS[name]
    (d / "definition.yaml").write_text(definition)
    (d / "workloads.jsonl").write_text(WORKLOADS)
    (d / "naive.cpu.c").write_text(naive)
    return load_task(d)


@needs_cc
@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_honest_kernel_is_rejected_against_the_poisoned_spec_without_a_reprobe(tmp_path, tiny_spec, name,
                                                                                    monkeypatch):
    """The failure as reported (the judge's floor check with the re-probe taken out): this is what the spec does."""
    import ksearch.eval.evaluator as evaluator_module

    monkeypatch.setenv("KSEARCH_BUSY_WAIT_S", "0")
    for module in (importlib.import_module("ksearch.hardware.reprobe"), evaluator_module):
        if hasattr(module, "reprobe"):
            monkeypatch.setattr(module, "reprobe", lambda spec, bound, **kw: spec)
    poisoned = tiny_spec.model_copy(update={"memory_bandwidth_gbs": 0.005})
    ev = Evaluator(_task(tmp_path, name), hardware=poisoned, config=EvalConfig(seeds=[1, 2], timing=QUICK))
    res = ev.measure_naive(ev.task.workloads)
    assert res.status is Status.REJECTED and "faster than the roofline floor" in res.message, res.message


@needs_cc
@pytest.mark.parametrize("name", sorted(TASKS))
def test_an_honest_kernel_passes_against_a_poisoned_spec_once_the_judge_reprobes(tmp_path, tiny_spec, name,
                                                                                  monkeypatch):
    monkeypatch.setenv("KSEARCH_BUSY_WAIT_S", "0")  # the machine is shared: no waiting for it in a test
    poisoned = tiny_spec.model_copy(update={"memory_bandwidth_gbs": 0.005})  # 8 MB -> a floor of 1.6 s
    ev = Evaluator(_task(tmp_path, name), hardware=poisoned, config=EvalConfig(seeds=[1, 2], timing=QUICK))
    res = ev.measure_naive(ev.task.workloads)
    assert res.status is Status.PASSED, res.message
    for r in res.workloads:
        assert r.status is Status.PASSED and r.pct_of_floor is not None, r
        # at or above the corrected floor, or (a call of ~1 us on a busy machine) too short for the controller's
        # clock and within its noise of that floor: the judge says so and holds nothing against it
        assert r.pct_of_floor <= 100 or (r.resolved is False and "within the controller clock's noise" in r.message), r
    assert ev.hardware.memory_bandwidth_gbs > 1.0  # the judge's spec was corrected


@needs_cc
def test_a_time_the_clock_cannot_resolve_is_judged_against_the_corrected_floor_within_its_noise(tmp_path, tiny_spec,
                                                                                              monkeypatch):
    """CI's case: on a busy machine a ~1 us call reads as 1 ns once the empty round trip is taken off. Against the
    poisoned floor that is a suspect time; once the ceiling is re-probed, the gap to the new floor is within the
    controller clock's noise, and the kernel passes with that said (it was re-verified and rejected before)."""
    import ksearch.eval.timing as timing

    monkeypatch.setenv("KSEARCH_BUSY_WAIT_S", "0")
    monkeypatch.setattr(timing, "decided_ms", lambda host_ms, empty_ms, waits_ms=0.0: 1e-6)
    poisoned = tiny_spec.model_copy(update={"memory_bandwidth_gbs": 0.005})
    ev = Evaluator(_task(tmp_path, "relu"), hardware=poisoned, config=EvalConfig(seeds=[1, 2], timing=QUICK))
    small = [w for w in ev.task.workloads if w.label == "small"]
    res = ev.measure_naive(small)
    assert res.status is Status.PASSED, res.message
    (r,) = res.workloads
    assert r.resolved is False and r.pct_of_floor > 100, r
    assert "measured again" in r.message and "within the controller clock's noise" in r.message, r.message
