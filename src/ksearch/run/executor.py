"""Where evaluations run: the executor behind the judge.

The controller hands an executor `JobSpec`s (a candidate, its workloads, the kernels it is timed beside) and
takes back events as the evaluations end, in whatever order they end: `Completed` (the host's `JobResult`) or
`Lost` (the host died or failed mid-evaluation: an infrastructure fault, never a verdict on the kernel).

- `InlineExecutor`: the controller's own judge, one evaluation at a time in this process (``--workers 1``, the
  default: a search as before executors existed).
- `LocalPool`: N eval hosts (`ksearch.run.host`), child processes of this one, each owning a device: on CPUs a
  disjoint set of cores, on GPUs one GPU each (`placements`). A host that dies is replaced.
- `ksearch.run.ray_executor.RayPool`: N eval hosts as Ray actors, on one machine or a cluster.

A candidate is timed beside its parent and the best on the same host (paired rounds in one judge session), so
hosts of different speed do not bias a verdict; the final stage runs in the controller's own judge.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Protocol

from ksearch.errors import ConfigError, SearchError, TaskError
from ksearch.run.host import HostSetup, JobResult, JobSpec, device_text, judge

if TYPE_CHECKING:
    from ksearch.eval.evaluator import Evaluator

#: executors a run may use (``--executor``)
EXECUTORS = ("local", "ray")
#: seconds a local host may take to start (import, judge, a GPU's context) before the run gives up on it
HOST_START_S = 120.0


@dataclass
class Completed:
    """An evaluation that ended (whatever its verdict) on ``worker``."""

    job: JobSpec
    result: JobResult
    worker: str


@dataclass
class Lost:
    """An evaluation whose host was lost (killed, crashed, its machine gone) or failed outside the judge."""

    job: JobSpec
    worker: str
    reason: str


Event = Completed | Lost


@dataclass
class WorkerState:
    """One worker as the progress display shows it: ``name``, ``device`` (``cpus 0-1``, ``gpu 0``, a Ray node),
    the job it runs (None: idle), its judge's last status line, since when (time.monotonic()) and how many
    evaluations it finished."""

    name: str
    device: str
    job: JobSpec | None = None
    stage: str = "idle"
    since: float = field(default_factory=time.monotonic)
    done: int = 0


class Executor(Protocol):
    """What the controller needs of an executor (see the module docstring)."""

    #: evaluations it can run at once
    slots: int

    def free(self, avoid: str | None = None) -> int:
        """Workers ready for a job now (other than ``avoid``)."""

    def busy(self) -> int:
        """Jobs submitted and not yet returned as events."""

    def workers(self) -> int:
        """Workers up or starting (not down for good): 0 means no job can run any more."""

    def submit(self, job: JobSpec, avoid: str | None = None) -> str:
        """Start ``job`` on a free worker (not ``avoid`` when another is free); returns the worker's name.
        Raises SearchError when no worker is free."""

    def wait(self, timeout_s: float) -> list[Event]:
        """Events that are ready, waiting up to ``timeout_s`` for the first (an empty list: none yet)."""

    def states(self) -> list[WorkerState]:
        """Every worker's state, for progress."""

    def close(self) -> None:
        """Stop the workers (jobs still running are abandoned; the run's store keeps them in flight)."""


class InlineExecutor:
    """The controller's own judge, in this process: a submitted job is judged by the next `wait`."""

    slots = 1

    def __init__(self, evaluator: "Evaluator"):
        self.evaluator = evaluator
        self._job: JobSpec | None = None
        self._state = WorkerState("local", "this process")

    def free(self, avoid: str | None = None) -> int:
        return 0 if self._job is not None or avoid == self._state.name else 1

    def busy(self) -> int:
        return 0 if self._job is None else 1

    def workers(self) -> int:
        return 1

    def submit(self, job: JobSpec, avoid: str | None = None) -> str:
        if self._job is not None:
            raise SearchError("the inline executor judges one candidate at a time")
        self._job = job
        self._state.job, self._state.since = job, time.monotonic()
        return self._state.name

    def wait(self, timeout_s: float) -> list[Event]:
        job, self._job = self._job, None
        if job is None:
            return []
        try:
            result = judge(self.evaluator, job, self._state.name)
        finally:
            self._state.job = None
        self._state.done += 1
        return [Completed(job, result, self._state.name)]

    def states(self) -> list[WorkerState]:
        return [self._state]

    def close(self) -> None:
        self._job = None


