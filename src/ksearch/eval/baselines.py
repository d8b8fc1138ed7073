"""Time a task's Python baselines (trusted code, e.g. a NumPy token-by-token loop, or a framework's fused kernel
such as torch's scaled_dot_product_attention) beside the candidates.

Baselines run in this process: they are part of the task, not candidates. Their outputs are still checked
against the reference so that a speedup is always measured against a correct implementation. A baseline module
defines ``run(**inputs) -> outputs`` (NumPy in and out: checked) and may define ``prepare(**inputs) -> call``: a
zero-argument callable that computes the same outputs on data already where the baseline keeps it (e.g. a GPU)
and returns once the device is done; then ``call`` is what is timed, so a GPU baseline is not charged for its
host-device copies. ``call`` may return its own device time in ms (CUDA events around the kernel, as the
candidates are timed), which then replaces the host wall clock (that would add launch and synchronization);
None: the host wall clock is the time. A baseline whose dependencies are missing raises ``BaselineUnavailable``
(say why); one that fails while it runs is a RUNTIME_ERROR of that workload, not an exception. The module sees
``BaselineUnavailable``, ``BaselineNotForTarget`` (its subclass for a baseline meant for other targets' runs),
``CONST_AXES`` (the definition's const axes: name -> value), ``TARGET`` (the run's target, for messages) and what
that target answers for baselines (`ksearch.targets.base.Target`): ``TORCH_DEVICE`` (the torch device a framework
baseline runs on: ``cuda`` where the run's kernels run on an NVIDIA GPU, else ``cpu``) and ``RUNS_MLX`` (whether
the run's kernels run through MLX), plus ``TORCH_SPIN`` (`ksearch.targets.gpu_timing.torch_spin`: the judge's GPU
launch cover, for a baseline timed by CUDA events as the candidates are) as globals: a baseline is task data and
imports nothing above ``ksearch.tasks``.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import TYPE_CHECKING

import numpy as np

from ksearch.errors import BaselineNotForTarget, BaselineUnavailable, TargetError, TaskError
from ksearch.eval.compare import compare
from ksearch.protocol import TimingPlan
from ksearch.records import Status, WorkloadResult
from ksearch.eval.stats import summarize_times
from ksearch.targets import get_target, resolve_target
from ksearch.targets.base import aliases
from ksearch.targets.gpu_timing import torch_spin
from ksearch.tasks.guard import TimeUp, time_limit
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.loader import Task
from ksearch.tasks.reference import run_reference

if TYPE_CHECKING:
    from ksearch.eval.evaluator import Evaluator


def load_baseline_module(task: Task, name: str, target: str = "cpu") -> dict:
    """The namespace of a task's baseline (``run``, optionally ``prepare``); ``target``: the run's target, which
    the module sees as ``TARGET`` with its answers ``TORCH_DEVICE`` and ``RUNS_MLX`` (a baseline with a GPU path
    takes it only where the run's kernels run on the GPU, so a cpu run is compared with a CPU baseline). Raises
    TaskError for an unknown or broken baseline or an unknown target, BaselineUnavailable (from the module) when it
    cannot run here, or when ``target`` is an alias with nothing to stand for here."""
    if name not in task.baseline_sources:
        raise TaskError(f"task {task.name!r} has no baseline {name!r}; known: {sorted(task.baseline_sources)}")
    try:
        t = get_target(resolve_target(target))
    except TargetError as e:
        if target in aliases():
            raise BaselineUnavailable(str(e)) from None
        raise TaskError(str(e)) from None
    namespace: dict = {}
    namespace["BaselineUnavailable"] = BaselineUnavailable
    namespace["BaselineNotForTarget"] = BaselineNotForTarget
    # the definition's const axes (e.g. attention's causal), so one baseline file can serve sibling tasks
    namespace["CONST_AXES"] = {n: a.value for n, a in task.definition.axes.items() if a.type == "const"}
    namespace["TARGET"] = target
    namespace["TORCH_DEVICE"] = t.torch_device
    namespace["RUNS_MLX"] = t.runs_mlx
    namespace["TORCH_SPIN"] = torch_spin
    try:
        exec(compile(task.baseline_sources[name], f"<baseline {name}>", "exec"), namespace)  # noqa: S102
    except BaselineUnavailable:
        raise
    except Exception as e:
        raise TaskError(f"baseline {name!r} of {task.name!r} does not load: {type(e).__name__}: {e}") from None
    return namespace


def load_baseline(task: Task, name: str):
    """The ``run`` function of a task's baseline. Raises TaskError for an unknown or broken baseline."""
    return load_baseline_module(task, name)["run"]


def time_baseline(task: Task, name: str, workload: str, seed: int = 0, target: str = "cpu",
                  cases: Evaluator | None = None, plan: TimingPlan | None = None) -> WorkloadResult:
    """Median time (ms) of a baseline on one workload, after one checked warm-up call: the host wall clock, or
    the device ms that ``prepare``'s call returns.

    Repeats as the judge repeats a candidate, by ``plan`` (the run's TimingPlan; the default one if None):
    ``TimingPlan.done`` on the timed calls. A fixed three repeats had left a 30 us GPU baseline's median to
    chance beside the candidates' up to 50. The warm-up call's outputs are
    compared with the reference; a wrong baseline is reported as INCORRECT_NUMERICAL, not timed. A baseline that
    raises while it runs (a torch error, a GPU out of memory) or whose call returns something other than None or
    a device time > 0 is RUNTIME_ERROR, with the reason: the run's final stage goes on.

    ``cases``: an Evaluator whose cached inputs and reference outputs for (workload, seed) are used (the run's
    final stage has just computed them for the naive and best kernels; a float64 reference at L 16k takes tens
    of seconds), else they are made here.

    Raises:
        TaskError: an unknown or broken (not loading) baseline, or an unknown workload.
        BaselineUnavailable: the baseline cannot run here (from its module, its ``prepare`` or its ``run``).
    """
    module = load_baseline_module(task, name, target)
    wl = task.workload(workload)
    result = WorkloadResult(workload=wl.label, status=Status.PASSED)
    limit = cases.config.task_limit_s() if cases is not None else None  # task code, as the reference is
    token = None
    try:
        if cases is not None:  # an Evaluator: its cached inputs and float64 reference for (workload, seed)
            inputs = cases.inputs(wl, seed)[0]
            want = cases.reference(wl, seed, inputs)
        else:
            inputs = make_inputs(task.definition, wl, seed)
            want = None
        with time_limit(limit) as token:
            _check_and_time(task, module, inputs, result, plan or TimingPlan(), want)
    except BaselineUnavailable:
        raise
    except TimeUp as e:  # a hung baseline (the task's own torch reference, timed) must not hang the final stage
        if e.args[0] is not token:
            raise
        result.status, result.message = Status.RUNTIME_ERROR, f"baseline {name!r}: did not finish in {limit:g} s"
    except Exception as e:  # a failing baseline must not cost the run its final measurements
        result.status, result.message = Status.RUNTIME_ERROR, f"baseline {name!r}: {type(e).__name__}: {e}"
    return result


def _check_and_time(task: Task, module: dict, inputs: dict, result: WorkloadResult, plan: TimingPlan,
                    want: dict | None = None) -> None:
    """time_baseline's work, filling ``result`` in place (``want``: the reference outputs, if already known)."""
    run = module["run"]
    d = task.definition
    outs = run(**inputs)
    outs = [outs[n] for n in d.outputs] if isinstance(outs, dict) else outs  # by output name, as a reference may
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    want = want if want is not None else run_reference(d, inputs)
    for (oname, spec), got in zip(d.outputs.items(), outs):
        status, a, r, msg = compare(np.asarray(got, np.float64), want[oname], d.tolerance_for(spec.dtype))
        result.max_abs_err = max(result.max_abs_err or 0.0, a)
        result.max_rel_err = max(result.max_rel_err or 0.0, r)
        if status is not Status.PASSED:
            result.status, result.message = status, f"output {oname!r}: {msg}"
            return
    result.checks = 1
    if "prepare" in module:
        call = module["prepare"](**inputs)
        call()  # warm-up (a GPU baseline's first call picks and loads its kernel)
    else:  # the checked call was the warm-up; run returns outputs, never a time (a scalar output is not ms)
        def call():
            run(**inputs)
    times: list[float] = []
    while not times or not plan.done(len(times), sum(times) * 1e-3):
        t0 = time.perf_counter_ns()
        device_ms = call()
        wall_ms = (time.perf_counter_ns() - t0) * 1e-6
        if device_ms is None:
            times.append(wall_ms)
        elif isinstance(device_ms, numbers.Real) and not isinstance(device_ms, bool) and 0 < float(device_ms) < math.inf:
            times.append(float(device_ms))
        else:
            raise ValueError(f"call() returned {device_ms!r}: not None (host clock) or a device time in ms > 0")
    stats = summarize_times(times)
    result.median_ms, result.min_ms, result.spread = stats.median_ms, stats.min_ms, stats.spread
    result.repeats = stats.n
