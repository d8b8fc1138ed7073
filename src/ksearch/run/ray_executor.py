"""Eval hosts as Ray actors (``--executor ray``; ``pip install -e ".[ray]"``).

`RayPool` starts N actors, each an eval host (`ksearch.run.host.Host`) that owns a device: an actor of a GPU
target asks Ray for one GPU (``num_gpus=1``: Ray sets its CUDA_VISIBLE_DEVICES), and every actor for a share of
its node's CPUs (``num_cpus``), which it is then pinned to, disjoint from the other actors of that node. Jobs and
results travel as the judge's typed records in JSON text; the actors compile and judge where they run. Without
``address`` the pool starts a Ray cluster on this machine for the run (and stops it after); with one (``auto``
for the cluster `ray start` runs here, or ``ray://HOST:10001``) it joins that cluster, whose every node must have
ksearch installed (and a task given by path at the same path).

An actor that dies (killed, its node gone) fails its job as `Lost` (the controller sends it again, once, then
fails it) and is replaced. The actors' status lines reach the progress display through a small actor of their own
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
        self.state = WorkerState(f"w{index + 1}", "starting")


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
            self._stages = ray.remote(num_cpus=0)(_Stages).remote()
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
        """Ask the actor where it runs, give it CPUs of its node no other actor holds, and start its host."""
        ray = self._ray
        try:
            w.info = ray.get(w.actor.where.remote(), timeout=HOST_START_S)
            taken = {c for o in self._workers if o is not w and o.info.get("node") == w.info["node"]
                     for c in o.info.get("assigned", ())}
            free = [c for c in w.info["cpus"] if c not in taken]
            w.info["assigned"] = free[:self.cpus_each] or w.info["cpus"][:self.cpus_each]
            setup = self.setup.model_copy(update={"cpus": w.info["assigned"], "gpu": None, "name": w.state.name,
                                                  "share": max(1, len(w.info["cpus"]) // self.cpus_each)})
            device = ray.get(w.actor.start.remote(setup.model_dump_json()), timeout=HOST_START_S)
        except ray.exceptions.GetTimeoutError:
            raise SearchError(f"Ray worker {w.state.name} did not start within {HOST_START_S:g} s (is the "
                              "cluster short of the CPUs or GPUs it asks for?)") from None
        except ray.exceptions.RayError as e:
            raise SearchError(f"Ray worker {w.state.name} could not start: {_short(e)}") from None
        w.state.device = f"{w.info['hostname']} {device}"
        w.state.stage, w.state.since = "idle", time.monotonic()

    def free(self, avoid: str | None = None) -> int:
        return sum(1 for w in self._workers if w.ref is None and w.actor is not None and w.state.name != avoid)

    def busy(self) -> int:
        return sum(1 for w in self._workers if w.ref is not None)

    def workers(self) -> int:
        return sum(1 for w in self._workers if w.actor is not None)

    def submit(self, job: JobSpec, avoid: str | None = None) -> str:
        free = [w for w in self._workers if w.ref is None and w.actor is not None]
        if not free:
            raise SearchError("no free worker")
        w = next((f for f in free if f.state.name != avoid), free[0])
        self._stages.set.remote(w.state.name, f"{job.node_id}: sent")  # not the last job's last line
        w.ref = w.actor.evaluate.remote(job.model_dump_json())
        w.state.job, w.state.stage, w.state.since = job, f"{job.node_id}: sent", time.monotonic()
        return w.state.name

    def wait(self, timeout_s: float) -> list[Event]:
        ray = self._ray
        running = {w.ref: w for w in self._workers if w.ref is not None}
        if not running:
            return []
        ready, _ = ray.wait(list(running), num_returns=1, timeout=max(0.0, timeout_s))
        if ready:  # and whatever else is ready now
            ready, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
        events: list[Event] = []
        for ref in ready:
            w = running[ref]
            job = w.state.job
            assert job is not None
            w.ref, w.state.job, w.state.stage = None, None, "idle"
            try:
                events.append(Completed(job, JobResult.model_validate_json(ray.get(ref)), w.state.name))
                w.state.done += 1
            except ray.exceptions.RayActorError as e:  # the actor died: its process, or its node
                events.append(Lost(job, w.state.name, f"the Ray actor died: {_short(e)}"))
                self._replace(w)
            except ray.exceptions.RayError as e:  # the host raised: a fault of the host, not a verdict
                if isinstance(getattr(e, "cause", None), TaskError):  # the task's own code: the run's error
                    raise TaskError(str(e.cause)) from None
                events.append(Lost(job, w.state.name, f"the host failed: {_short(e)}"))
        self._refresh_stages()
        return events

    def _replace(self, w: _Worker) -> None:
        self.progress(f"worker {w.state.name} ({w.state.device}) lost; starting a new Ray actor")
        try:
            self._ray.kill(w.actor)
        except Exception:  # already gone
            pass
        w.info = {}
        self._spawn(w)
        try:
            self._start(w)
        except SearchError as e:  # the pool goes on with one worker fewer
            self.progress(f"worker {w.state.name} could not be replaced: {e}")
            w.actor, w.state.stage = None, "down"

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

    def close(self) -> None:
        for w in getattr(self, "_workers", []):
            if w.actor is not None:
                try:
                    self._ray.kill(w.actor)
                except Exception:  # already gone
                    pass
                w.actor, w.ref = None, None
        if self._started:
            self._ray.shutdown()
            self._started = False


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
