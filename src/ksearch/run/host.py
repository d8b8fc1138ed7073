"""An eval host: one process that owns one device (a set of CPU cores, or one GPU) and judges the candidates an
executor sends it, with a judge of its own (`ksearch.eval.evaluator.Evaluator`) that keeps its inputs and
reference outputs between evaluations and compiles where the candidate runs.

What reaches a host and what comes back are typed records (`HostSetup`, `JobSpec`, `JobResult`, the judge's
`Evaluation`), sent as JSON text, so a host may be a process of this machine (`ksearch.run.executor.LocalPool`)
or a Ray actor on another one (`ksearch.run.ray_executor`): nothing in the search assumes the host is local.

Placement (`place`): a host pinned to CPUs runs on those alone (``sched_setaffinity``; the judge's load meter,
its per-round CPU pinning and the kernels' OpenMP threads then keep to them, and ``OMP_NUM_THREADS`` is set to
their number); a host given a GPU sees that GPU alone (``CUDA_VISIBLE_DEVICES``, set before CUDA starts).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import traceback
from collections.abc import Callable

from pydantic import BaseModel, Field

from ksearch.errors import TaskError
from ksearch.eval.timing import Reference
from ksearch.records import Candidate, Evaluation, Status


class HostSetup(BaseModel):
    """Everything a host needs to judge a run's candidates.

    ``run``: the run's `RunConfig` as JSON (task, target, judge settings: the host's judge is the search's,
    `Controller.eval_config`); ``hardware``: the run's HardwareSpec as JSON (roofline figures; None: none);
    ``naive``: the naive kernel's evaluation (its times, for speedups); ``cpus``: CPU ids to run on (None: as
    started); ``gpu``: the value of CUDA_VISIBLE_DEVICES (None: as started); ``share``: hosts sharing this
    machine's memory (the judge's input and reference caches are divided among them); ``name``: the host's name
    in progress lines and fault records."""

    run: dict
    hardware: dict | None = None
    naive: Evaluation | None = None
    cpus: list[int] | None = None
    gpu: str | None = None
    share: int = Field(default=1, ge=1)
    name: str = "host"


class RefSpec(BaseModel):
    """A kernel timed beside the candidate (`ksearch.eval.timing.Reference`) as a record."""

    role: str
    candidate: Candidate
    speedups: dict[str, float] | None = None

    @classmethod
    def of(cls, ref: Reference) -> "RefSpec":
        return cls(role=ref.role, candidate=ref.candidate, speedups=ref.speedups)

    def reference(self) -> Reference:
        return Reference(self.role, self.candidate, self.speedups)


class JobSpec(BaseModel):
    """One evaluation to run: ``node_id``'s ``candidate`` on ``workloads`` (None: the run's), timed as ``timing``
    says (`Evaluator.evaluate`), beside ``references``; ``retime``: the planner asked for a tried node's kernel
    again; ``key``: unique per dispatch (node and candidate)."""

    key: str
    node_id: str
    candidate: Candidate
    workloads: list[str] | None = None
    timing: bool | str = True
    references: list[RefSpec] = Field(default_factory=list)
    retime: bool = False


class JobResult(BaseModel):
    """A host's answer: the job's key, the `Evaluation`, the host's name, and its hardware spec when its judge
    measured a ceiling again during the job (a time below the roofline floor), else None."""

    key: str
    evaluation: Evaluation
    host: str
    hardware: dict | None = None


def judge(evaluator, job: JobSpec, host: str) -> JobResult:
    """``job`` judged by ``evaluator`` (an `Evaluator`, or anything with its ``evaluate`` and ``hardware``): a bad
    kernel is the Evaluation's status, never an exception. The result carries the judge's hardware spec when the
    evaluation changed it (a ceiling measured again before a time below the roofline floor was held against it)."""
    before = getattr(evaluator, "hardware", None)
    ev = evaluator.evaluate(job.candidate, job.workloads, job.timing,
                            references=[r.reference() for r in job.references])
    hw = getattr(evaluator, "hardware", None)
    changed = hw.model_dump(mode="json") if hw is not None and hw is not before else None
    return JobResult(key=job.key, evaluation=ev, host=host, hardware=changed)


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a controller killed with kill -9 leaves no host
    judging for nobody); exits at once if the parent is already gone. A no-op where prctl is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(1)


def place(cpus: list[int] | None, gpu: str | None) -> None:
    """Pin this process (and what it starts) to ``cpus`` and show it only ``gpu`` (see the module docstring).

    Raises:
        OSError: the CPUs cannot be taken (not in this machine, or not allowed here).
    """
    if cpus:
        os.sched_setaffinity(0, set(cpus))
        os.environ["OMP_NUM_THREADS"] = str(len(cpus))
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def device_text(cpus: list[int] | None, gpu: str | None) -> str:
    """``cpus 0-3`` / ``gpu 1, cpus 8-15`` for progress lines."""
    parts = []
    if gpu is not None:
        parts.append(f"gpu {gpu}")
    if cpus:
        runs, start = [], cpus[0]
        for a, b in zip(cpus, cpus[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        parts.append("cpus " + ",".join(runs))
    return ", ".join(parts) or "this machine"


class Host:
    """The judge of one host (see the module docstring). ``progress``: called with the judge's short status
    lines (the host's current stage, for the executor's progress display).

    Raises (from the constructor): OSError from `place`; TaskError when the task does not load here."""

    def __init__(self, setup: HostSetup, progress: Callable[[str], None] | None = None):
        from ksearch.eval.casedata import default_input_cache_bytes
        from ksearch.eval.evaluator import Evaluator
        from ksearch.hardware.spec import HardwareSpec
        from ksearch.run.controller import Controller, RunConfig
        from ksearch.tasks import load_task

        place(setup.cpus, setup.gpu)
        self.setup = setup
        self.name = setup.name
        self.stage = "starting"
        self._progress = progress or (lambda msg: None)
        cfg = RunConfig.model_validate(setup.run)
        ecfg = Controller.eval_config(cfg)
        if setup.share > 1:  # hosts of one machine share its memory: each keeps its part of the caches
            ecfg.input_cache_bytes = default_input_cache_bytes() // setup.share
            ecfg.reference_cache_bytes = ecfg.reference_cache_bytes // setup.share
        hw = HardwareSpec.model_validate(setup.hardware) if setup.hardware else None
        self.evaluator = Evaluator(load_task(cfg.task, workloads=cfg.workloads_file), cfg.target, hw, ecfg, progress=self._stage)
        if setup.naive is not None:
            self.evaluator.remember_naive(setup.naive)
        self.stage = "idle"

    def _stage(self, msg: str) -> None:
        self.stage = msg
        self._progress(msg)

    def evaluate(self, job: JobSpec) -> JobResult:
        """Judge one job (`judge`); an exception here is the host's own failure (the executor records it as an
        infrastructure fault)."""
        self._stage(f"{job.node_id}: judging {job.candidate.id}")
        try:
            return judge(self.evaluator, job, self.name)
        finally:
            self.stage = "idle"

    def close(self) -> None:
        self.evaluator.close()


# -- a host as a child process of this machine (the LocalPool's) ------------------------------------------


def serve(conn, setup_json: str) -> None:
    """The main function of a local host process: set up, then answer jobs on ``conn`` (a multiprocessing
    connection) until it closes or says stop. Messages are (kind, text) tuples: from the executor ``("job",
    JobSpec JSON)`` and ``("stop", "")``; to it ``("ready", device text)`` or ``("error", why)`` once, then per
    job any number of ``("stage", line)`` and one ``("done", JobResult JSON)``, ``("failed", traceback)`` or
    ``("task-error", message)`` (the task's own code failed: the executor raises it as a TaskError)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle; it stops the hosts
    setup = HostSetup.model_validate_json(setup_json)

    def send(kind: str, text: str) -> None:
        try:
            conn.send((kind, text))
        except (OSError, EOFError, BrokenPipeError):
            os._exit(0)  # the executor is gone

    try:
        host = Host(setup, progress=lambda msg: send("stage", msg[:200]))
    except Exception as e:  # the executor reports why the host could not start
        send("error", f"{type(e).__name__}: {e}")
        return
    send("ready", device_text(setup.cpus, setup.gpu))
    try:
        while True:
            try:
                kind, text = conn.recv()
            except (EOFError, OSError):
                return
            if kind == "stop":
                return
            t0 = time.monotonic()
            try:
                result = host.evaluate(JobSpec.model_validate_json(text))
            except TaskError as e:  # the task's own code failed or hung: the run's error, never the kernel's
                send("task-error", str(e))
                continue
            except Exception:  # a fault of the host, not a verdict on the kernel
                send("failed", traceback.format_exc(limit=8)[-4000:])
                continue
            result.evaluation.wall_s = result.evaluation.wall_s or round(time.monotonic() - t0, 3)
            send("done", result.model_dump_json())
    finally:
        host.close()


def failed_evaluation(job: JobSpec, task: str, target: str, why: str) -> Evaluation:
    """The evaluation recorded for a job whose host was lost (or failed) twice: RUNTIME_ERROR, saying it was not
    judged."""
    return Evaluation(candidate_id=job.candidate.id, task=task, target=target, status=Status.RUNTIME_ERROR,
                      message=f"infrastructure: the host judging this kernel was lost or failed twice; not judged "
                              f"({why})")
