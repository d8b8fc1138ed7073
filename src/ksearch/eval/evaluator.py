"""The judge, first version: compile, check against the reference on fresh inputs, time, in a worker.

For each candidate: the target compiles it in this process (a compiler subprocess with a timeout); a fresh
sandboxed worker loads it; for every workload and every correctness seed the controller writes fresh inputs
(mapped read-only into the worker) and NaN-poisoned outputs to shared memory, the worker calls the kernel, and
the controller compares the outputs with the float64 reference here, never in the worker. Then the worker
times repeated calls (warm-up, caches flushed and outputs re-poisoned between repeats, median and spread), and
the outputs of the last timed call are checked again.

Before compiling, the target's static checks (`static_checks`) reject sources that shell out, load code,
touch the clock, read other processes' files or memory, use inline assembly or load-time code. A timing
below the roofline floor is re-verified on fresh inputs and timed again; still below, the candidate is
REJECTED. A worker whose reply stream was tampered with, a kernel that changed an output file's size or
wrote into the judge's input files is REJECTED too. docs/evaluation.md lists every defense.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ksearch.eval import static_checks
from ksearch.eval.casedata import CaseData, default_input_cache_bytes, remove_stale_dirs, same_bytes
from ksearch.eval.casedata import shared_dir as _shared_dir
from ksearch.eval.compare import compare
from ksearch.eval.hidden import draw_hidden_workloads
from ksearch.eval.protocol import TimingPlan
from ksearch.eval.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.eval.sandbox import Policy, ProtocolViolation, Worker, WorkerDied, WorkerTimeout, describe_exit
from ksearch.eval.stats import summarize_times
from ksearch.targets import get_target
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.inputs import numpy_dtype, poison_byte, to_float64
from ksearch.tasks.loader import Task

#: targets whose worker needs the GPU (Policy.gpu; namespaces and seccomp off, see `_start_worker`)
GPU_TARGETS = ("cuda", "triton", "mlx-cuda", "mlx-metal")


@dataclass
class EvalConfig:
    """Knobs of the judge. ``seeds``: one correctness check per seed per workload (fresh inputs each);
    ``timeout_s``: per kernel call; ``stop_on_failure``: skip the remaining workloads after a failure;
    ``static_checks``: run the target's static checks before compiling (off only to prove the sandbox);
    ``sandbox``: what the worker's sandbox enforces (its ``cpu_s`` None: derived from the time budget);
    ``floor_check``: re-verify, then reject, timings below the roofline floor; ``input_cache_bytes``: input
    bytes kept between evaluations (None: `casedata.default_input_cache_bytes`, from the memory available)."""

    seeds: list[int] = field(default_factory=lambda: [secrets.randbits(63) for _ in range(3)])
    timeout_s: float = 60.0
    compile_timeout_s: float = 120.0
    timing: TimingPlan = field(default_factory=TimingPlan)
    stop_on_failure: bool = True
    reference_cache_bytes: int = 2 << 30
    input_cache_bytes: int | None = None
    static_checks: bool = True
    sandbox: Policy = field(default_factory=Policy)
    floor_check: bool = True
    #: inputs of the timed calls: a seed no check uses (None: derived from ``seeds``, so the reference is
    #: computed once per run); the warm-up runs on the last check's inputs
    timing_seed: int | None = None

    def seed_for_timing(self) -> int:
        if self.timing_seed is not None:
            return self.timing_seed
        seed = (self.seeds[0] * 6364136223846793005 + 1442695040888963407) % (1 << 62) if self.seeds else 7
        return seed if seed not in self.seeds else seed + 1


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
        input_bytes = self.config.input_cache_bytes
        self.data = CaseData(self.definition, self.config.reference_cache_bytes,
                             default_input_cache_bytes() if input_bytes is None else input_bytes, self.progress)
        remove_stale_dirs()
        self.naive_ms: dict[str, float] = {}

    # -- inputs and reference outputs (cached across evaluations: see CaseData) ------------------------

    def reference(self, workload: Workload, seed: int, inputs: dict) -> dict[str, np.ndarray]:
        """Reference outputs for (workload, seed), computed once and cached."""
        return self.data.reference(workload, seed, inputs)

    def inputs(self, workload: Workload, seed: int) -> tuple[dict, Path]:
        """Inputs for (workload, seed) and the directory holding them as files (``in.<name>``)."""
        return self.data.inputs(workload, seed)

    def close(self) -> None:
        """Remove the input files (also done at interpreter exit)."""
        self.data.close()

    # -- the naive baseline -------------------------------------------------------------------------

    def naive_candidate(self) -> Candidate:
        """The task's naive kernel for this target. Raises KeyError when the task ships none."""
        source = self.task.naive_sources[self.target.name]
        name = {"cuda": "kernel.cu", "triton": "kernel.py", "mlx-cuda": "kernel.cu",
                "mlx-metal": "kernel.metal"}.get(self.target.name, "kernel.c")
        launch = getattr(self.task, "naive_launch", {}).get(self.target.name, {})
        return Candidate(target=self.target.name, sources={name: source}, launch=launch, meta={"role": "naive"})

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

    def evaluate(self, candidate: Candidate, workloads: list[str | Workload] | None = None,
                 timing: bool | str = True, with_speedup: bool = True) -> Evaluation:
        """Judge one candidate on the named workloads (all when None; Workload records, e.g. hidden ones,
        are taken as given). Never raises for a bad kernel: its fault is in the returned Evaluation's status
        and messages.

        ``timing``: True times every workload, False none, ``"bench"`` only workloads whose purpose is bench.
        """
        t_begin = time.perf_counter()
        self.data.begin()
        try:
            ev = self._evaluate(candidate, workloads, timing, with_speedup)
        finally:
            self.data.end()
        ev.wall_s = round(time.perf_counter() - t_begin, 3)
        return ev

    def _evaluate(self, candidate: Candidate, workloads, timing, with_speedup) -> Evaluation:
        selected = [w if isinstance(w, Workload) else self.task.workload(w) for w in workloads] if workloads \
            else self.task.select(None)
        ev = Evaluation(candidate_id=candidate.id, task=self.task.name, target=self.target.name,
                        hardware=getattr(self.hardware, "name", "") or "", status=Status.PASSED)
        if self.config.static_checks:
            self.progress(f"static checks {candidate.id}")
            findings = static_checks.check(candidate, static_checks.rules_for(self.target.name),
                                           getattr(self.target, "expand", None))
            if findings:
                more = f"; also: {', '.join(sorted({f.rule for f in findings[1:]}))}" if len(findings) > 1 else ""
                ev.status, ev.message = Status.REJECTED, f"{findings[0]}{more}"
                return ev
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
        tampered = self.data.tampered()
        if tampered is not None:
            ev.status = Status.REJECTED
            ev.message = f"the kernel wrote outside its scratch directory (into the judge's inputs: {tampered})"
        return ev

    def hidden_workloads(self, secret_seed: int, n: int = 4, like: list[Workload] | None = None) -> list[Workload]:
        """``n`` workloads the search never saw, drawn from the var axes' valid ranges with ``secret_seed``,
        each moving no more bytes than the largest of ``like`` (default: the task's workloads). See `hidden`."""
        return draw_hidden_workloads(self.definition, secret_seed, n, like or self.task.workloads)

    def _cpu_limit_s(self, n_workloads: int) -> int:
        """CPU seconds a worker may use (all threads): the wall-clock budget of its requests times the cores."""
        plan = self.config.timing
        wall = n_workloads * (self.config.timeout_s * (2 * len(self.config.seeds) + plan.warmup + 6)
                              + 4 * plan.max_time_s) + 60
        return math.ceil(wall * (os.cpu_count() or 1))

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
                    t_load = time.perf_counter()
                    worker = self._start_worker(scratch, artifact, len(selected))
                    try:
                        reply = worker.request({"op": "load", "target": self.target.name, "artifact": str(artifact),
                                                "candidate": candidate.model_dump(mode="json"),
                                                "definition": self.definition.model_dump(mode="json")}, 60.0)
                    except (WorkerDied, WorkerTimeout, ProtocolViolation) as e:
                        status = Status.REJECTED if isinstance(e, ProtocolViolation) else Status.RUNTIME_ERROR
                        msg = _died_message(e) if isinstance(e, WorkerDied) else str(e)
                        ev.workloads.append(WorkloadResult(workload=wl.label, status=status,
                                                           message=f"loading the kernel: {msg}"))
                        worker.close()
                        worker = None
                        continue
                    ev.load_s = round((ev.load_s or 0.0) + time.perf_counter() - t_load, 3)
                    ev.sandbox = _sandbox_summary(reply.get("sandbox") or {})
                    if not reply.get("ok"):
                        status = _failure_status(reply)  # COMPILE_ERROR: cuda's NVRTC, triton's import
                        if status is Status.COMPILE_ERROR:
                            ev.compile_log = str(reply.get("error", ""))
                        ev.workloads.append(WorkloadResult(workload=wl.label, status=status,
                                                           message=reply.get("error", "load failed")))
                        continue
                timed = timing if isinstance(timing, bool) else wl.purpose == timing
                t_wl = time.perf_counter()
                result = self._run_one(worker, wl, timed, scratch)
                result.wall_s = round(time.perf_counter() - t_wl, 3)
                if with_speedup and result.median_ms and wl.label in self.naive_ms:
                    result.speedup_vs_naive = self.naive_ms[wl.label] / result.median_ms
                ev.workloads.append(result)
                if result.status in (Status.TIMEOUT, Status.RUNTIME_ERROR, Status.REJECTED):
                    worker.close()
                    worker = None
        finally:
            if worker is not None:
                worker.close()

    def _start_worker(self, scratch: Path, artifact: Path, n_workloads: int) -> Worker:
        """A fresh worker that may write only the output files (created here, empty, for that reason)."""
        outs = [scratch / f"out.{name}" for name in self.definition.outputs]
        for path in outs:
            path.touch()
        policy = self.config.sandbox
        if self.target.name in GPU_TARGETS and not policy.gpu:  # the worker must reach the GPU's device nodes
            # Measured on the H200 (2026-11-29, bench/gpu/diag_cuda_worker.py --workers): CUDA initialises
            # only with the namespaces off AND seccomp off (either one alone gives cudaErrorOperatingSystem
            # at cudaGetDevice). Until the jail learns what the driver needs, GPU workers run with rlimits, a
            # scrubbed environment, no capabilities and no new privileges only (docs/evaluation.md). triton
            # needs seccomp off regardless: Triton's JIT runs ptxas and the C compiler as subprocesses.
            policy = policy.model_copy(update={"gpu": True, "namespaces": "off", "seccomp": False})
        if policy.cpu_s is None:
            policy = policy.model_copy(update={"cpu_s": self._cpu_limit_s(n_workloads)})
        return Worker(scratch, policy, writable=outs, readable=[Path(artifact).parent])

    def _run_one(self, worker: Worker, wl: Workload, timing: bool, scratch: Path) -> WorkloadResult:
        axes = self.definition.axis_values(wl)
        res = WorkloadResult(workload=wl.label, status=Status.PASSED)
        call = None
        for seed in self.config.seeds:
            self.progress(f"check {wl.label} ({res.checks + 1}/{len(self.config.seeds)})")
            call = self._checked_call(worker, wl, seed, axes, scratch, res)
            if call is None:
                return res
        if not timing:
            return res
        timed = self._prepare(wl, self.config.seed_for_timing(), axes, scratch)
        if not self._timed(worker, wl, timed, call[3] if call else None, res) or not self.config.floor_check:
            return res
        if res.pct_of_floor is not None and res.pct_of_floor > 100:
            first = f"{res.median_ms:.4g} ms ({res.pct_of_floor:.0f}% of the floor {res.floor_ms:.4g} ms)"
            self.progress(f"suspect: {wl.label} below the roofline floor; re-verifying on fresh inputs")
            call = self._checked_call(worker, wl, secrets.randbits(62), axes, scratch, res)
            timed = self._prepare(wl, secrets.randbits(62), axes, scratch)
            if call is None or not self._timed(worker, wl, timed, call[3], res):
                return res
            if res.pct_of_floor is not None and res.pct_of_floor > 100:
                res.status = Status.REJECTED
                res.message = (f"faster than the roofline floor twice (first {first}, then {res.median_ms:.4g} ms on "
                               f"fresh inputs): the timing cannot be trusted")
            else:
                res.message = f"first timing {first} was below the roofline floor; re-verified and re-timed"
        return res

    def _checked_call(self, worker: Worker, wl: Workload, seed: int, axes: dict[str, int], scratch: Path,
                      res: WorkloadResult) -> tuple | None:
        """One call on the inputs of ``seed``, its outputs compared with the reference; updates ``res``.
        Returns the call (see `_prepare`), or None when it failed (``res`` says why)."""
        call = self._prepare(wl, seed, axes, scratch)
        inputs, in_dir, want, args, out_paths, axes = call
        status, msg = self._call(worker, args, self.config.timeout_s)
        if status is not Status.PASSED:
            res.status, res.message = status, msg
            return None
        status, msg, a, r = self._check(inputs, in_dir, out_paths, want, axes)
        res.checks += 1
        res.max_abs_err = max(res.max_abs_err or 0.0, a) if not math.isnan(a) else a
        res.max_rel_err = max(res.max_rel_err or 0.0, r) if not math.isnan(r) else r
        if status is not Status.PASSED:
            res.status, res.message = status, f"seed {seed}: {msg}"
            return None
        return call

    def _prepare(self, wl: Workload, seed: int, axes: dict[str, int], scratch: Path) -> tuple:
        """Inputs, reference and poisoned outputs of one call: (inputs, input dir, want, args, output paths,
        axes)."""
        inputs, in_dir = self.inputs(wl, seed)
        want = self.reference(wl, seed, inputs)
        args, out_paths = self._write_args(inputs, in_dir, axes, scratch)
        return inputs, in_dir, want, args, out_paths, axes

    def _timed(self, worker: Worker, wl: Workload, call: tuple, warmup_args: list | None,
               res: WorkloadResult) -> bool:
        """Time repeated calls of ``call`` (see TimingPlan; warm-up on ``warmup_args``), check the last timed
        call's outputs against the reference and every timed call's output summary against the last one's;
        fills ``res``'s times and roofline figures. False when it failed (``res`` says why)."""
        inputs, in_dir, want, args, out_paths, axes = call
        self.progress(f"time {wl.label}")
        plan = self.config.timing.model_copy(update={"flush_bytes": self._flush_bytes(wl)})
        budget = self.config.timeout_s * (plan.warmup + 2) + plan.max_time_s * 2
        reply_times, sums, status, msg = self._time(worker, args, warmup_args, plan, budget)
        if status is not Status.PASSED:
            res.status, res.message = status, msg
            return False
        status, msg, _, _ = self._check(inputs, in_dir, out_paths, want, axes)
        if status is not Status.PASSED:
            res.status, res.message = status, f"outputs of the timed calls: {msg}"
            return False
        msg = _uneven_timed_outputs(sums)
        if msg:
            res.status, res.message = Status.INCORRECT_NUMERICAL, msg
            return False
        stats = summarize_times(reply_times)
        res.median_ms, res.min_ms, res.spread, res.repeats = stats.median_ms, stats.min_ms, stats.spread, stats.n
        self._roofline(wl, res)
        return True

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
            poison = np.full(shape, np.nan, dt) if dt.kind == "f" else \
                np.full(math.prod(shape) * dt.itemsize, poison_byte(dt), np.uint8).view(dt).reshape(shape)
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
                if not same_bytes(path, value):  # bitwise, through a read-only mapping
                    self.data.write_input(value, path)  # restore it for the next candidate
                    return Status.REJECTED, f"the kernel modified its input {name!r}", float("nan"), float("nan")
        worst_abs = worst_rel = 0.0
        for name, spec in d.outputs.items():
            shape = d.shape_of(spec, axes) or ()
            dt = numpy_dtype(spec.dtype)
            size = out_paths[name].stat().st_size if out_paths[name].exists() else -1
            if size != math.prod(shape) * dt.itemsize:
                return (Status.REJECTED, f"the kernel changed its output file {name!r} ({size} bytes, expected "
                        f"{math.prod(shape) * dt.itemsize})", float("nan"), float("nan"))
            got = np.fromfile(out_paths[name], dt).reshape(shape)
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
        except ProtocolViolation as e:
            return Status.REJECTED, str(e)
        if not reply.get("ok"):
            return _failure_status(reply), reply.get("error", "call failed")
        return Status.PASSED, ""

    def _time(self, worker, args, warmup_args, plan: TimingPlan,
              budget_s: float) -> tuple[list[float], list[list[float]], Status, str]:
        t0 = time.perf_counter()
        try:
            reply = worker.request({"op": "call", "args": args, "warmup_args": warmup_args,
                                    "timing": plan.model_dump()}, budget_s)
        except WorkerTimeout:
            return [], [], Status.TIMEOUT, f"timing did not finish within {budget_s:g} s (killed)"
        except WorkerDied as e:
            return [], [], Status.RUNTIME_ERROR, _died_message(e)
        except ProtocolViolation as e:
            return [], [], Status.REJECTED, str(e)
        times, sums = reply.get("times_ms"), reply.get("sums")
        wall_ms = (time.perf_counter() - t0) * 1e3
        if not reply.get("ok") or not times or not isinstance(sums, list) or len(sums) != len(times):
            return [], [], _failure_status(reply), reply.get("error", "timing failed")
        times = [float(t) for t in times]
        if min(times) <= 0 or sum(times) > wall_ms * 1.01 + 1.0:  # the worker's clock is not to be trusted
            return [], [], Status.REJECTED, (f"impossible timings: {len(times)} calls reported {sum(times):.4g} ms "
                                             f"in total (min {min(times):.3g} ms) within {wall_ms:.4g} ms")
        return times, sums, Status.PASSED, ""

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
        from ksearch.errors import HardwareError
        from ksearch.hardware.roofline import pct_of_floor, roofline

        try:
            roof = roofline(cost.bytes, cost.flops, cost.transcendentals, self.hardware, dtype=cost.flops_on)
        except HardwareError as e:  # the spec has no peak for the task's flops_on: no floor, the timing stands
            self.progress(f"{wl.name}: no roofline floor: {e}")
            return
        res.floor_ms, res.bound = roof.floor_s * 1e3, roof.bound
        res.pct_of_floor = pct_of_floor(seconds, roof.floor_s)


