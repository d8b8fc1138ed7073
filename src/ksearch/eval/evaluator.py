"""The judge, first version: compile, check against the reference on fresh inputs, time, in a worker.

For each candidate: the target compiles it in this process (a compiler subprocess with a timeout); a fresh
sandboxed worker loads it; for every workload and every correctness seed the controller writes fresh inputs
(mapped read-only into the worker) and NaN-poisoned outputs to shared memory, the worker calls the kernel, and
the controller compares the outputs with the float64 reference here, never in the worker. Then the worker
times repeated calls (warm-up, caches flushed and outputs re-poisoned between repeats, median and spread), and
the outputs of the last timed call are checked again.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ksearch.eval.compare import compare
from ksearch.eval.protocol import TimingPlan
from ksearch.eval.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.eval.sandbox import Worker, WorkerDied, WorkerTimeout, describe_exit
from ksearch.eval.stats import summarize_times
from ksearch.targets import get_target
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.inputs import make_inputs, numpy_dtype, to_float64
from ksearch.tasks.loader import Task
from ksearch.tasks.reference import run_reference

#: reference outputs larger than this many elements are cached as float32 (error ~6e-8 relative, far
#: below any task tolerance) to bound the cache's memory
_F32_CACHE_ABOVE = 1 << 20


@dataclass
class EvalConfig:
    """Knobs of the judge. ``seeds``: one correctness check per seed per workload (fresh inputs each);
    ``timeout_s``: per kernel call; ``stop_on_failure``: skip the remaining workloads after a failure."""

    seeds: list[int] = field(default_factory=lambda: [secrets.randbits(63) for _ in range(3)])
    timeout_s: float = 60.0
    compile_timeout_s: float = 120.0
    timing: TimingPlan = field(default_factory=TimingPlan)
    stop_on_failure: bool = True
    reference_cache_bytes: int = 2 << 30
    input_cache_bytes: int = 3 << 30


def _shared_base() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _shared_dir(prefix: str = "ksearch-eval-") -> Path:
    """A new directory in shared memory (/dev/shm) when there is one, else in the temp directory, named
    after this process so that `remove_stale_dirs` can clean up after a killed run."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=_shared_base()))


