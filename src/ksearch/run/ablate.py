"""The context ablation (``ksearch ablate``): one ordinary run per ``--context`` level, and optionally one with the
offline ``patterns`` proposer, on the same task, target, workloads, seed, budget and judge settings; at the end
every run's best kernel and the naive kernel re-timed side by side in one judge session, and one row per run.

An ablation lives in ``$KSEARCH_HOME/ablations/<id>/``: ``ablation.json`` (the manifest: the shared run
configuration, and per run its label, run id and queue directory), ``lock`` (held while a process works on it),
and ``results.md`` / ``results.json`` (written at the end, unless ``-o`` says elsewhere). Its runs are ordinary
runs under ``$KSEARCH_HOME/runs`` (`ksearch runs list`, `ksearch show`); starting, resuming and finishing one is
`ksearch.run.session.Session`'s, the loop `ksearch.run.controller.Controller`'s. Resuming an ablation resumes
its unfinished runs through `Session.resume` and leaves finished ones alone; a run that never started (or failed
to) is started.

Runs go one after another, or up to ``jobs`` at once, each in a process of its own (spawned: the judge times
with the clock of the process that drives the run, which no other run's thread may hold up). Ctrl-C reaches every
process of the terminal's group: each run marks itself interrupted (what it committed stays) and the manifest
is saved; concurrent runs time under each other's load (the judge waits for a quiet machine up to
``KSEARCH_BUSY_WAIT_S`` and records the load), which is why the table's ratios come from the re-time at the end.

The table at the end is `ksearch.run.ablate_results`'s.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO, get_args

from pydantic import BaseModel, ValidationError

from ksearch import config
from ksearch.errors import KsearchError, LLMError, SearchError, StoreError
from ksearch.llm.settings import ContextLevel
from ksearch.run.controller import RunConfig, StepReport
from ksearch.run.session import Session
from ksearch.store.runs import hold_lock, new_run_id, open_run

#: the context levels a run can have, in order of what the prompts carry
LEVELS: tuple[str, ...] = get_args(ContextLevel)
#: the label of the run with the offline patterns proposer
OFFLINE = "offline"
#: statuses of a run that is over (resuming it would judge nothing new)
DONE = ("finished", "exhausted")
#: seconds the runs in flight get to stop after Ctrl-C before their processes are terminated
STOP_WAIT_S = 120.0

Event = dict[str, Any]
Send = Callable[[Event], None]


class AblationRun(BaseModel):
    """One run of an ablation: ``label`` (a context level, or ``offline``), its ``run_id`` once started, its
    ``queue_dir`` (queue backend: where its prompts appear), its last known ``status`` and why it failed to start
    or stopped (``error``)."""

    label: str
    run_id: str | None = None
    queue_dir: str | None = None
    status: str = "pending"
    error: str | None = None


class Ablation(BaseModel):
    """The manifest (``ablation.json``). ``config``: the llm runs' shared configuration (its ``llm.context`` and
    ``llm.queue_dir`` are set per run by `config_for`); ``command``: the command line that created it;
    ``results``: the JSON results file last written."""

    id: str
    created_at: str
    command: str = ""
    task: str
    contexts: list[str]
    offline: bool = False
    config: RunConfig
    runs: list[AblationRun]
    results: str | None = None
    #: a comparison's runs (`ksearch.run.compare`): label -> its whole configuration (strategy and seed)
    variants: dict[str, RunConfig] = {}
    #: a comparison's strategies and repeats (empty and 0 for a context ablation)
    strategies: list[str] = []
    repeats: int = 0

    def config_for(self, label: str) -> RunConfig:
        """The run configuration of ``label``: a comparison's variant; else the shared one with ``--context label``
        (and the queue directory ``<queue-dir>/<label>``), or with the patterns proposer for ``offline``. Raises
        KeyError for another."""
        if label in self.variants:
            return self.variants[label]
        if label == OFFLINE:
            return self.config.model_copy(update={"proposer": "patterns", "llm": None})
        if label not in self.contexts or self.config.llm is None:
            raise KeyError(label)
        update: dict[str, Any] = {"context": label}
        if self.config.llm.queue_dir:
            update["queue_dir"] = str(Path(self.config.llm.queue_dir) / label)
        return self.config.model_copy(update={"llm": self.config.llm.model_copy(update=update)})

    def run(self, label: str) -> AblationRun:
        return next(r for r in self.runs if r.label == label)


def parse_levels(text: str) -> list[str]:
    """``none,hardware,full`` as a list. Raises SearchError for an unknown or repeated level, or none at all."""
    levels = [x.strip() for x in text.split(",") if x.strip()]
    for x in levels:
        if x not in LEVELS:
            raise SearchError(f"unknown context level {x!r} in --contexts: the levels are {', '.join(LEVELS)}")
    twice = sorted({x for x in levels if levels.count(x) > 1})
    if twice:
        raise SearchError(f"--contexts names {', '.join(twice)} more than once")
    return levels


def ablations_dir() -> Path:
    path = config.home_dir() / "ablations"
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_ablation(cfg: RunConfig, contexts: list[str], offline: bool, name: str | None = None,
                 command: str = "") -> Ablation:
    """A manifest (not yet saved) for ``cfg`` (an llm run's configuration) at each level of ``contexts``, plus
    the offline run when ``offline``. ``name``: its id (default: ``<task>-ablate-<date>-<hex>``). Raises
    SearchError for a configuration without llm settings or without any run."""
    if cfg.llm is None:
        raise SearchError("an ablation's runs use the llm proposer: give its model (--model, --command or "
                          "--queue-dir)")
    if not contexts and not offline:
        raise SearchError("nothing to run: give --contexts (none, hardware, full) and/or --offline")
    task_name = Path(cfg.task).name if os.sep in cfg.task else cfg.task
    ab_id = name or new_run_id(f"{task_name}-ablate")
    if not ab_id or "/" in ab_id or ab_id.startswith("."):
        raise SearchError(f"--name must be a plain directory name, not {ab_id!r}")
    ab = Ablation(id=ab_id, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=command,
                  task=cfg.task, contexts=list(contexts), offline=offline, config=cfg,
                  runs=[AblationRun(label=x) for x in [*contexts, *([OFFLINE] if offline else [])]])
    for r in ab.runs:
        r.queue_dir = (ab.config_for(r.label).llm.queue_dir or None) if r.label != OFFLINE else None
    return ab


def ablation_dir(ab_id: str) -> Path:
    return ablations_dir() / ab_id


def exists(ab_id: str) -> bool:
    return (ablation_dir(ab_id) / "ablation.json").is_file()


def load(ab_id: str) -> Ablation:
    """The manifest of ablation ``ab_id`` (or a unique prefix of it). Raises StoreError when there is none or it
    does not decode."""
    path = ablation_dir(ab_id) / "ablation.json"
    if not path.is_file():
        matches = [d for d in ablations_dir().iterdir() if d.name.startswith(ab_id) and
                   (d / "ablation.json").is_file()]
        if len(matches) != 1:
            known = ", ".join(sorted(d.name for d in ablations_dir().iterdir())[:5]) or "none"
            raise StoreError(f"no ablation {ab_id!r} in {ablations_dir()}" +
                             (" (the prefix is ambiguous)" if matches else f" (known: {known})"))
        path = matches[0] / "ablation.json"
    try:
        return Ablation.model_validate_json(path.read_text())
    except (OSError, ValidationError) as e:
        raise StoreError(f"{path} cannot be read: {str(e).splitlines()[0]}") from None


def save(ab: Ablation) -> Path:
    """Write the manifest atomically (a temporary name, then a rename); returns its path."""
    d = ablation_dir(ab.id)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "ablation.json"
    tmp = d / f".ablation.json.{os.getpid()}"
    tmp.write_text(ab.model_dump_json(indent=2))
    tmp.replace(path)
    return path


def lock(ab_id: str) -> TextIO:
    """The ablation's ``lock`` file, held (flock) until closed. Raises StoreError when another process holds it."""
    d = ablation_dir(ab_id)
    d.mkdir(parents=True, exist_ok=True)
    return hold_lock(d / "lock", f"ablation {ab_id}")


def run_state(run_id: str) -> tuple[str, bool]:
    """(status, done) of a run from its store: done when its status is one of `DONE` and its report is kept (a
    run killed between the two writes is resumed: `Session.finish` reuses its final measurements)."""
    store = open_run(run_id)
    try:
        status = store.run().get("status") or "?"
        return status, status in DONE and store.report() is not None
    finally:
        store.close()


def refresh(ab: Ablation) -> None:
    """Each run's status as its store has it now (a run whose store is gone is pending again)."""
    for r in ab.runs:
        if r.run_id is None:
            continue
        try:
            r.status = run_state(r.run_id)[0]
        except StoreError as e:
            r.status, r.error, r.run_id = "pending", f"its run {r.run_id} is gone: {e}", None


def todo(ab: Ablation) -> list[AblationRun]:
    """The runs still to start or resume."""
    out = []
    for r in ab.runs:
        if r.run_id is not None:
            try:
                if run_state(r.run_id)[1]:
                    continue
            except StoreError:
                r.run_id = None
        out.append(r)
    return out


# -- running -------------------------------------------------------------------------------------------------


class Job(BaseModel):
    """What one process needs to start or resume one run: its ``label``, its configuration (a new run) or its
    ``run_id`` (a resumed one), and the time limit of its search."""

    label: str
    config: RunConfig | None = None
    run_id: str | None = None
    time_limit_s: float | None = None


def job_for(ab: Ablation, r: AblationRun, time_limit_s: float | None = None) -> Job:
    if r.run_id is not None:
        return Job(label=r.label, run_id=r.run_id, time_limit_s=time_limit_s)
    return Job(label=r.label, config=ab.config_for(r.label), time_limit_s=time_limit_s)


def step_text(r: StepReport) -> str:
    """One step in a line, as `ksearch run` prints it (without markup)."""
    score = f"{r.score:.2f}x" if r.score else r.evaluation.status.value
    note = " (same kernel as before)" if r.reused else ""
    return f"[{r.seq:>3}] {r.node_id:<5} {r.label[:26]:<26} {r.node_status:<9} {score:>8}{note}"


def execute(job: Job, send: Send) -> None:
    """Start (or resume) one run and drive it to its end: the naive baseline, the search, the final stage, as
    `ksearch run` does. Sends events (dicts with ``kind`` and ``label``): ``started`` (``run_id``), ``step``
    (``text``), ``ended`` (``run_id``, ``status``, ``error``: the run's status afterwards; an llm limit or endpoint
    leaves it ``stopped``, a fault ``failed``) or ``failed`` (``error``: it could not start; nothing was
    created). Re-raises KeyboardInterrupt after marking the run interrupted."""
    label = job.label
    try:
        session = Session.resume(job.run_id) if job.run_id else Session.create(job.config)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - reported, and the other runs go on
        send({"kind": "failed", "label": label, "run_id": job.run_id, "error": _words(e)})
        return
    with session:
        send({"kind": "started", "label": label, "run_id": session.run_id})
        c = session.controller
        try:
            c.start()
            c.run(lambda r: send({"kind": "step", "label": label, "text": step_text(r)}), job.time_limit_s)
            report = session.finish()
        except KeyboardInterrupt:
            session.store.set_status("interrupted")
            send({"kind": "ended", "label": label, "run_id": session.run_id, "status": "interrupted",
                  "error": None})
            raise
        except LLMError as e:
            session.store.set_status("stopped")
            send({"kind": "ended", "label": label, "run_id": session.run_id, "status": "stopped",
                  "error": _words(e)})
            return
        except Exception as e:  # noqa: BLE001 - the run is marked interrupted (resumable) by the session
            send({"kind": "ended", "label": label, "run_id": session.run_id, "status": "failed",
                  "error": _words(e)})
            return
        send({"kind": "ended", "label": label, "run_id": session.run_id, "status": report.status, "error": None})


def _words(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text if isinstance(e, KsearchError) else f"{type(e).__name__}: {text}"


def _child(job_json: str, events) -> None:
    """A run in a process of its own (``--jobs`` > 1)."""
    try:
        execute(Job.model_validate_json(job_json), events.put)
    except KeyboardInterrupt:
        sys.exit(130)


def apply_event(ab: Ablation, ev: Event) -> None:
    """Record what a run said in the manifest (its run id, status, error)."""
    r = ab.run(ev["label"])
    if ev["kind"] == "started":
        r.run_id, r.status, r.error = ev["run_id"], "running", None
    elif ev["kind"] == "ended":
        r.run_id, r.status, r.error = ev["run_id"], ev["status"], ev.get("error")
    elif ev["kind"] == "failed":
        r.status, r.error = "failed", ev["error"]


def run_all(ab: Ablation, runs: list[AblationRun], jobs: int = 1, on_event: Send | None = None,
            time_limit_s: float | None = None) -> None:
    """Start or resume ``runs`` of ``ab``, up to ``jobs`` at once, saving the manifest after every change. Every
    event goes to ``on_event`` after the manifest has it. Re-raises KeyboardInterrupt once every run in flight
    has stopped (the manifest saved)."""
    def handle(ev: Event) -> None:
        if ev["kind"] != "step":
            apply_event(ab, ev)
            save(ab)
        if on_event:
            on_event(ev)

    save(ab)
    if jobs <= 1:
        for r in runs:
            execute(job_for(ab, r, time_limit_s), handle)
        return
    _run_processes(ab, runs, jobs, handle, time_limit_s)


def _run_processes(ab: Ablation, runs: list[AblationRun], jobs: int, handle: Send,
                   time_limit_s: float | None) -> None:
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    pending = list(runs)
    running: dict[str, Any] = {}
    ended: set[str] = set()

    def drain(block_s: float | None) -> None:
        try:
            ev = events.get(timeout=block_s) if block_s else events.get_nowait()
        except queue_mod.Empty:
            return
        handle(ev)
        if ev["kind"] in ("ended", "failed"):
            ended.add(ev["label"])
        while True:
            try:
                ev = events.get_nowait()
            except queue_mod.Empty:
                return
            handle(ev)
            if ev["kind"] in ("ended", "failed"):
                ended.add(ev["label"])

    def reap() -> None:
        for label, p in list(running.items()):
            if p.is_alive():
                continue
            p.join()
            drain(None)
            if label not in ended:  # it died without a word (killed, out of memory)
                handle({"kind": "ended" if ab.run(label).run_id else "failed", "label": label,
                        "run_id": ab.run(label).run_id, "status": "failed",
                        "error": f"its process exited with status {p.exitcode}"})
            del running[label]

    try:
        while pending or running:
            while pending and len(running) < jobs:
                r = pending.pop(0)
                p = ctx.Process(target=_child, args=(job_for(ab, r, time_limit_s).model_dump_json(), events),
                                name=f"ksearch-ablate-{r.label}")
                p.start()
                running[r.label] = p
            drain(0.2)
            reap()
    except KeyboardInterrupt:
        # the terminal's Ctrl-C reached every process of the group; a SIGINT sent to this process alone is passed
        # on to the runs that have not stopped after a moment
        t0, passed_on = time.monotonic(), False
        while running and time.monotonic() - t0 < STOP_WAIT_S:
            try:
                drain(0.2)
                reap()
                if not passed_on and time.monotonic() - t0 > 2.0:
                    for p in running.values():
                        if p.is_alive() and p.pid:
                            os.kill(p.pid, signal.SIGINT)
                    passed_on = True
            except KeyboardInterrupt:  # a second Ctrl-C: keep waiting for the runs to save their state
                continue
        for p in running.values():
            p.terminate()
            p.join(5)
        save(ab)
        raise
