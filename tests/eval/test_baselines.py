"""Tests for ksearch.eval.baselines: how a task's Python baselines are checked and timed, and how they fail."""

from __future__ import annotations

import dataclasses

import pytest

from ksearch.errors import TaskError
from ksearch.eval.baselines import time_baseline
from ksearch.eval.evaluator import EvalConfig
from ksearch.protocol import TimingPlan
from ksearch.records import Status
from ksearch.tasks.loader import load_task

CALLS: list[int] = []  # the counted baseline's calls of run

# the selective-scan baseline, counting its calls here; after the first (checked) call run returns RETURN
_COUNTED = '''
import tests.eval.test_baselines as _test
RETURN = None
{real}
_real_run = run


def run(**inputs):
    _test.CALLS.append(1)
    return _real_run(**inputs) if len(_test.CALLS) == 1 else RETURN
'''


def _task(source: str):
    CALLS.clear()
    task = load_task("selective-scan")
    real = task.baseline_sources["numpy-token-loop"]
    return dataclasses.replace(task, baseline_sources={"b": source.replace("{real}", real)})


def test_a_baseline_without_prepare_runs_once_checked_then_repeats_and_its_return_is_no_time():
    # the checked call is the warm-up (no extra untimed call), and what run returns after it (a scalar output's
    # value, here 1e6) is never taken for device milliseconds
    task = _task(_COUNTED.replace("RETURN = None", "RETURN = 1.0e6"))
    r = time_baseline(task, "b", "tiny", plan=TimingPlan(min_repeats=3, max_repeats=3, min_time_s=0))
    assert r.status is Status.PASSED and r.repeats == 3 and r.median_ms < 1e3, r
    assert len(CALLS) == 1 + 3


@pytest.mark.parametrize("returned", ["0.0", "-1.0", "float('nan')", "True", "'1 ms'"])
def test_a_prepared_call_returning_no_device_time_is_a_runtime_error(returned):
    src = _COUNTED + f"\n\ndef prepare(**inputs):\n    return lambda: {returned}\n"
    r = time_baseline(_task(src), "b", "tiny")
    assert r.status is Status.RUNTIME_ERROR and "call() returned" in r.message and r.median_ms is None, r


def test_a_baseline_failing_while_it_runs_is_a_runtime_error_not_an_exception():
    for where in ("prepare", "call", "run"):
        src = _COUNTED + (
            "\n\ndef prepare(**inputs):\n    raise RuntimeError('CUDA out of memory')\n" if where == "prepare" else
            "\n\ndef prepare(**inputs):\n    def call():\n        raise RuntimeError('CUDA out of memory')\n"
            "    return call\n" if where == "call" else
            "\n\ndef run(**inputs):\n    raise RuntimeError('CUDA out of memory')\n")
        r = time_baseline(_task(src), "b", "tiny")
        assert r.status is Status.RUNTIME_ERROR and "RuntimeError: CUDA out of memory" in r.message, (where, r)


def test_a_prepared_call_returning_device_ms_is_the_time():
    src = _COUNTED + "\n\ndef prepare(**inputs):\n    return lambda: 0.25\n"
    r = time_baseline(_task(src), "b", "tiny", plan=TimingPlan(min_repeats=2, max_repeats=2, min_time_s=0))
    assert r.status is Status.PASSED and r.median_ms == 0.25 and r.repeats == 2, r


def test_a_baseline_that_does_not_load_is_a_task_error():
    with pytest.raises(TaskError, match="does not load: ZeroDivisionError"):
        time_baseline(_task("1 / 0\n"), "b", "tiny")


def test_an_evaluators_cached_inputs_and_reference_are_used_not_recomputed(monkeypatch):
    import ksearch.eval.baselines as baselines
    from ksearch.tasks.inputs import make_inputs
    from ksearch.tasks.reference import run_reference

    task = load_task("selective-scan")
    wl = task.workload("tiny")

    class Cases:  # what the final stage's Evaluator offers
        calls = 0
        config = EvalConfig()

        def inputs(self, workload, seed):
            Cases.calls += 1
            return make_inputs(task.definition, workload, seed), None

        def reference(self, workload, seed, inputs):
            Cases.calls += 1
            return run_reference(task.definition, inputs)

    def no_reference(*a, **k):
        raise AssertionError("the reference was recomputed")
    monkeypatch.setattr(baselines, "run_reference", no_reference)
    r = time_baseline(task, "numpy-token-loop", wl.name, seed=3, plan=TimingPlan(min_repeats=1, max_repeats=1, min_time_s=0), cases=Cases())
    assert r.status is Status.PASSED and Cases.calls == 2


def test_a_baseline_repeats_by_the_runs_timing_plan():
    """As candidates are repeated (TimingPlan.done): a 30 us device-timed baseline runs to the plan's repeat cap
    (three fixed repeats had left its median to chance); a slow one stops once the time budget is spent with three
    repeats."""
    fast = _COUNTED + "\n\ndef prepare(**inputs):\n    return lambda: 0.03\n"
    assert time_baseline(_task(fast), "b", "tiny").repeats == TimingPlan().max_repeats
    slow = _COUNTED + ("\n\nimport time\n\n\ndef run_slow():\n    time.sleep(0.05)\n\n\n"
                       "def prepare(**inputs):\n    return run_slow\n")
    plan = TimingPlan(min_repeats=10, min_time_s=1.0, max_time_s=0.1)
    r = time_baseline(_task(slow), "b", "tiny", plan=plan)
    assert r.status is Status.PASSED and r.repeats == 3, r


def test_a_baseline_that_hangs_in_the_final_stage_is_a_runtime_error_after_the_task_code_limit():
    """The task's own torch reference is timed as the `reference` baseline: one that hangs must not hang the run's
    final stage (the limit is the judge's, `EvalConfig.task_limit_s`)."""
    from ksearch.tasks.inputs import make_inputs
    from ksearch.tasks.reference import run_reference

    task = _task(_COUNTED + "\n\ndef prepare(**inputs):\n    def call():\n        while True:\n            pass\n"
                            "    return call\n")

    class Cases:
        config = EvalConfig(reference_timeout_s=0.3)

        def inputs(self, workload, seed):
            return make_inputs(task.definition, workload, seed), None

        def reference(self, workload, seed, inputs):
            return run_reference(task.definition, inputs)

    r = time_baseline(task, "b", "tiny", cases=Cases())
    assert r.status is Status.RUNTIME_ERROR and r.message == "baseline 'b': did not finish in 0.3 s", r