# -- placement --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where one host runs: CPU ids (None: anywhere) and a GPU (CUDA_VISIBLE_DEVICES value; None: none)."""

    cpus: tuple[int, ...] | None
    gpu: str | None = None

    def describe(self) -> str:
        return device_text(list(self.cpus) if self.cpus else None, self.gpu)


def split_cpus(cpus: list[int], n: int) -> list[tuple[int, ...]]:
    """``cpus`` in ``n`` disjoint, contiguous, near-equal parts (the first ones one CPU larger when they do not
    divide evenly). Raises ConfigError when there are fewer CPUs than parts."""
    if n > len(cpus):
        raise ConfigError(f"{n} workers need at least {n} CPUs; this process may use {len(cpus)} "
                          f"({', '.join(map(str, cpus))}): give --workers {max(1, len(cpus))} or fewer")
    base, extra = divmod(len(cpus), n)
    out, i = [], 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        out.append(tuple(cpus[i:i + size]))
        i += size
    return out


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES values: its own CUDA_VISIBLE_DEVICES list when set,
    else one per line of ``nvidia-smi -L``; empty when neither tells."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


def placements(n: int, needs_gpu: bool, cpus: list[int] | None = None, gpus: list[str] | None = None
               ) -> list[Placement]:
    """Where ``n`` hosts of one machine run: one GPU each for a GPU target (and an equal share of the CPUs, for
    its compiles), else a disjoint share of the CPUs each.

    Raises:
        ConfigError: more hosts than GPUs (a GPU target) or than CPUs.
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    shares = split_cpus(cpus, n)
    if not needs_gpu:
        return [Placement(s) for s in shares]
    gpus = visible_gpus() if gpus is None else gpus
    if n > len(gpus):
        raise ConfigError(f"{n} workers need {n} GPUs (one each); this machine shows {len(gpus)}"
                          + (f" ({', '.join(gpus)})" if gpus else " (no CUDA_VISIBLE_DEVICES, no nvidia-smi)"))
    return [Placement(s, gpus[i]) for i, s in enumerate(shares)]


# -- the local pool ------------------------------------------------------------------------------------------


class _Slot:
    """One local host process and what it is doing."""

    def __init__(self, index: int, placement: Placement):
        self.index, self.placement = index, placement
        self.proc: mp.process.BaseProcess | None = None
        self.conn = None
        self.ready = False
        self.state = WorkerState(f"w{index + 1}", placement.describe())


class LocalPool:
    """N eval hosts as child processes of this one (see the module docstring).

    Args:
        setup: the hosts' common `HostSetup` (each gets its placement, name and memory share).
        where: one `Placement` per host (`placements`).
        progress: called with a line when a host is lost or replaced.

    Raises:
        SearchError: a host did not start (the message has its error).
    """

    def __init__(self, setup: HostSetup, where: list[Placement], progress: Callable[[str], None] | None = None):
        self.setup = setup
        self.slots = len(where)
        self.progress = progress or (lambda msg: None)
        self._ctx = mp.get_context("spawn")  # no fork of a process that may hold threads, locks or a GPU context
        self._slots = [_Slot(i, p) for i, p in enumerate(where)]
        self._events: deque[Event] = deque()
        try:
            for s in self._slots:
                self._start(s)
            for s in self._slots:
                self._await_ready(s)
        except BaseException:
            self.close()
            raise

    def _setup_for(self, s: _Slot) -> str:
        return self.setup.model_copy(update={
            "cpus": list(s.placement.cpus) if s.placement.cpus else None, "gpu": s.placement.gpu,
            "share": self.slots, "name": s.state.name}).model_dump_json()

    def _start(self, s: _Slot) -> None:
        from ksearch.run.host import serve

        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=serve, args=(child, self._setup_for(s)), name=f"ksearch-host-{s.index + 1}",
                                 daemon=True)
        proc.start()
        child.close()
        s.proc, s.conn, s.ready = proc, parent, False
        s.state.job, s.state.stage, s.state.since = None, "starting", time.monotonic()

    def _await_ready(self, s: _Slot) -> None:
        assert s.conn is not None and s.proc is not None
        deadline = time.monotonic() + HOST_START_S
        while not s.ready:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SearchError(f"worker {s.state.name} ({s.state.device}) did not start within {HOST_START_S:g} s")
            if not s.conn.poll(min(left, 0.5)):
                if not s.proc.is_alive():
                    raise SearchError(f"worker {s.state.name} ({s.state.device}) died while starting "
                                      f"(exit code {s.proc.exitcode})")
                continue
            try:
                kind, text = s.conn.recv()
            except (EOFError, OSError):
                raise SearchError(f"worker {s.state.name} ({s.state.device}) died while starting "
                                  f"(exit code {s.proc.exitcode})") from None
            if kind == "error":
                raise SearchError(f"worker {s.state.name} ({s.state.device}) could not start: {text}")
            if kind == "ready":
                s.ready, s.state.stage = True, "idle"

    def free(self, avoid: str | None = None) -> int:
        return sum(1 for s in self._slots if s.ready and s.state.job is None and s.state.name != avoid)

    def busy(self) -> int:
        return sum(1 for s in self._slots if s.state.job is not None) + len(self._events)

    def workers(self) -> int:
        return sum(1 for s in self._slots if s.proc is not None)

    def submit(self, job: JobSpec, avoid: str | None = None) -> str:
        free = [s for s in self._slots if s.ready and s.state.job is None]
        if not free:
            raise SearchError("no free worker")
        s = next((f for f in free if f.state.name != avoid), free[0])
        assert s.conn is not None
        s.state.job, s.state.stage, s.state.since = job, f"{job.node_id}: sent", time.monotonic()
        try:
            s.conn.send(("job", job.model_dump_json()))
        except (OSError, BrokenPipeError):
            self._lose(s, "its pipe broke")
        return s.state.name

    def wait(self, timeout_s: float) -> list[Event]:
        if not self._events:
            waitables: list = []
            for s in self._slots:
                if s.conn is not None and s.proc is not None:
                    waitables += [s.conn, s.proc.sentinel]
            if waitables:
                wait_any(waitables, timeout=max(0.0, timeout_s))
            for s in self._slots:
                self._drain(s)
        out = list(self._events)
        self._events.clear()
        return out

    def _drain(self, s: _Slot) -> None:
        """Read what ``s`` has sent; a host that died is lost (its job re-queued by the controller) and replaced."""
        if s.conn is None or s.proc is None:
            return
        try:
            while s.conn.poll(0):
                kind, text = s.conn.recv()
                if kind == "stage":
                    s.state.stage = text
                elif kind == "ready":
                    s.ready, s.state.stage = True, "idle"
                elif kind == "error":  # a replacement that could not start: the slot stays down
                    self.progress(f"worker {s.state.name} could not start again: {text}")
                    self._stop(s)
                    return
                elif kind == "task-error":  # the task's reference (or generator, check) failed: the run stops
                    s.state.job, s.state.stage = None, "idle"
                    raise TaskError(text)
                elif kind in ("done", "failed") and s.state.job is not None:
                    job, s.state.job, s.state.stage = s.state.job, None, "idle"
                    if kind == "done":
                        s.state.done += 1
                        self._events.append(Completed(job, JobResult.model_validate_json(text), s.state.name))
                    else:
                        self._events.append(Lost(job, s.state.name, f"the host failed: {text.strip()[-500:]}"))
        except (EOFError, OSError):
            pass
        if not s.proc.is_alive():
            self._lose(s, f"its process ended (exit code {s.proc.exitcode})")

    def _lose(self, s: _Slot, why: str) -> None:
        job = s.state.job
        if job is not None:
            self._events.append(Lost(job, s.state.name, why))
        self.progress(f"worker {s.state.name} ({s.state.device}) lost: {why}; starting a new one")
        self._stop(s)
        self._start(s)  # its "ready" arrives later; until then the slot is not free

    def _stop(self, s: _Slot) -> None:
        if s.conn is not None:
            try:
                s.conn.send(("stop", ""))
            except (OSError, BrokenPipeError):
                pass
            s.conn.close()
        if s.proc is not None:
            s.proc.join(timeout=0.5)
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join(timeout=5)
        s.conn, s.proc, s.ready = None, None, False
        s.state.job, s.state.stage = None, "down"

    def states(self) -> list[WorkerState]:
        return [s.state for s in self._slots]

    def pids(self) -> dict[str, int | None]:
        """Worker name -> its host's process id (tests and diagnostics)."""
        return {s.state.name: s.proc.pid if s.proc is not None else None for s in self._slots}

    def close(self) -> None:
        for s in self._slots:
            self._stop(s)


