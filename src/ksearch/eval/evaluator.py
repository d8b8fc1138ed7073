"""The judge, first version: compile, check against the reference on fresh inputs, time, in a worker.

For each candidate: the target compiles it in this process (a compiler subprocess with a timeout); a fresh
sandboxed worker loads it; for every workload and every correctness seed the controller writes fresh inputs
(mapped read-only into the worker) and NaN-poisoned outputs to shared memory, the worker calls the kernel, and
the controller compares the outputs with the float64 reference here, never in the worker. Then the candidate is
timed in paired rounds beside its reference kernels (`ksearch.eval.timing`): a fresh input set each round, the
controller's own clock around each call (device events on GPU targets), outputs poisoned and caches flushed by
the controller before every call, every round's outputs compared with the reference of its inputs. A busy
machine is waited for (with backoff, bounded) before timing, and the load is recorded with the times. A worker
killed or stopped from outside the judge is an infrastructure fault: the workload is judged again on a fresh
worker.

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
from typing import TYPE_CHECKING, Callable

import numpy as np

from ksearch import config as _config
from ksearch.eval import profiling, static_checks
from ksearch.eval.casedata import CaseData, default_input_cache_bytes, remove_stale_dirs, same_bytes
from ksearch.eval.casedata import shared_dir as _shared_dir
from ksearch.eval.compare import compare
from ksearch.eval.hidden import draw_hidden_workloads
from ksearch.protocol import ArgRef, ArrayRef, CallRequest, ErrorReply, LoadRequest, ScalarRef, TimingPlan
from ksearch.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.errors import ExternalKill, ProtocolViolation, WorkerDied, WorkerStopped, WorkerTimeout
from ksearch.jail.sandbox import Policy, Worker
from ksearch.eval.timing import (Contender, Reference, RoundTimer, calibrate, combine, decision_rounds, died_message,
                                 failure_status, killed_from_outside, within_clock_noise, worker_main_pid)
from ksearch.hardware.load import LoadMeter
from ksearch.targets import get_target
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.inputs import BIT_STORED, numpy_dtype, poison_byte, to_float64
from ksearch.tasks.loader import Task

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec

#: calls of each kernel per paired round on a busy machine (the round keeps each kernel's fastest)
BUSY_CALLS = 2
#: the shortest window a load reading decides on (the kernel counts CPU time in 10 ms ticks)
MIN_LOAD_WINDOW_S = 0.25

#: the most a worker without the eviction library writes to evict the caches before a timed cpu call (256 MiB)
FLUSH_CAP_BYTES = 256 << 20
#: the worker's program (`ksearch.eval.worker`), started by the sandbox as ``python -m WORKER_MODULE``
WORKER_MODULE = "ksearch.eval.worker"


@dataclass
class EvalConfig:
    """Knobs of the judge. ``seeds``: one correctness check per seed per workload (fresh inputs each);
    ``timeout_s``: per kernel call; ``stop_on_failure``: skip the remaining workloads after a failure;
    ``static_checks``: run the target's static checks before compiling (off only to prove the sandbox);
    ``sandbox``: what the worker's sandbox enforces (its ``cpu_s`` None: derived from the time budget);
    ``floor_check``: re-verify, then reject, timings below the roofline floor; ``input_cache_bytes``: input
    bytes kept between evaluations (None: `casedata.default_input_cache_bytes`, from the memory available);
    ``busy_wait_s``: seconds an evaluation may wait in all for a busy machine to quieten before timing
    (`ksearch.config.busy_wait_s`); ``timing_set_bytes``: input bytes of one workload's timing rounds (each round
    has its own input set; None: max(512 MiB, an eighth of the input cache)); ``reference_budget_s``: seconds of
    reference computation a workload's timing rounds may cost in a run (each round's outputs are compared with
    the reference of its inputs; the rounds are capped accordingly)."""

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
    busy_wait_s: float = field(default_factory=_config.busy_wait_s)
    timing_set_bytes: int | None = None
    reference_budget_s: float = 20.0
    #: workers started ahead when an evaluation ends, for the next (0: none; a search's judge keeps 3)
    spare_workers: int = 0
    #: profiler and compiler evidence for the prompts: a passing candidate of an evaluation that timed something
    #: gets ``Evaluation.profiles`` (`ksearch.eval.profiling`: the target's compiler report, and its profiler run
    #: once on the largest bench workload, untimed); never changes a verdict or a time
    profile: bool = False
    #: seconds the profiler's run may take in all (then its Profile's error says it timed out)
    profile_timeout_s: float = 120.0
    #: seconds one call of the task's own code may take: its reference, its input generator, its check (None:
    #: `task_limit_s`'s default); past it the evaluation stops with a TaskTimeout, the task's error
    reference_timeout_s: float | None = None

    def task_limit_s(self) -> float:
        """Seconds one call of the task's own code may take: ``reference_timeout_s``, else five times the
        kernel's ``timeout_s`` and at least 60 (a float64 reference on the host is slower than the kernel it
        judges; a hung one must still end the evaluation)."""
        if self.reference_timeout_s is not None:
            return self.reference_timeout_s
        return max(5 * self.timeout_s, 60.0)

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

    def __init__(self, task: Task, target: str = "cpu", hardware: HardwareSpec | None = None,
                 config: EvalConfig | None = None, progress: Callable[[str], None] | None = None):
        self.task = task
        self.definition: Definition = task.definition
        self.target = get_target(target)
        self.hardware = hardware
        self.config = config or EvalConfig()
        self.progress = progress or (lambda msg: None)
        input_bytes = self.config.input_cache_bytes
        self.data = CaseData(self.definition, self.config.reference_cache_bytes,
                             default_input_cache_bytes() if input_bytes is None else input_bytes, self.progress,
                             self.config.task_limit_s())
        remove_stale_dirs()
        self.naive_ms: dict[str, float] = {}
        self._flush_sizes: dict[tuple, int] = {}
        self._spares: list[tuple[Path, Path, Path, Worker]] = []
        self._evict: Path | None | bool = False  # not looked for yet (see `evict_library`)
        self._poisons: dict[tuple, np.ndarray] = {}

    # -- inputs and reference outputs (cached across evaluations: see CaseData) ------------------------

    def reference(self, workload: Workload, seed: int, inputs: dict) -> dict[str, np.ndarray]:
        """Reference outputs for (workload, seed), computed once and cached."""
        return self.data.reference(workload, seed, inputs)

    def inputs(self, workload: Workload, seed: int) -> tuple[dict, Path]:
        """Inputs for (workload, seed) and the directory holding them as files (``in.<name>``)."""
        return self.data.inputs(workload, seed)

    def close(self) -> None:
        """Stop the spare workers and remove the input files (also done at interpreter exit)."""
        self._drop_spares()
        self.data.close()

    def __del__(self):
        self._drop_spares()

    # -- spare workers: started when an evaluation ends, taken by the next ---------------------------

    def take_worker(self, artifact: Path) -> tuple[Worker, Path] | None:
        """A spare worker (and its scratch directory) that can run a build in ``artifact``'s directory, or None.
        A spare is a fresh process that has loaded no kernel: started when the last evaluation ended, so that its
        interpreter and jail (~0.3 s) are ready by the time the next candidate is compiled."""
        key = (Path(artifact).parent, self.data.root())
        for i, (adir, root, scratch, worker) in enumerate(self._spares):
            if (adir, root) == key and worker.proc.poll() is None:
                del self._spares[i]
                return worker, scratch
        return None

    def _replenish(self, artifact: Path | None, n: int) -> None:
        """Start spares until ``n`` wait for builds in ``artifact``'s directory (targets whose
        ``spare_workers`` says so: a GPU worker's time goes to loading the kernel, which no spare can do ahead)."""
        if artifact is None or not self.target.spare_workers or not self.config.spare_workers:
            return
        key = (Path(artifact).parent, self.data.root())
        stale = [sp for sp in self._spares if (sp[0], sp[1]) != key or sp[3].proc.poll() is not None]
        for sp in stale:
            self._spares.remove(sp)
            sp[3].close()
            shutil.rmtree(sp[2], ignore_errors=True)
        while len(self._spares) < min(n, self.config.spare_workers):
            scratch = _shared_dir()
            try:
                worker = self.start_worker(scratch, artifact, len(self.task.workloads))
            except Exception:  # a spare is an optimisation: the next evaluation starts its own
                shutil.rmtree(scratch, ignore_errors=True)
                return
            self._spares.append((key[0], key[1], scratch, worker))

    def _drop_spares(self) -> None:
        for _adir, _root, scratch, worker in getattr(self, "_spares", []):
            worker.close()
            shutil.rmtree(scratch, ignore_errors=True)
        self._spares = []

    # -- the naive baseline -------------------------------------------------------------------------

    def naive_candidate(self) -> Candidate:
        """The task's naive kernel for this target (`Target.naive_candidate`). Raises KeyError when the task
        ships none (and the target derives none)."""
        candidate = self.target.naive_candidate(self.task)
        if candidate is None:
            raise KeyError(f"task {self.task.name!r} has no naive kernel for target {self.target.name!r}")
        return candidate

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
                 timing: bool | str = True, with_speedup: bool = True,
                 references: list[Reference] | tuple = ()) -> Evaluation:
        """Judge one candidate on the named workloads (all when None; Workload records, e.g. hidden ones,
        are taken as given). Never raises for a bad kernel: its fault is in the returned Evaluation's status
        and messages.

        ``timing``: True times every workload, False none, ``"bench"`` only workloads whose purpose is bench.
        ``references``: kernels timed beside the candidate in paired rounds (its parent, the current best, the
        naive kernel; see `ksearch.eval.timing`): the Evaluation then carries the paired ratios with their
        intervals and verdicts, and the candidate's speedups are derived from the references' (a reference that
        fails in this session is dropped with a note; the candidate is never blamed for it).
        """
        t_begin = time.perf_counter()
        self.data.begin()
        self._used_workers = 0
        try:
            ev = self._evaluate(candidate, workloads, timing, with_speedup, list(references))
        finally:
            self.data.end()
        ev.wall_s = round(time.perf_counter() - t_begin, 3)
        self._replenish(getattr(self, "_last_artifact", None), self._used_workers)
        return ev

    def _evaluate(self, candidate: Candidate, workloads, timing, with_speedup, references) -> Evaluation:
        selected = [w if isinstance(w, Workload) else self.task.workload(w) for w in workloads] if workloads \
            else self.task.select(None)
        ev = Evaluation(candidate_id=candidate.id, task=self.task.name, target=self.target.name,
                        hardware=getattr(self.hardware, "name", "") or "", status=Status.PASSED)
        if self.config.static_checks:
            self.progress(f"static checks {candidate.id}")
            findings = static_checks.check(candidate, static_checks.rules_for(self.target.rule_family),
                                           self.target.expand)
            if findings:
                more = f"; also: {', '.join(sorted({f.rule for f in findings[1:]}))}" if len(findings) > 1 else ""
                ev.status, ev.message = Status.REJECTED, f"{findings[0]}{more}"
                return ev
        self.progress(f"compile {candidate.id}")
        built = self.target.compile(candidate, self.definition, self.config.compile_timeout_s)
        ev.compile_log, ev.compile_s = built.log, built.seconds
        if not built.ok or built.artifact is None:
            ev.status, ev.message = Status.COMPILE_ERROR, built.log
            return ev
        if self.config.static_checks:  # what the built library links and runs at load (the robust layer)
            findings = static_checks.check_artifact(self.target.rule_family, built.artifact, candidate)
            if findings:
                more = f"; also: {', '.join(sorted({f.rule for f in findings[1:]}))}" if len(findings) > 1 else ""
                ev.status, ev.message = Status.REJECTED, f"{findings[0]}{more}"
                return ev
        scratch = _shared_dir()
        self._last_artifact = built.artifact
        session = _Session(self, candidate, built.artifact, selected, scratch, references)
        try:
            session.run(timing, ev, with_speedup)
        finally:
            session.close()
            shutil.rmtree(scratch, ignore_errors=True)
        failed = next((r for r in ev.workloads if r.status not in (Status.PASSED, Status.SKIPPED)), None)
        if failed is not None:
            ev.status, ev.message = failed.status, f"{failed.workload}: {failed.message}"
        tampered = self.data.tampered()
        if tampered is not None:
            ev.status = Status.REJECTED
            ev.message = f"the kernel wrote outside its scratch directory (into the judge's inputs: {tampered})"
        if self.config.profile and timing and ev.status is Status.PASSED:
            self.progress(f"profile {candidate.id}")
            ev.profiles = profiling.profiles(self, candidate, built.artifact, selected)
        return ev

    def hidden_workloads(self, secret_seed: int, n: int = 4, like: list[Workload] | None = None) -> list[Workload]:
        """``n`` workloads the search never saw, drawn from the var axes' valid ranges with ``secret_seed``,
        each moving no more bytes than the largest of ``like`` (default: the task's workloads). See `hidden`."""
        return draw_hidden_workloads(self.definition, secret_seed, n, like or self.task.workloads)

    def _cpu_limit_s(self, n_workloads: int) -> int:
        """CPU seconds a worker may use (all threads): the wall-clock budget of its requests times the cores."""
        plan = self.config.timing
        wall = n_workloads * (self.config.timeout_s * (2 * len(self.config.seeds) + plan.warmup + 6)
                              + 4 * plan.max_time_s + self.config.timeout_s * plan.max_repeats) + 60
        return math.ceil(wall * (os.cpu_count() or 1))

    def start_worker(self, scratch: Path, artifact: Path, n_workloads: int, module: str = WORKER_MODULE) -> Worker:
        """A fresh worker that may write only its output files (``scratch/out.*``, created here, empty, for that
        reason) and read its build and the evaluation's inputs. ``module``: its program (a profiled worker's:
        `ksearch.eval.profiling`)."""
        scratch.mkdir(parents=True, exist_ok=True)
        outs = [scratch / f"out.{name}" for name in self.definition.outputs]
        for path in outs:
            path.touch()
        policy = self.config.sandbox
        if self.target.needs_gpu and not policy.gpu:  # the worker must reach the GPU's device nodes
            # Measured on the H200 (2026-11-29, bench/gpu/diag_cuda_worker.py --workers): CUDA initialises
            # only with the namespaces off AND seccomp off (either one alone gives cudaErrorOperatingSystem
            # at cudaGetDevice). Until the jail learns what the driver needs, GPU workers run with rlimits, a
            # scrubbed environment, no capabilities and no new privileges only (docs/evaluation.md). triton
            # needs seccomp off regardless: Triton's JIT runs ptxas and the C compiler as subprocesses.
            policy = policy.model_copy(update={"gpu": True, "namespaces": "off", "seccomp": False,
                                               "gpu_devices": self.target.gpu_devices, "gpu_env": self.target.gpu_env})
        if policy.cpu_s is None:
            policy = policy.model_copy(update={"cpu_s": self._cpu_limit_s(n_workloads)})
        evict = self.evict_library()
        readable = [Path(artifact).parent, self.data.root()] + ([evict.parent] if evict is not None else [])
        return Worker(scratch, policy, writable=outs, readable=list(dict.fromkeys(readable)), module=module)

    def checked_call(self, c: Contender, wl: Workload, seed: int, axes: dict[str, int],
                     res: WorkloadResult) -> tuple | None:
        """One untimed call of ``c`` on the inputs of ``seed``, its outputs compared with the reference; updates
        ``res``. Returns the case (see `_prepare`), or None when it failed (``res`` says why). Raises ExternalKill."""
        call = self._prepare(wl, seed, axes, c.out_dir)
        inputs, in_dir, want, args, out_paths, axes = call
        status, msg = self._call(c, args, self.config.timeout_s)
        if status is not Status.PASSED:
            res.status, res.message = status, msg
            return None
        status, msg = self.check_inputs(inputs, in_dir)
        a = r = float("nan")
        if status is Status.PASSED:
            used: list[float] = []
            status, msg, a, r = self.check_outputs(out_paths, want, axes, used=used, inputs=inputs)
            if used:
                res.tolerance_used = max(res.tolerance_used or 0.0, *used)
        res.checks += status is not Status.REJECTED
        res.max_abs_err = max(res.max_abs_err or 0.0, a) if not math.isnan(a) else a
        res.max_rel_err = max(res.max_rel_err or 0.0, r) if not math.isnan(r) else r
        if status is not Status.PASSED:
            res.status, res.message = status, f"seed {seed}: {msg}" if status is not Status.REJECTED else msg
            return None
        return call

    def _prepare(self, wl: Workload, seed: int, axes: dict[str, int], out_dir: Path) -> tuple:
        """Inputs, reference and poisoned outputs of one call: (inputs, input dir, want, args, output paths,
        axes)."""
        inputs, in_dir = self.inputs(wl, seed)
        want = self.reference(wl, seed, inputs)
        args, out_paths = self.write_args(inputs, in_dir, axes, out_dir)
        return inputs, in_dir, want, args, out_paths, axes

    # -- what the paired timing (`timing.RoundTimer`) uses --------------------------------------------

    def timing_seed(self, round_: int) -> int:
        """The input seed of a timing round: the run's timing seed plus the round (no check uses it)."""
        seed = self.config.seed_for_timing() + 7919 * round_
        while seed in self.config.seeds:
            seed += 1
        return seed

    def timing_case(self, wl: Workload, seed: int, axes: dict[str, int]) -> tuple:
        """The inputs of a timing round, as `_prepare`'s tuple without reference or outputs (they come later)."""
        inputs, in_dir = self.inputs(wl, seed)
        return inputs, in_dir, None, None, None, axes

    def timing_rounds_cap(self, wl: Workload) -> int:
        """The most timing rounds of ``wl`` (each round has its own input set, and its outputs are compared with
        that set's reference): as many sets as fit in ``timing_set_bytes`` and whose references take at most
        ``reference_budget_s`` to compute (once per run), and at least the rounds a paired decision needs
        (`timing.decision_rounds`) unless that many sets would take four times the memory budget."""
        d = self.definition
        axes = d.axis_values(wl)
        set_bytes = sum(math.prod(d.shape_of(spec, axes) or (1,)) * numpy_dtype(spec.dtype).itemsize
                        for spec in d.inputs.values() if spec.shape is not None)
        budget = self.config.timing_set_bytes or max(512 << 20, self.data.input_cache_bytes // 8)
        plan = self.config.timing
        least = decision_rounds(plan)
        by_memory = budget // max(set_bytes, 1)
        if by_memory < least and least * set_bytes > 4 * budget:  # a huge workload: no paired decision on it
            return max(1, by_memory)
        cap = min(plan.max_repeats, max(by_memory, least))
        ref_s = self.data.reference_seconds(wl)
        if ref_s:
            cap = min(cap, max(least, int(self.config.reference_budget_s / ref_s)))
        return cap

    def _poison(self, shape: tuple, dt: np.dtype) -> np.ndarray:
        """An output's poison (NaN, or `poison_byte` for other dtypes), made once per shape (read-only)."""
        key = (tuple(shape), dt.str)
        arr = self._poisons.get(key)
        if arr is None:
            arr = np.full(shape, np.nan, dt) if dt.kind == "f" else \
                np.full(math.prod(shape) * dt.itemsize, poison_byte(dt), np.uint8).view(dt).reshape(shape)
            arr.flags.writeable = False
            if len(self._poisons) >= 16:
                self._poisons.pop(next(iter(self._poisons)))
            self._poisons[key] = arr
        return arr

    def write_args(self, inputs: dict, in_dir: Path, axes: dict[str, int],
                   out_dir: Path) -> tuple[list[ArgRef], dict[str, Path]]:
        """ArgRefs of one call in ABI order, with NaN-poisoned output files written to ``out_dir/out.<name>``
        (the files a worker was started with: rewritten in place)."""
        d = self.definition
        args: list[ArgRef] = []
        for name, spec in d.inputs.items():
            value = inputs[name]
            if spec.shape is None:
                args.append(ScalarRef(value=value))
                continue
            path = in_dir / f"in.{name}"
            args.append(ArrayRef(path=str(path), dtype=value.dtype.str, shape=value.shape, writable=False))
        outs: dict[str, Path] = {}
        for name, spec in d.outputs.items():
            shape = d.shape_of(spec, axes) or ()
            dt = numpy_dtype(spec.dtype)
            path = out_dir / f"out.{name}"
            self._poison(shape, dt).tofile(path)
            outs[name] = path
            args.append(ArrayRef(path=str(path), dtype=dt.str, shape=tuple(shape), writable=True))
        args += [ScalarRef(value=int(axes[a])) for a in d.axes]
        return args, outs

    def check_inputs(self, inputs: dict, in_dir: Path) -> tuple[Status, str]:
        """Every input file bit for bit as written (a changed one is restored for the next candidate)."""
        for name, value in inputs.items():
            if isinstance(value, np.ndarray) and value.size:
                path = in_dir / f"in.{name}"
                if not same_bytes(path, value):  # bitwise, through a read-only mapping
                    self.data.write_input(value, path)  # restore it for the next candidate
                    return Status.REJECTED, f"the kernel modified its input {name!r}"
        return Status.PASSED, ""

    def _read_output(self, path: Path, spec, axes: dict[str, int]) -> np.ndarray | str:
        """An output file as an array of its spec's shape, or why it cannot be read (its size changed)."""
        shape = self.definition.shape_of(spec, axes) or ()
        dt = numpy_dtype(spec.dtype)
        size = path.stat().st_size if path.exists() else -1
        if size != math.prod(shape) * dt.itemsize:
            return f"the kernel changed its output file {path.name[4:]!r} ({size} bytes, expected " \
                   f"{math.prod(shape) * dt.itemsize})"
        # a copy, not a mapping: the worker could shrink the file after the size check, and reading a mapping past
        # a file's end kills this process (SIGBUS)
        return np.fromfile(path, dt).reshape(shape)

    def check_outputs(self, out_paths: dict[str, Path], want: dict, axes: dict[str, int],
                      errors: bool = True, used: list[float] | None = None,
                      inputs: dict | None = None) -> tuple[Status, str, float, float]:
        """Compare output files with the reference: (status, message, max abs error, max rel error); with
        ``errors=False`` the verdict only (the errors of a pass are NaN: see `compare`). ``used``: each output's
        share of its tolerance is appended to it (`compare`). A task with its own ``checker`` is judged by it on
        ``inputs`` (`_task_check`)."""
        if self.definition.checker is not None and inputs is not None:
            return self._task_check(out_paths, want, axes, inputs)
        worst_abs = worst_rel = 0.0
        for name, spec in self.definition.outputs.items():
            got = self._read_output(out_paths[name], spec, axes)
            if isinstance(got, str):
                return Status.REJECTED, got, float("nan"), float("nan")
            if spec.dtype in BIT_STORED:  # bfloat16 and float8 outputs are bits
                got = to_float64(got, spec.dtype)
            status, a, r, msg = compare(got, want[name], self.definition.tolerance_for(spec.dtype), errors, used)
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
            if status is not Status.PASSED:
                return status, f"output {name!r}: {msg}", worst_abs, worst_rel
        return Status.PASSED, "", worst_abs, worst_rel

    def _task_check(self, out_paths: dict[str, Path], want: dict, axes: dict[str, int],
                    inputs: dict) -> tuple[Status, str, float, float]:
        """The task's own check (`ksearch.tasks.generated.run_checker`, e.g. GPU MODE's ``check_implementation``)
        decides instead of the tolerance; a non-finite value where the reference is finite fails before it. The
        errors against the reference are reported beside its verdict."""
        from ksearch.tasks.generated import run_checker
        from ksearch.tasks.guard import task_code

        got: dict[str, np.ndarray] = {}
        worst_abs = worst_rel = 0.0
        for name, spec in self.definition.outputs.items():
            out = self._read_output(out_paths[name], spec, axes)
            if isinstance(out, str):
                return Status.REJECTED, out, float("nan"), float("nan")
            got[name] = out
            g = to_float64(out, spec.dtype)
            if g.shape == want[name].shape and not np.isfinite(g[np.isfinite(want[name])]).all():
                return Status.INCORRECT_NUMERICAL, f"output {name!r}: not finite where the reference is", \
                    float("nan"), float("nan")
            _, a, r, _ = compare(g, want[name], self.definition.tolerance_for(spec.dtype))
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        with task_code(f"the check of {self.definition.name!r} failed:", self.config.task_limit_s(),
                       late=f"the check of {self.definition.name!r} did not finish"):
            ok, msg = run_checker(self.definition, inputs, got)
        if not ok:
            return Status.INCORRECT_NUMERICAL, f"the task's own check failed: {msg}", worst_abs, worst_rel
        return Status.PASSED, "", worst_abs, worst_rel

    def evict_library(self) -> Path | None:
        """The target's cache-eviction library (`Target.evict_library`), asked once; None where it has none."""
        if self._evict is False:
            self._evict = self.target.evict_library()
        return self._evict  # type: ignore[return-value]

    def flush_bytes(self, wl: Workload) -> int:
        """Whether (non-zero) and how much to evict the caches before a timed cpu call: none when the workload's
        own data is already four times larger than the last-level cache (it cannot stay cached). The worker evicts
        the call's own buffers line by line (`evict_library`); only without that library does it write this many
        bytes instead: twice the last-level cache, at most `FLUSH_CAP_BYTES` (a VM's CPU may report its host's
        whole L3: 480 MB on a 2-core Xeon VM)."""
        key = (wl.uuid, id(self.hardware))
        if key not in self._flush_sizes:
            llc = self.hardware.last_level_cache_bytes() if self.hardware is not None else None
            self._flush_sizes[key] = self.config.timing.flush_bytes if not llc else \
                0 if self.definition.bytes_of(wl) >= 4 * llc else min(2 * llc, FLUSH_CAP_BYTES)
        return self._flush_sizes[key]

    def _call(self, c: Contender, args: list[ArgRef], timeout_s: float) -> tuple[Status, str]:
        """One untimed call. Raises ExternalKill when the worker was killed from outside."""
        try:
            reply = c.running.request(CallRequest(args=args), timeout_s)
        except WorkerStopped as e:
            raise ExternalKill(c.role, str(e)) from None
        except WorkerTimeout:
            return Status.TIMEOUT, f"the kernel did not return within {timeout_s:g} s (killed)"
        except WorkerDied as e:
            if killed_from_outside(e):
                raise ExternalKill(c.role, died_message(e)) from None
            return Status.RUNTIME_ERROR, died_message(e)
        except ProtocolViolation as e:
            return Status.REJECTED, str(e)
        if isinstance(reply, ErrorReply):
            return failure_status(reply), reply.error
        return Status.PASSED, ""

    def roofline_of(self, wl: Workload, res: WorkloadResult) -> None:
        """Fill ``res``'s achieved GB/s and, with a hardware spec, its floor, bound and % of floor."""
        if res.median_ms is None:
            return
        seconds = res.median_ms / 1e3
        res.achieved_gbs = self.definition.bytes_of(wl) / seconds / 1e9 if seconds > 0 else None
        if self.hardware is None:
            return
        cost = self.definition.cost_of(wl)  # FLOPs counted once per workload where the task gives none
        from ksearch.errors import HardwareError
        from ksearch.hardware.roofline import pct_of_floor, roofline

        try:
            roof = roofline(cost.bytes, cost.flops, cost.transcendentals, self.hardware, dtype=cost.flops_on)
        except HardwareError as e:  # the spec has no peak for the task's flops_on: no floor, the timing stands
            self.progress(f"{wl.name}: no roofline floor: {e}")
            return
        res.floor_ms, res.bound, res.floor_source = roof.floor_s * 1e3, roof.bound, cost.source
        res.pct_of_floor = pct_of_floor(seconds, roof.floor_s)


class _Session:
    """The workers of one evaluation: the candidate's (started per workload as needed: a crash costs only that
    workload) and its references' (started at the first timed workload, kept to the end)."""

    def __init__(self, judge: Evaluator, candidate: Candidate, artifact: Path, selected: list[Workload],
                 scratch: Path, references: list[Reference]):
        self.judge, self.candidate, self.artifact, self.selected = judge, candidate, artifact, selected
        self.scratch, self.references = scratch, references
        self.cand: Contender | None = None
        self.refs: list[Contender] | None = None
        self.samples: list[tuple] = []
        self.wait_left = judge.config.busy_wait_s
        self.meter = LoadMeter()  # the whole evaluation's: for a workload whose checks were too short to read
        self.own_dirs: list[Path] = []

    # -- workers ------------------------------------------------------------------------------------

    def _spawn(self, role: str, candidate: Candidate, artifact: Path) -> Contender:
        """Start a worker for ``candidate`` without waiting for it (its interpreter and jail take ~0.3 s: reference
        kernels' workers start while the candidate is compiled and checked)."""
        spare = self.judge.take_worker(artifact)
        if spare is not None:
            worker, out_dir = spare
            self.own_dirs.append(out_dir)
        else:
            out_dir = self.scratch / role
            worker = self.judge.start_worker(out_dir, artifact, len(self.selected))
        self.judge._used_workers += 1
        c = Contender(role, candidate.id, worker, device=False, out_dir=out_dir)
        c.spawned = (candidate, artifact, time.perf_counter())
        return c

    def _ready(self, c: Contender, ev: Evaluation | None) -> Contender:
        """Calibrate a spawned worker's empty round trip (before its kernel loads), then load the kernel; on
        failure ``c.failure`` says why. Raises ExternalKill."""
        judge = self.judge
        assert c.spawned is not None, "a contender is made ready once, after it was spawned"
        candidate, artifact, t_load = c.spawned
        c.spawned = None
        worker = c.running
        try:
            c.overhead = calibrate(worker)
            evict = judge.evict_library()
            reply = worker.request(LoadRequest(target=judge.target.name, artifact=str(artifact),
                                               evict=str(evict) if evict is not None else None, candidate=candidate,
                                               definition=judge.definition.model_dump(mode="json")), 60.0)
        except (WorkerDied, WorkerTimeout, ProtocolViolation) as e:
            worker.close()
            if isinstance(e, WorkerStopped) or isinstance(e, WorkerDied) and killed_from_outside(e):
                raise ExternalKill(c.role, str(e) if isinstance(e, WorkerStopped) else died_message(e)) from None
            status = Status.REJECTED if isinstance(e, ProtocolViolation) else Status.RUNTIME_ERROR
            c.failure = (status, f"loading the kernel: {died_message(e) if isinstance(e, WorkerDied) else e}")
            return c
        if ev is not None:
            ev.load_s = round((ev.load_s or 0.0) + time.perf_counter() - t_load, 3)
            ev.sandbox = _sandbox_summary(reply.sandbox or {})
        if isinstance(reply, ErrorReply):
            status = failure_status(reply)  # COMPILE_ERROR: cuda's NVRTC, triton's import
            if status is Status.COMPILE_ERROR and ev is not None:
                ev.compile_log = reply.error
            c.failure = (status, reply.error)
            worker.close()
            return c
        c.device = reply.device
        c.main_pid = worker_main_pid(worker.proc.pid)
        return c

    def spawn_references(self) -> None:
        """Build the reference kernels (cached builds) and start their workers, once per evaluation."""
        if self.refs is not None:
            return
        self.refs = []
        for ref in self.references:
            same = next((c for c in self.refs if c.candidate_id == ref.candidate.id), None)
            if same is not None:  # the parent is the best: one worker, a comparison for each role
                same.aliases += (ref.role,)
                continue
            built = self.judge.target.compile(ref.candidate, self.judge.definition, self.judge.config.compile_timeout_s)
            if not built.ok or built.artifact is None:
                self.refs.append(Contender(ref.role, ref.candidate.id, None, False, self.scratch / ref.role,
                                           failure=(Status.COMPILE_ERROR, built.log[:300])))
                continue
            self.refs.append(self._spawn(ref.role, ref.candidate, built.artifact))

    def _references(self) -> list[Contender]:
        """The reference kernels' workers, ready (spawned at the evaluation's start when it times anything)."""
        self.spawn_references()
        for r in self.refs or []:
            if r.failure is None and r.spawned is not None:
                self.judge.progress(f"reference {r.role} {r.candidate_id}: loading")
                self._ready(r, None)
        return [r for r in self.refs or [] if r.failure is None]

    def close(self) -> None:
        for c in [self.cand, *(self.refs or [])]:
            if c is not None and c.worker is not None:
                c.worker.close()
        for d in self.own_dirs:  # spares' scratch directories, outside the evaluation's
            shutil.rmtree(d, ignore_errors=True)

    # -- workloads ----------------------------------------------------------------------------------

    def run(self, timing: bool | str, ev: Evaluation, with_speedup: bool) -> None:
        judge = self.judge
        if self.references and any(timing if isinstance(timing, bool) else w.purpose == timing for w in self.selected):
            self.spawn_references()  # their workers start while the candidate's starts and is checked
        for wl in self.selected:
            if ev.workloads and judge.config.stop_on_failure and \
                    any(r.status not in (Status.PASSED, Status.SKIPPED) for r in ev.workloads):
                ev.workloads.append(WorkloadResult(workload=wl.label, status=Status.SKIPPED,
                                                   message="not run: an earlier workload failed"))
                continue
            timed = timing if isinstance(timing, bool) else wl.purpose == timing
            t_wl = time.perf_counter()
            result = self._workload(wl, timed, ev)
            result.wall_s = round(time.perf_counter() - t_wl, 3)
            if with_speedup and result.median_ms:
                result.speedup_vs_naive = self._speedup(wl, result)
            ev.workloads.append(result)
        if self.samples and self.references:  # workloads too short for the clock decide only when all are
            samples = [d for ok, d in self.samples if ok] or [d for _, d in self.samples]
            ev.paired = combine(samples, {r.role: r.candidate.id for r in self.references}, judge.config.timing)

    def _workload(self, wl: Workload, timed: bool, ev: Evaluation) -> WorkloadResult:
        """One workload, judged again on fresh workers once if a worker was killed from outside."""
        for attempt in (1, 2):
            try:
                return self._one(wl, timed, ev)
            except ExternalKill as e:
                ev.infra_faults.append(f"{wl.label}: the {e.role}'s worker was killed or stopped from outside the "
                                       f"judge ({str(e).splitlines()[0]}); judged again on a fresh worker")
                self.judge.progress(f"{wl.label}: a worker was killed or stopped from outside the judge; judging "
                                    "again")
                self._drop_workers(e.role, final=attempt == 2)
                if attempt == 2 and e.role == "candidate":
                    return WorkloadResult(workload=wl.label, status=Status.RUNTIME_ERROR,
                                          message=f"the worker was killed (or stopped) twice, on fresh workers ({e}); "
                                                  "out of memory? (the OOM killer sends SIGKILL)")
        return self._one(wl, timed, ev)  # a reference's worker was killed twice: it left; judge without it

    def _drop_workers(self, role: str, final: bool) -> None:
        """Close every worker after an outside kill; a reference killed a second time leaves the session."""
        if self.cand is not None:
            self.cand.running.close()
            self.cand = None
        for r in self.refs or []:
            if r.worker is not None:
                r.worker.close()
        if final and role != "candidate":
            gone = {r.candidate.id for r in self.references if r.role == role}
            self.references = [r for r in self.references if r.candidate.id not in gone]
        self.refs = None

    def _one(self, wl: Workload, timed: bool, ev: Evaluation) -> WorkloadResult:
        judge = self.judge
        if self.cand is None or self.cand.running.proc.poll() is not None:
            self.cand = self._ready(self._spawn("candidate", self.candidate, self.artifact), ev)
        res = WorkloadResult(workload=wl.label, status=Status.PASSED)
        if self.cand.failure is not None:
            res.status, res.message = self.cand.failure
            self.cand = None
            return res
        meter = LoadMeter()
        axes = judge.definition.axis_values(wl)
        call = None
        for seed in judge.config.seeds:
            judge.progress(f"check {wl.label} ({res.checks + 1}/{len(judge.config.seeds)})")
            call = judge.checked_call(self.cand, wl, seed, axes, res)
            if call is None:
                return self._failed(res)
        if not timed:
            return res
        refs = self._references()
        if self.cand.running.proc.poll() is not None:
            res.status, res.message = Status.RUNTIME_ERROR, "the worker exited after the checks"
            return self._failed(res)
        reading = meter.reading()
        if reading.window_s < MIN_LOAD_WINDOW_S:  # /proc/stat counts in 10 ms ticks: too short to tell
            reading = self.meter.reading()
        busy = self._quiet(wl, reading, ev)
        judge.progress(f"time {wl.label}" + (f" beside {', '.join(r.role for r in refs)}" if refs else ""))
        timer = RoundTimer(judge, wl, axes, [self.cand, *refs], judge.config.timing, judge.config.timeout_s, call,
                           calls=BUSY_CALLS if busy and refs else 1)
        meter = LoadMeter()
        timer.run(res, judge.timing_rounds_cap(wl))
        res.load_cores = round(meter.reading().busy_cores, 2)
        if res.status is not Status.PASSED:
            return self._failed(res)
        self.samples.append((res.resolved, timer.log_samples()))
        judge.roofline_of(wl, res)
        if judge.config.floor_check and res.pct_of_floor is not None and res.pct_of_floor > 100:
            self._below_floor(wl, axes, res)
        return res

    def _failed(self, res: WorkloadResult) -> WorkloadResult:
        if res.status in (Status.TIMEOUT, Status.RUNTIME_ERROR, Status.REJECTED) and self.cand is not None:
            self.cand.running.close()
            self.cand = None
        return res

    def _quiet(self, wl: Workload, reading, ev: Evaluation) -> bool:
        """Wait, with backoff, while other processes keep the machine busy (up to the evaluation's budget); True
        when it is still busy."""
        delay = 1.0
        while reading.busy and self.wait_left > 0:
            pause = min(delay, self.wait_left)
            self.judge.progress(f"machine busy ({reading.describe()}): waiting {pause:g} s before timing {wl.label}")
            meter = LoadMeter()
            time.sleep(pause)
            reading = meter.reading()
            self.wait_left -= pause
            ev.waited_s = round((ev.waited_s or 0.0) + pause, 1)
            delay *= 2
        if reading.busy:
            self.judge.progress(f"timing {wl.label} on a busy machine ({reading.describe()}); the paired rounds "
                                "(each kernel's faster of two calls) and their interval decide, the load is recorded")
        return reading.busy

    def _within_noise(self, res: WorkloadResult, before: str = "") -> bool:
        """Whether ``res``, under its floor, is under it by no more than the controller's clock can tell
        (`within_clock_noise`, the empty call's jitter); if so its message says so, after ``before``."""
        noise = self.cand.overhead.jitter_ms if self.cand is not None and self.cand.overhead is not None else 0.0
        if not within_clock_noise(res, noise):
            return False
        res.message = (f"{before}timed at {res.median_ms:.4g} ms, within the controller clock's noise ({noise:.3g} "
                       f"ms) of the roofline floor {res.floor_ms:.4g} ms: not held against it")
        return True

    def _below_floor(self, wl: Workload, axes: dict[str, int], res: WorkloadResult) -> None:
        """A time below the roofline floor: within the controller clock's noise of it, the time stands; else the
        ceiling that set the floor is measured again (`ksearch.hardware.reprobe`: a ceiling probed on a busy
        machine comes out low) and the noise asked again of the new floor; still below, the kernel is checked
        again on fresh inputs and timed alone on others; still below the floor, REJECTED, unless the re-probed
        ceiling itself could not be measured on a quiet machine (then the time stands, with a note)."""
        from ksearch.hardware.reprobe import reprobe

        assert self.cand is not None, "only the candidate's own timing is checked against the floor"
        if self._within_noise(res):
            return
        judge = self.judge
        first = f"{res.median_ms:.4g} ms ({res.pct_of_floor:.0f}% of the floor {res.floor_ms:.4g} ms)"
        judge.progress(f"suspect: {wl.label} below the roofline floor; measuring the {res.bound} ceiling again")
        assert judge.hardware is not None and res.bound is not None  # a floor was computed from them
        judge.hardware = reprobe(judge.hardware, res.bound)
        judge.roofline_of(wl, res)
        if res.pct_of_floor is None or res.pct_of_floor <= 100:
            res.message = (f"first timing {first} was below the roofline floor; the {res.bound} ceiling was measured "
                           f"again and the floor is now {res.floor_ms:.4g} ms")
            return
        if self._within_noise(res, f"first timing {first} was below the roofline floor; the {res.bound} ceiling was "
                                   "measured again; "):
            return
        first = f"{res.median_ms:.4g} ms ({res.pct_of_floor:.0f}% of the re-probed floor {res.floor_ms:.4g} ms)"
        judge.progress(f"suspect: {wl.label} below the roofline floor; re-verifying on fresh inputs")
        again = WorkloadResult(workload=wl.label, status=Status.PASSED)
        call = judge.checked_call(self.cand, wl, secrets.randbits(62), axes, again)
        res.checks += again.checks
        if call is None:
            res.status, res.message = again.status, again.message
            return
        fresh = secrets.randbits(40) << 20
        timer = RoundTimer(judge, wl, axes, [self.cand], judge.config.timing, judge.config.timeout_s, call,
                           seeds=lambda r: fresh + r)
        timer.run(again, judge.timing_rounds_cap(wl))
        if again.status is not Status.PASSED:
            res.status, res.message = again.status, again.message
            return
        judge.roofline_of(wl, again)
        if again.pct_of_floor is not None and again.pct_of_floor > 100 and getattr(judge.hardware, "provisional", None):
            res.message = (f"faster than the roofline floor twice (first {first}, then {again.median_ms:.4g} ms on fresh "
                           f"inputs), but the ceilings could not be measured on a quiet machine "
                           f"({judge.hardware.provisional}): not rejected on the floor alone")
        elif again.pct_of_floor is not None and again.pct_of_floor > 100:
            res.status = Status.REJECTED
            res.message = (f"faster than the roofline floor twice (first {first}, then {again.median_ms:.4g} ms on "
                           f"fresh inputs): the timing cannot be trusted")
        else:  # the fresh timing stands for the kernel's own figures; the paired comparisons stay as measured
            for field in ("median_ms", "min_ms", "spread", "ci_ms", "repeats", "floor_ms", "achieved_gbs",
                          "pct_of_floor", "resolved"):
                setattr(res, field, getattr(again, field))
            res.message = (f"first timing {first} was below the roofline floor; re-verified on fresh inputs and "
                           f"re-timed alone: {again.median_ms:.4g} ms")

    def _speedup(self, wl: Workload, res: WorkloadResult) -> float | None:
        """The candidate's speedup over the naive kernel on ``wl``: through a paired reference when there is one
        (the best first, so that a candidate found faster than the best scores above it; then the naive kernel
        itself, then the parent), else the naive kernel's stored time."""
        by_role = {r.role: r for r in self.references}
        order = sorted(res.paired, key=lambda p: (p.role != "best", by_role[p.role].speedups is not None))
        for p in order:
            ref = by_role[p.role]
            base = 1.0 if ref.speedups is None else ref.speedups.get(wl.label)
            if p.ratio and base:
                return base * p.ratio
        naive = self.judge.naive_ms.get(wl.label)
        return naive / res.median_ms if naive and res.median_ms else None


def _sandbox_summary(report: dict) -> dict:
    """The part of the worker's sandbox report worth keeping with every evaluation."""
    return {"namespaces": report.get("namespaces", []), "read_only_fs": report.get("read_only_fs", False),
            "view": report.get("view", []),
            "hidden": report.get("hidden", []), "capabilities": report.get("capabilities"),
            "seccomp": bool(report.get("seccomp")), "limits": report.get("limits", {}),
            "errors": report.get("errors", [])}