def _uneven_timed_outputs(sums: list[list[float]], rtol: float = 1e-3) -> str:
    """Why the timed calls' output summaries ([non-finite count, sum |x|] each; the last one's outputs were
    verified against the reference) show that some timed call did not do the work, or ""."""
    last = float(sums[-1][1])
    for i, (bad, total) in enumerate(sums):
        if bad:
            return f"timed call {i + 1} of {len(sums)} left {int(bad)} output values non-finite (skipped work?)"
        if not abs(float(total) - last) <= rtol * abs(last) + 1e-30:
            return (f"timed call {i + 1} of {len(sums)} produced other outputs than the verified last one "
                    f"(sum |x| {float(total):.6g} vs {last:.6g})")
    return ""


def _failure_status(reply: dict) -> Status:
    """A failed call's status: RUNTIME_ERROR, unless the worker's runner said COMPILE_ERROR (Triton compiles at
    the first call) or REJECTED (a defense in the worker caught the kernel). Nothing better can be claimed."""
    status = reply.get("status")
    return Status(status) if status in (Status.COMPILE_ERROR.value, Status.REJECTED.value) else Status.RUNTIME_ERROR


def _sandbox_summary(report: dict) -> dict:
    """The part of the worker's sandbox report worth keeping with every evaluation."""
    return {"namespaces": report.get("namespaces", []), "read_only_fs": report.get("read_only_fs", False),
            "hidden": report.get("hidden", []), "capabilities": report.get("capabilities"),
            "seccomp": bool(report.get("seccomp")), "limits": report.get("limits", {}),
            "errors": report.get("errors", [])}


def _died_message(e: WorkerDied) -> str:
    tail = e.stderr_tail.strip()
    return describe_exit(e.returncode) + (f"\n{tail[-1500:]}" if tail else "")
