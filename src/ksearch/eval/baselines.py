"""Time a task's Python baselines (trusted code, e.g. a NumPy token-by-token loop) beside the candidates.

Baselines run in this process: they are part of the task, not candidates. Their outputs are still checked
against the reference so that a speedup is always measured against a correct implementation.
"""

from __future__ import annotations

import time

import numpy as np

from ksearch.errors import TaskError
from ksearch.eval.compare import compare
from ksearch.eval.records import Status, WorkloadResult
from ksearch.eval.stats import summarize_times
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.loader import Task
from ksearch.tasks.reference import run_reference


def load_baseline(task: Task, name: str):
    """The ``run`` function of a task's baseline. Raises TaskError for an unknown or broken baseline."""
    if name not in task.baseline_sources:
        raise TaskError(f"task {task.name!r} has no baseline {name!r}; known: {sorted(task.baseline_sources)}")
    namespace: dict = {}
    try:
        exec(compile(task.baseline_sources[name], f"<baseline {name}>", "exec"), namespace)  # noqa: S102
    except Exception as e:
        raise TaskError(f"baseline {name!r} of {task.name!r} does not load: {type(e).__name__}: {e}") from None
    return namespace["run"]


def time_baseline(task: Task, name: str, workload: str, seed: int = 0, repeats: int = 3,
                  max_time_s: float = 20.0) -> WorkloadResult:
    """Median wall time (ms) of a baseline on one workload, after one checked warm-up call.

    Stops repeating once ``max_time_s`` is spent (at least one timed call). The warm-up call's outputs are
    compared with the reference; a wrong baseline is reported as INCORRECT_NUMERICAL, not timed.
    """
    run = load_baseline(task, name)
    d = task.definition
    wl = task.workload(workload)
    inputs = make_inputs(d, wl, seed)
    result = WorkloadResult(workload=wl.label, status=Status.PASSED)
    outs = run(**inputs)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    want = run_reference(d, inputs)
    for (oname, spec), got in zip(d.outputs.items(), outs):
        status, a, r, msg = compare(np.asarray(got, np.float64), want[oname], d.tolerance_for(spec.dtype))
        result.max_abs_err = max(result.max_abs_err or 0.0, a)
        result.max_rel_err = max(result.max_rel_err or 0.0, r)
        if status is not Status.PASSED:
            result.status, result.message = status, f"output {oname!r}: {msg}"
            return result
    result.checks = 1
    times: list[float] = []
    t_end = time.perf_counter() + max_time_s
    while len(times) < repeats and (not times or time.perf_counter() < t_end):
        t0 = time.perf_counter_ns()
        run(**inputs)
        times.append((time.perf_counter_ns() - t0) * 1e-6)
    stats = summarize_times(times)
    result.median_ms, result.min_ms, result.spread, result.repeats = stats.median_ms, stats.min_ms, stats.spread, stats.n
    return result