def check_placement(cfg, needs_gpu: bool) -> None:
    """Refuse, before a run exists (or a resumed run's settings change), a placement that cannot start: an unknown
    executor, ``ray_address`` without Ray, more local workers than this machine has CPUs (or GPUs, for a GPU
    target), Ray not installed, a Ray Client address (``ray://``) without Ray Client. What only a running cluster
    can tell (its GPUs, whether it answers) is found when the workers start.

    Raises:
        ConfigError: the first of those problems, in words a user can act on.
    """
    if cfg.executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {cfg.executor!r}: use one of {', '.join(EXECUTORS)}")
    if cfg.ray_address and cfg.executor != "ray":
        raise ConfigError("--ray-address is for --executor ray")
    if cfg.executor == "local":
        if cfg.workers > 1:
            placements(cfg.workers, needs_gpu)
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError('--executor ray needs Ray: pip install -e ".[ray]" (or pip install ray)') from None
    if (cfg.ray_address or "").startswith("ray://"):
        try:
            import grpc  # noqa: F401  (what Ray Client needs beyond Ray itself)
        except ImportError:
            raise ConfigError(f"--ray-address {cfg.ray_address} is a Ray Client address, which needs "
                              '"ray[client]": pip install "ray[client]"') from None


def make_executor(cfg, evaluator: "Evaluator", naive, progress: Callable[[str], None] | None = None) -> Executor:
    """The executor of a run: ``cfg`` (a `RunConfig`) says ``executor`` (local | ray), ``workers`` and
    ``ray_address``; ``evaluator``: the controller's judge (the inline executor's, and where the hardware spec
    comes from); ``naive``: the naive kernel's Evaluation (the hosts' speedups).

    Raises:
        ConfigError: more workers than this machine has devices for, an unknown executor, Ray not installed.
        SearchError: a host did not start.
    """
    if cfg.executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {cfg.executor!r}: use one of {', '.join(EXECUTORS)}")
    if cfg.executor == "local" and cfg.workers == 1:
        return InlineExecutor(evaluator)
    hw = getattr(evaluator, "hardware", None)
    setup = HostSetup(run=cfg.model_dump(mode="json"), hardware=hw.model_dump(mode="json") if hw is not None else None,
                      naive=naive)
    needs_gpu = bool(getattr(evaluator.target, "needs_gpu", False))
    if cfg.executor == "ray":
        from ksearch.run.ray_executor import RayPool

        return RayPool(setup, cfg.workers, needs_gpu, address=cfg.ray_address, progress=progress)
    return LocalPool(setup, placements(cfg.workers, needs_gpu), progress)
