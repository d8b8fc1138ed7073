"""Eval hosts as Ray actors (``--executor ray``; ``pip install -e ".[ray]"``).

`RayPool` starts N actors, each an eval host (`ksearch.run.host.Host`) that owns a device: an actor of a GPU
target asks Ray for one GPU (``num_gpus=1``: Ray sets its CUDA_VISIBLE_DEVICES), and every actor for a share of
its node's CPUs (``num_cpus``), which it is then pinned to, disjoint from the other actors of that node. Jobs and
results travel as the judge's typed records in JSON text; the actors compile and judge where they run. Without
``address`` the pool starts a Ray cluster on this machine for the run (and stops it after); with one (``auto``
for the cluster `ray start` runs here, or ``ray://HOST:10001``) it joins that cluster, whose every node must have
ksearch installed (and a task given by path at the same path).

An actor that dies (killed, its node gone) fails its job as `Lost` (the controller sends it again, once, then
fails it) and is replaced without holding up the others: the replacement starts while the other actors judge, and
one that Ray cannot place within `REPLACE_S` (no node left with the CPUs or GPU it asks for) is given up, the run
going on with one worker fewer. Two Ray nodes on one machine share its CPUs: actors are pinned to CPUs no other
actor of the same host (by hostname) holds. The actors' status lines reach the progress display through a small actor of their own
(`_Stages`), fire-and-forget: a slow or lost one never holds up a judge.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from ksearch.errors import ConfigError, SearchError, TaskError
from ksearch.run.executor import HOST_START_S, Completed, Event, Lost, WorkerState
from ksearch.run.host import HostSetup, JobResult, JobSpec, device_text

#: seconds a replacement actor may wait for Ray to place it (a node with the CPUs or GPU it asks for) before the
#: pool gives it up and goes on with one worker fewer
REPLACE_S = 60.0


class _Stages:
    """Ray actor: the last status line of every host (name -> line)."""

    def __init__(self):
        self.lines: dict[str, str] = {}

    def set(self, name: str, line: str) -> None:
        self.lines[name] = line

    def get(self) -> dict[str, str]:
        return dict(self.lines)


class _HostActor:
    """Ray actor: one eval host. `where` first (the executor assigns its CPUs from the answer), then `start`."""

    def __init__(self, stages=None):
        self.host = None
        self.stages = stages

    def where(self) -> dict:
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "cpus": sorted(os.sched_getaffinity(0)),
                "pid": os.getpid(), "hostname": socket.gethostname(),
                "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def start(self, setup_json: str) -> str:
        from ksearch.run.host import Host

        setup = HostSetup.model_validate_json(setup_json)
        stages, name = self.stages, setup.name

        def progress(msg: str) -> None:
            if stages is not None:
                stages.set.remote(name, msg[:200])

        self.host = Host(setup, progress=progress)
        return device_text(setup.cpus, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def evaluate(self, job_json: str) -> str:
        assert self.host is not None, "start the host first"
        t0 = time.monotonic()
        result = self.host.evaluate(JobSpec.model_validate_json(job_json))
        result.evaluation.wall_s = result.evaluation.wall_s or round(time.monotonic() - t0, 3)
        return result.model_dump_json()


class _Worker:
    """One actor slot: the actor, where it runs, its job (and the Ray reference of its result)."""

    def __init__(self, index: int):
        self.index = index
        self.actor = None
        self.info: dict = {}
        self.ref = None
        self.boot = None  # a replacement starting: the Ray reference of its `where` (then `start`) call
        self.boot_step = ""  # "where" | "start"
        self.boot_until = 0.0  # time.monotonic() by which that call must answer
        self.state = WorkerState(f"w{index + 1}", "starting")

    @property
    def ready(self) -> bool:
        return self.actor is not None and self.boot is None and self.ref is None


class RayPool:
    """N eval hosts as Ray actors (see the module docstring).

    Args:
        setup: the hosts' common `HostSetup`.
        n: actors (workers).
        needs_gpu: one GPU per actor.
        address: the cluster to join (None: start one here for the run).
        progress: called with a line when an actor is lost or replaced.

    Raises:
        ConfigError: Ray is not installed; the cluster has fewer GPUs (or CPUs) than the actors need.
        SearchError: an actor did not start (with its error).
    """

    def __init__(self, setup: HostSetup, n: int, needs_gpu: bool, address: str | None = None,
                 progress: Callable[[str], None] | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError('--executor ray needs Ray: pip install -e ".[ray]" (or pip install ray)') from None
        self._ray = ray
        self.setup, self.slots, self.needs_gpu = setup, n, needs_gpu
        self.progress = progress or (lambda msg: None)
        self._started = False
        if not ray.is_initialized():
            kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": "warning"}
            if address is None:
                kwargs["num_cpus"] = len(os.sched_getaffinity(0))
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"cannot reach the Ray cluster {address or '(a new one here)'}: {e}") from None
            self._started = True
        try:
            self._plan()
            self._stages = ray.remote(num_cpus=0)(_Stages).options(  # on the driver's node: lost with the run only
                scheduling_strategy=_here(ray)).remote()
            self._workers = [_Worker(i) for i in range(n)]
            for w in self._workers:
                self._spawn(w)
            for w in self._workers:
                self._start(w)
        except BaseException:
            self.close()
            raise

    def _plan(self) -> None:
        """CPUs per actor. A GPU target's actors go to the nodes with GPUs: each gets its GPU's share of the CPUs of
        the GPU node that has the fewest per GPU (a CPU-only head node counts for nothing). A CPU target's actors
        share the cluster's CPUs equally, no more than the largest node has (an actor lives on one node).

        Raises:
            ConfigError: fewer GPUs (GPU target) or CPUs than the actors need.
        """
        res = self._ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
        nodes = [(int(nd.get("Resources", {}).get("CPU", 0)), int(nd.get("Resources", {}).get("GPU", 0)))
                 for nd in self._ray.nodes() if nd.get("Alive")]
        if self.needs_gpu:
            if gpus < self.slots:
                raise ConfigError(f"{self.slots} workers need {self.slots} GPUs (one each); the Ray cluster has "
                                  f"{gpus}")
            per = max(1, min((c // g for c, g in nodes if g > 0), default=1))
        else:
            per = max(1, min(cpus // max(1, self.slots), max((c for c, _ in nodes), default=cpus)))
            if per * self.slots > cpus:
                raise ConfigError(f"{self.slots} workers need at least {self.slots} CPUs; the Ray cluster has {cpus}")
        self.cpus_each = per

    def _spawn(self, w: _Worker) -> None:
        opts: dict = {"num_cpus": self.cpus_each, "max_restarts": 0, "max_concurrency": 1}
        if self.needs_gpu:
            opts["num_gpus"] = 1
        w.actor = self._ray.remote(**opts)(_HostActor).remote(self._stages)
        w.ref, w.state.job, w.state.stage, w.state.since = None, None, "starting", time.monotonic()

    def _start(self, w: _Worker) -> None:
        """Ask the actor where it runs, give it CPUs of its host no other actor holds, and start its host (waiting:
        the pool's first actors)."""
        ray = self._ray
        try:
            info = ray.get(w.actor.where.remote(), timeout=HOST_START_S)
            device = ray.get(w.actor.start.remote(self._setup_for(w, info)), timeout=HOST_START_S)
        except ray.exceptions.GetTimeoutError:
            raise SearchError(f"Ray worker {w.state.name} did not start within {HOST_START_S:g} s (is the "
                              "cluster short of the CPUs or GPUs it asks for?)") from None
        except ray.exceptions.RayError as e:
            raise SearchError(f"Ray worker {w.state.name} could not start: {_short(e)}") from None
        self._started_on(w, device)

    def _setup_for(self, w: _Worker, info: dict) -> str:
        """The `HostSetup` (JSON) of ``w``, now known to run as ``info`` (`_HostActor.where`): CPUs of its host that
        no other actor holds (two Ray nodes on one machine share its CPUs), its share of them."""
        w.info = info
        taken = {c for o in self._workers if o is not w and o.info.get("hostname") == info["hostname"]
                 for c in o.info.get("assigned", ())}
        free = [c for c in info["cpus"] if c not in taken]
        info["assigned"] = free[:self.cpus_each] or info["cpus"][:self.cpus_each]
        setup = self.setup.model_copy(update={"cpus": info["assigned"], "gpu": None, "name": w.state.name,
                                              "share": max(1, len(info["cpus"]) // self.cpus_each)})
        return setup.model_dump_json()

    def _started_on(self, w: _Worker, device: str) -> None:
        w.boot, w.boot_step = None, ""
        w.state.device = f"{w.info['hostname']} {device}"
        w.state.stage, w.state.since = "idle", time.monotonic()

    def free(self, avoid: str | None = None) -> int:
        return sum(1 for w in self._workers if w.ready and w.state.name != avoid)

    def busy(self) -> int:
        return sum(1 for w in self._workers if w.ref is not None)

    def workers(self) -> int:
        return sum(1 for w in self._workers if w.actor is not None)

    def submit(self, job: JobSpec, avoid: str | None = None) -> str:
        free = [w for w in self._workers if w.ready]
        if not free:
            raise SearchError("no free worker")
        w = next((f for f in free if f.state.name != avoid), free[0])
        self._stages.set.remote(w.state.name, f"{job.node_id}: sent")  # not the last job's last line
        w.ref = w.actor.evaluate.remote(job.model_dump_json())
        w.state.job, w.state.stage, w.state.since = job, f"{job.node_id}: sent", time.monotonic()
        return w.state.name

    def wait(self, timeout_s: float) -> list[Event]:
        """Events of the jobs that ended, waiting up to ``timeout_s`` for the first; replacements starting advance
        meanwhile (and are given up past their deadline)."""
        ray = self._ray
        running = {w.ref: w for w in self._workers if w.ref is not None}
        booting = {w.boot: w for w in self._workers if w.boot is not None}
        if not running and not booting:
            return []
        if booting:  # wake up by the first replacement's deadline
            timeout_s = min(timeout_s, max(0.0, min(w.boot_until for w in booting.values()) - time.monotonic()))
        refs = [*running, *booting]
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout_s))
        if ready:  # and whatever else is ready now
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        events: list[Event] = []
        for ref in ready:
            if ref in booting:
                self._boot(booting[ref], ref)
                continue
            w = running[ref]
            job = w.state.job
            assert job is not None
            w.ref, w.state.job, w.state.stage = None, None, "idle"
            try:
                events.append(Completed(job, JobResult.model_validate_json(ray.get(ref)), w.state.name))
                w.state.done += 1
            except ray.exceptions.RayActorError as e:  # the actor died (its process, or its node) or is unreachable
                events.append(Lost(job, w.state.name, f"the Ray actor died: {_short(e)}"))
                self._replace(w)
            except ray.exceptions.RayError as e:  # the host raised: a fault of the host, not a verdict
                if isinstance(getattr(e, "cause", None), TaskError):  # the task's own code: the run's error
                    raise TaskError(str(e.cause)) from None
                events.append(Lost(job, w.state.name, f"the host failed: {_short(e)}"))
        now = time.monotonic()
        for w in self._workers:
            if w.boot is not None and w.boot not in ready and now >= w.boot_until:
                what = ("placed (no node has the CPUs or GPU it asks for)" if w.boot_step == "where"
                        else "started")
                limit = REPLACE_S if w.boot_step == "where" else HOST_START_S
                self._give_up(w, f"was not {what} within {limit:g} s")
        self._refresh_stages()
        return events

    def _replace(self, w: _Worker) -> None:
        """A new actor for ``w``, started while the others judge (`wait` advances it)."""
        self.progress(f"worker {w.state.name} ({w.state.device}) lost; starting a new Ray actor")
        try:
            self._ray.kill(w.actor)
        except Exception:  # already gone
            pass
        w.info = {}
        self._spawn(w)
        w.boot, w.boot_step, w.boot_until = w.actor.where.remote(), "where", time.monotonic() + REPLACE_S
        w.state.stage = "waiting for Ray to place it"

    def _boot(self, w: _Worker, ref) -> None:
        """The next step of a replacement whose call ``ref`` answered: placed, it is started; started, it is free."""
        ray = self._ray
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayError as e:
            self._give_up(w, f"could not start: {_short(e)}")
            return
        if w.boot_step == "where":
            w.boot = w.actor.start.remote(self._setup_for(w, answer))
            w.boot_step, w.boot_until = "start", time.monotonic() + HOST_START_S
            w.state.stage = f"starting on {answer['hostname']}"
            return
        self._started_on(w, answer)
        self.progress(f"worker {w.state.name} is back on {w.state.device}")

    def _give_up(self, w: _Worker, why: str) -> None:
        """``w``'s replacement is dropped for good: the pool goes on with the others."""
        try:
            self._ray.kill(w.actor)  # a pending actor would otherwise take a node's CPUs whenever one comes
        except Exception:
            pass
        w.actor, w.boot, w.boot_step, w.info = None, None, "", {}
        w.state.stage, w.state.device = "down", "(none)"
        self.progress(f"worker {w.state.name}'s new Ray actor {why}; going on with {self.workers()} "
                      f"worker{'s' if self.workers() != 1 else ''}")

    def _refresh_stages(self) -> None:
        try:
            lines = self._ray.get(self._stages.get.remote(), timeout=1.0)
        except Exception:  # progress only
            return
        for w in self._workers:
            if w.state.job is not None and w.state.name in lines:
                w.state.stage = lines[w.state.name]

    def states(self) -> list[WorkerState]:
        return [w.state for w in self._workers]

    def pids(self) -> dict[str, int | None]:
        """Worker name -> its actor's process id on its node (tests and diagnostics)."""
        return {w.state.name: w.info.get("pid") for w in self._workers}

    def nodes(self) -> dict[str, str | None]:
        """Worker name -> the Ray node id its actor runs on (None: down or not placed yet)."""
        return {w.state.name: w.info.get("node") for w in self._workers}

    def close(self) -> None:
        for w in getattr(self, "_workers", []):
            if w.actor is not None:
                try:
                    self._ray.kill(w.actor)
                except Exception:  # already gone
                    pass
                w.actor, w.ref, w.boot = None, None, None
        if self._started:
            self._ray.shutdown()
            self._started = False


def _here(ray):
    """A scheduling strategy for this driver's own node (soft: anywhere when that node cannot take it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