def remove_stale_dirs() -> int:
    """Delete judge directories left by ksearch processes that no longer exist (killed runs). Returns how many."""
    removed = 0
    for d in _shared_base().glob("ksearch-*-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed


def _nbytes(arrays: dict) -> int:
    return sum(v.nbytes for v in arrays.values() if isinstance(v, np.ndarray))


class Evaluator:
    """Evaluates candidates of one task on one target; keeps reference outputs and naive times between calls.

    Args:
        task: the task (definition + workloads + naive kernels).
        target: target name (``cpu``).
        hardware: the device's HardwareSpec, for roofline figures (None: no floor reported).
        config: EvalConfig.
        progress: called with a short line of text as work proceeds (for the CLI).
    """

    def __init__(self, task: Task, target: str = "cpu", hardware=None, config: EvalConfig | None = None,
                 progress: Callable[[str], None] | None = None):
        self.task = task
        self.definition: Definition = task.definition
        self.target = get_target(target)
        self.hardware = hardware
        self.config = config or EvalConfig()
        self.progress = progress or (lambda msg: None)
        self._refs: OrderedDict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
        self._ref_bytes = 0
        self._inputs: OrderedDict[tuple[str, int], tuple[dict, Path]] = OrderedDict()
        self._input_bytes = 0
        self._input_root: Path | None = None
        remove_stale_dirs()
        self.naive_ms: dict[str, float] = {}

    # -- reference ----------------------------------------------------------------------------------

    def reference(self, workload: Workload, seed: int, inputs: dict) -> dict[str, np.ndarray]:
        """Reference outputs for (workload, seed), computed once and cached (LRU, bounded in bytes)."""
        key = (workload.uuid, seed)
        if key in self._refs:
            self._refs.move_to_end(key)
            return self._refs[key]
        self.progress(f"reference {workload.label} seed {seed % 10000:04d}")
        outs = run_reference(self.definition, inputs)
        outs = {k: (v.astype(np.float32) if v.size > _F32_CACHE_ABOVE else v) for k, v in outs.items()}
        self._refs[key] = outs
        self._ref_bytes += sum(v.nbytes for v in outs.values())
        while self._ref_bytes > self.config.reference_cache_bytes and len(self._refs) > 1:
            _, old = self._refs.popitem(last=False)
            self._ref_bytes -= sum(v.nbytes for v in old.values())
        return outs

    # -- inputs -------------------------------------------------------------------------------------

    def inputs(self, workload: Workload, seed: int) -> tuple[dict, Path]:
        """Inputs for (workload, seed) and the directory holding them as files (``in.<name>``), made once and
        reused by later evaluations (LRU, bounded in bytes). Each evaluation still runs in a fresh process,
        and the files are verified unchanged after every call."""
        key = (workload.uuid, seed)
        if key in self._inputs:
            self._inputs.move_to_end(key)
            return self._inputs[key]
        if self._input_root is None:
            self._input_root = _shared_dir("ksearch-inputs-")
        inputs = make_inputs(self.definition, workload, seed)
        folder = self._input_root / f"{len(self._inputs)}-{seed % 100000}-{workload.uuid[:8]}"
        folder.mkdir()
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                value.tofile(folder / f"in.{name}")
        self._inputs[key] = (inputs, folder)
        self._input_bytes += _nbytes(inputs)
        while self._input_bytes > self.config.input_cache_bytes and len(self._inputs) > 1:
            _, (old, old_dir) = self._inputs.popitem(last=False)
            self._input_bytes -= _nbytes(old)
            shutil.rmtree(old_dir, ignore_errors=True)
        return inputs, folder

    def close(self) -> None:
        """Remove the input files (also done at interpreter exit)."""
        if self._input_root is not None:
            shutil.rmtree(self._input_root, ignore_errors=True)
            self._input_root = None
            self._inputs.clear()
            self._input_bytes = 0

    def __del__(self):
        self.close()

    # -- the naive baseline -------------------------------------------------------------------------

    def naive_candidate(self) -> Candidate:
        """The task's naive kernel for this target. Raises KeyError when the task ships none."""
        source = self.task.naive_sources[self.target.name]
        return Candidate(target=self.target.name, sources={"kernel.c": source}, meta={"role": "naive"})

    def measure_naive(self, workloads: list[Workload], timing: bool | str = True) -> Evaluation:
        """Evaluate the naive kernel on these workloads and remember its median times for speedups."""
        ev = self.evaluate(self.naive_candidate(), [w.name or w.uuid for w in workloads], timing, with_speedup=False)
        self.remember_naive(ev)
        return ev

    def remember_naive(self, ev: Evaluation) -> None:
        """Take the naive kernel's median times from an evaluation of it (e.g. one stored by a run)."""
        for r in ev.workloads:
            if r.median_ms is not None:
                self.naive_ms[r.workload] = r.median_ms

    # -- evaluation ---------------------------------------------------------------------------------

    def evaluate(self, candidate: Candidate, workloads: list[str] | None = None,
                 timing: bool | str = True, with_speedup: bool = True) -> Evaluation:
        """Judge one candidate on the named workloads (all when None). Never raises for a bad kernel:
        its fault is in the returned Evaluation's status and messages.

        ``timing``: True times every workload, False none, ``"bench"`` only workloads whose purpose is bench.
        """
        selected = self.task.select(workloads)
        ev = Evaluation(candidate_id=candidate.id, task=self.task.name, target=self.target.name,
                        hardware=getattr(self.hardware, "name", "") or "", status=Status.PASSED)
        self.progress(f"compile {candidate.id}")
        built = self.target.compile(candidate, self.definition, self.config.compile_timeout_s)
        ev.compile_log, ev.compile_s = built.log, built.seconds
        if not built.ok:
            ev.status, ev.message = Status.COMPILE_ERROR, built.log
            return ev
        scratch = _shared_dir()
        try:
            self._run_workloads(candidate, built.artifact, selected, timing, ev, scratch, with_speedup)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        failed = next((r for r in ev.workloads if r.status not in (Status.PASSED, Status.SKIPPED)), None)
        if failed is not None:
            ev.status, ev.message = failed.status, f"{failed.workload}: {failed.message}"
        return ev

    def _run_workloads(self, candidate, artifact, selected, timing, ev, scratch, with_speedup) -> None:
        worker: Worker | None = None
        try:
            for wl in selected:
                if ev.workloads and self.config.stop_on_failure and \
                        any(r.status not in (Status.PASSED, Status.SKIPPED) for r in ev.workloads):
                    ev.workloads.append(WorkloadResult(workload=wl.label, status=Status.SKIPPED,
                                                       message="not run: an earlier workload failed"))
                    continue
                if worker is None or worker.proc.poll() is not None:
                    worker = Worker(scratch)
                    reply = worker.request({"op": "load", "target": self.target.name, "artifact": str(artifact),
                                            "candidate": candidate.model_dump(mode="json"),
                                            "definition": self.definition.model_dump(mode="json")}, 60.0)
                    if not reply.get("ok"):
                        ev.workloads.append(WorkloadResult(workload=wl.label, status=Status.RUNTIME_ERROR,
                                                           message=reply.get("error", "load failed")))
                        continue
                timed = timing if isinstance(timing, bool) else wl.purpose == timing
                result = self._run_one(worker, wl, timed, scratch)
                if with_speedup and result.median_ms and wl.label in self.naive_ms:
                    result.speedup_vs_naive = self.naive_ms[wl.label] / result.median_ms
                ev.workloads.append(result)
                if result.status in (Status.TIMEOUT, Status.RUNTIME_ERROR):
                    worker.close()
                    worker = None
        finally:
            if worker is not None:
                worker.close()

    def _run_one(self, worker: Worker, wl: Workload, timing: bool, scratch: Path) -> WorkloadResult:
        d = self.definition
        axes = d.axis_values(wl)
        res = WorkloadResult(workload=wl.label, status=Status.PASSED)
        max_abs = max_rel = 0.0
        inputs = want = None
        out_arrays: dict[str, Path] = {}
        for seed in self.config.seeds:
            self.progress(f"check {wl.label} ({res.checks + 1}/{len(self.config.seeds)})")
            inputs, in_dir = self.inputs(wl, seed)
            want = self.reference(wl, seed, inputs)
            args, out_arrays = self._write_args(inputs, in_dir, axes, scratch)
            status, msg = self._call(worker, args, self.config.timeout_s)
            if status is not Status.PASSED:
                res.status, res.message = status, msg
                return res
            status, msg, a, r = self._check(inputs, in_dir, out_arrays, want, axes)
            res.checks += 1
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
            res.max_abs_err, res.max_rel_err = max_abs, max_rel
            if status is not Status.PASSED:
                res.status, res.message = status, f"seed {seed}: {msg}"
                return res
        if not timing:
            return res
        self.progress(f"time {wl.label}")
        plan = self.config.timing.model_copy(update={"flush_bytes": self._flush_bytes(wl)})
        budget = self.config.timeout_s * (plan.warmup + 2) + plan.max_time_s * 2
        reply_times, status, msg = self._time(worker, args, plan, budget)
        if status is not Status.PASSED:
            res.status, res.message = status, msg
            return res
        status, msg, a, r = self._check(inputs, in_dir, out_arrays, want, axes)
        if status is not Status.PASSED:
            res.status, res.message = status, f"outputs of the timed calls: {msg}"
            return res
        stats = summarize_times(reply_times)
        res.median_ms, res.min_ms, res.spread, res.repeats = stats.median_ms, stats.min_ms, stats.spread, stats.n
        self._roofline(wl, res)
        return res

    def _write_args(self, inputs: dict, in_dir: Path, axes: dict[str, int],
                    scratch: Path) -> tuple[list[dict], dict[str, Path]]:
        d = self.definition
        args: list[dict] = []
        for name, spec in d.inputs.items():
            value = inputs[name]
            if spec.shape is None:
                args.append({"kind": "scalar", "value": value})
                continue
            path = in_dir / f"in.{name}"
            args.append({"kind": "array", "path": str(path), "dtype": value.dtype.str,
                         "shape": list(value.shape), "writable": False})
        outs: dict[str, Path] = {}
        for name, spec in d.outputs.items():
            shape = d.shape_of(spec, axes) or ()
            dt = numpy_dtype(spec.dtype)
            path = scratch / f"out.{name}"
            poison = np.full(shape, np.nan, dt) if dt.kind == "f" else np.full(shape, 0xA5, np.uint8).view(dt)
            poison.tofile(path)
            outs[name] = path
            args.append({"kind": "array", "path": str(path), "dtype": dt.str, "shape": list(shape),
                         "writable": True})
        args += [{"kind": "scalar", "value": int(axes[a])} for a in d.axes]
        return args, outs

    def _check(self, inputs, in_dir, out_paths, want, axes) -> tuple[Status, str, float, float]:
        d = self.definition
        for name, value in inputs.items():
            if isinstance(value, np.ndarray) and value.size:
                path = in_dir / f"in.{name}"
                if not np.array_equal(np.fromfile(path, np.uint8), value.reshape(-1).view(np.uint8)):  # bitwise
                    value.tofile(path)  # restore it for the next candidate
                    return Status.REJECTED, f"the kernel modified its input {name!r}", float("nan"), float("nan")
        worst_abs = worst_rel = 0.0
        for name, spec in d.outputs.items():
            shape = d.shape_of(spec, axes) or ()
            got = np.fromfile(out_paths[name], numpy_dtype(spec.dtype)).reshape(shape)
            if spec.dtype == "bfloat16":
                got = to_float64(got, spec.dtype)
            status, a, r, msg = compare(got, want[name], d.tolerance_for(spec.dtype))
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
            if status is not Status.PASSED:
                return status, f"output {name!r}: {msg}", worst_abs, worst_rel
        return Status.PASSED, "", worst_abs, worst_rel

    def _call(self, worker: Worker, args: list[dict], timeout_s: float) -> tuple[Status, str]:
        try:
            reply = worker.request({"op": "call", "args": args, "timing": None}, timeout_s)
        except WorkerTimeout:
            return Status.TIMEOUT, f"the kernel did not return within {timeout_s:g} s (killed)"
        except WorkerDied as e:
            return Status.RUNTIME_ERROR, _died_message(e)
        if not reply.get("ok"):
            return Status.RUNTIME_ERROR, reply.get("error", "call failed")
        return Status.PASSED, ""

    def _time(self, worker, args, plan: TimingPlan, budget_s: float) -> tuple[list[float], Status, str]:
        try:
            reply = worker.request({"op": "call", "args": args, "timing": plan.model_dump()}, budget_s)
        except WorkerTimeout:
            return [], Status.TIMEOUT, f"timing did not finish within {budget_s:g} s (killed)"
        except WorkerDied as e:
            return [], Status.RUNTIME_ERROR, _died_message(e)
        if not reply.get("ok") or not reply.get("times_ms"):
            return [], Status.RUNTIME_ERROR, reply.get("error", "timing failed")
        return [float(t) for t in reply["times_ms"]], Status.PASSED, ""

    def _flush_bytes(self, wl: Workload) -> int:
        """Bytes to write between timed repeats to evict the caches: twice the last-level cache, or none when
        the workload's own data is already four times larger than that cache (it cannot stay cached)."""
        llc = self.hardware.last_level_cache_bytes() if self.hardware is not None else None
        if not llc:
            return self.config.timing.flush_bytes
        return 0 if self.definition.cost_of(wl).bytes >= 4 * llc else 2 * llc

    def _roofline(self, wl: Workload, res: WorkloadResult) -> None:
        cost = self.definition.cost_of(wl)
        seconds = res.median_ms / 1e3
        res.achieved_gbs = cost.bytes / seconds / 1e9 if seconds > 0 else None
        if self.hardware is None:
            return
        from ksearch.hardware.roofline import pct_of_floor, roofline

        roof = roofline(cost.bytes, cost.flops, cost.transcendentals, self.hardware)
        res.floor_ms, res.bound = roof.floor_s * 1e3, roof.bound
        res.pct_of_floor = pct_of_floor(seconds, roof.floor_s)


def _died_message(e: WorkerDied) -> str:
    tail = e.stderr_tail.strip()
    return describe_exit(e.returncode) + (f"\n{tail[-1500:]}" if tail else "")
