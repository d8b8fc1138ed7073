"""Start, resume and finish runs: the glue between the CLI and the controller.

A run lives in ``$KSEARCH_HOME/runs/<run id>/``: ``run.sqlite`` (the store), ``lock`` (held while a process
works on the run), and ``best/`` (the best kernel's sources and candidate.json, written when the run finishes,
before the final measurements: a run killed during those keeps best/, though the best kernel has then not been
checked on fresh inputs or hidden workloads; `ksearch resume` runs them).
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ksearch.errors import (BaselineNotForTarget, BaselineUnavailable, SearchError, StoreError, StoreWriteError,
                            TaskError)
from ksearch.eval.baselines import time_baseline
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import (Candidate, Evaluation, FinalMeasurements, FinalReport, HiddenWorkloads, Status,
                             WorkloadResult)
from ksearch.eval.timing import Reference
from ksearch.proposers.base import get_proposer
from ksearch.run.controller import Controller, RunConfig, environment, load_snapshot, run_config, unwrap_ctrl_c
from ksearch.run.executor import check_placement, make_executor
from ksearch.store.db import Store
from ksearch.store.runs import lock_run, new_run_id, open_run, run_dir
from ksearch.targets import get_target
from ksearch.targets.base import spec_for_run
from ksearch.tasks import builtin_names, load_task
from ksearch.tasks.loader import Task

if TYPE_CHECKING:
    from ksearch.protocol import TimingPlan
    from ksearch.tasks.definition import Workload

Progress = Callable[[str], None]

#: hidden workloads (drawn with a secret seed) the best kernel must also pass in the final evaluation
HIDDEN_WORKLOADS = 4



def reproduce_command(cfg: RunConfig, candidate: str) -> str:
    """The one command that judges a run's best kernel again exactly as the run judged it: ``ksearch eval`` of
    its ``candidate.json`` (sources, entry point, compile flags, launch plan), on the run's target, task and
    workloads (shell-quoted, e.g. ``ksearch eval selective-scan /runs/r1/best/candidate.json --target cpu``)."""
    import shlex

    words = ["ksearch", "eval", cfg.task, candidate, "--target", cfg.target]
    if cfg.workloads_file:
        words += ["--workloads-file", cfg.workloads_file]
    if cfg.workloads:
        words += ["-w", ",".join(cfg.workloads)]
    if cfg.timeout_s != 60.0:
        words += ["--timeout", f"{cfg.timeout_s:g}"]
    return shlex.join(words)


class Session:
    """An open run: its store, controller and lock. Use as a context manager (releases the lock)."""

    def __init__(self, store: Store, cfg: RunConfig, progress: Progress | None = None, lock: TextIO | None = None):
        self.store, self.cfg = store, cfg
        self.progress = progress or (lambda m: None)
        self.dir = store.path.parent
        self._created = self._discard = False  # made by `create` in this process; removed on close (not started)
        self._lock = lock or lock_run(self.dir)
        try:
            target = get_target(cfg.target)
            why = target.available()
            if why:
                raise SearchError(f"target {cfg.target!r} is not available here: {why}")
            self.task = load_task(cfg.task, workloads=cfg.workloads_file)
            if target.naive_candidate(self.task) is None:
                raise TaskError(f"task {self.task.name!r} ({self.task.origin}) has no naive kernel for target "
                                f"{cfg.target!r} (naive.{cfg.target}.<ext> beside its definition): a search "
                                "measures every speedup against it. For a task from elsewhere, `ksearch tasks "
                                f"import {cfg.task} -o DIR` writes a task folder to put one in; `ksearch eval` "
                                "judges a kernel without one")
            stored = store.hardware()  # a resumed run keeps its spec (re-probed when provisional or not this device)
            self.hardware = spec_for_run(cfg.target, stored)
            if stored is not None and self.hardware.model_dump(mode="json") != stored:
                store.set_hardware(self.hardware.model_dump(mode="json"))
            ecfg = Controller.eval_config(cfg)
            if cfg.workers > 1 or cfg.executor != "local":  # the hosts judge; this judge only does the naive kernel
                ecfg.spare_workers = 0  # and the final stage: no workers started ahead to compete with the hosts
            self.evaluator = Evaluator(self.task, cfg.target, self.hardware, ecfg, self.progress)
            self.proposer = get_proposer(cfg.proposer, self.task, cfg.target, self.hardware, cfg.llm, store,
                                         cfg.strategy, cfg.workloads, lambda m: self.progress(m))
            self.controller = Controller(store, self.task, self.evaluator, self.proposer, cfg, self.progress,
                                         make_executor=lambda naive: make_executor(cfg, self.evaluator, naive,
                                                                                   lambda m: self.progress(m)))
            self.run_id = self.dir.name
        except BaseException:
            self._lock.close()
            raise

    @classmethod
    def create(cls, cfg: RunConfig, progress: Progress | None = None) -> "Session":
        """A new run under ``$KSEARCH_HOME/runs``, named after the task. A task given as a path is saved as an
        absolute path (so the run resumes from any directory). Nothing is left behind when the run cannot
        start (unknown task, workload, target or proposer; no compiler)."""
        task = load_task(cfg.task, workloads=cfg.workloads_file)
        task.select(cfg.workloads)  # fail on a bad task or workload before creating anything
        check_placement(cfg, get_target(cfg.target).needs_gpu)  # and on workers that could not start
        if cfg.task not in builtin_names():
            cfg = cfg.model_copy(update={"task": str(Path(cfg.task).resolve())})
        if cfg.workloads_file:
            cfg = cfg.model_copy(update={"workloads_file": str(Path(cfg.workloads_file).resolve())})
        run_id = new_run_id(task.name)
        try:
            where = run_dir(run_id)
        except OSError as e:  # $KSEARCH_HOME/runs cannot be made (read-only, full, not ours)
            raise StoreWriteError(f"cannot create a run under {e.filename or '$KSEARCH_HOME'}: "
                                  f"{e.strerror or e}") from None
        try:
            store = Store(where / "run.sqlite", create=True)
        except BaseException:
            shutil.rmtree(where, ignore_errors=True)
            raise
        try:
            store.create_run(run_id, task.name, cfg.target, cfg.model_dump(mode="json"), environment(), None)
            session = cls(store, cfg, progress)
            store.set_hardware(session.hardware.model_dump(mode="json"))
        except BaseException:
            store.close()
            shutil.rmtree(where, ignore_errors=True)
            raise
        session._created = True
        return session

    @classmethod
    def resume(cls, run: str, progress: Progress | None = None, budget: int | None = None,
               llm_limits: dict | None = None, placement: dict | None = None) -> "Session":
        """Reopen a run; ``budget`` raises its budget, ``llm_limits`` (max_cost_usd, max_tokens) the llm
        proposer's limits, ``placement`` (workers, executor, ray_address) where its evaluations run (saved only
        once this process holds the run's lock)."""
        store = open_run(run)
        try:
            lock = lock_run(store.path.parent)
            damage = store.quick_check()
            if damage:
                lock.close()
                raise StoreError(f"{store.path} is damaged (integrity check: {damage[0]}); nothing was changed: "
                                 f"`ksearch runs check {store.path.parent.name} --repair` rebuilds it from what "
                                 "is intact, then resume")
        except BaseException:
            store.close()
            raise
        try:
            cfg = run_config(store)
            if placement:  # checked before anything is saved: a placement that cannot start changes nothing
                cfg = cfg.model_copy(update=placement)
                check_placement(cfg, get_target(cfg.target).needs_gpu)
            if budget is not None:
                done = store.evaluation_count()
                snap = load_snapshot(store)
                flying = len(set(snap[0].in_flight.values())) if snap else 0
                if budget < done + flying:
                    raise SearchError(f"--budget {budget} is below the {done} evaluations done"
                                      + (f" and the {flying} in flight (judged first on resume)" if flying else ""))
                cfg = cfg.model_copy(update={"budget": budget})
                store.set_config(cfg.model_dump(mode="json"))
            if llm_limits:
                if cfg.llm is None:
                    raise SearchError(f"run {store.path.parent.name} does not use the llm proposer: "
                                      "--max-cost and --max-tokens do not apply")
                cfg = cfg.model_copy(update={"llm": cfg.llm.model_copy(update=llm_limits)})
                store.set_config(cfg.model_dump(mode="json"))
            if placement:
                store.set_config(cfg.model_dump(mode="json"))
            session = cls(store, cfg, progress, lock)
            store.set_status("running")
            return session
        except BaseException:
            lock.close()
            store.close()
            raise

    def close(self) -> None:
        self.controller.close()  # the executor's workers
        self.evaluator.close()  # its spare workers and input files
        self._lock.close()
        self.store.close()
        if self._discard:
            shutil.rmtree(self.dir, ignore_errors=True)

    def discard_if_unstarted(self) -> bool:
        """A run this process created that failed before anything worth keeping was written (no tree, no
        evaluation, no llm call: the naive kernel failed its check, say) is removed when the session closes, so
        that a run that could not start leaves no directory behind. Returns whether it will be."""
        if not self._created:
            return False
        try:
            db = self.store.db
            kept = sum(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                       for t in ("snapshots", "evaluations", "llm_calls"))
        except Exception:  # unreadable: keep it, the error that brought us here is what the user sees
            return False
        self._discard = kept == 0
        return self._discard

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            try:  # a status already set on the way out (stopped by an llm limit, ...) stays
                if self.store.run().get("status") in ("running", None):
                    self.store.set_status("interrupted")
            except Exception:  # the store must not mask the original error
                pass
        self.close()

    # -- the end of a run ---------------------------------------------------------------------------

    @unwrap_ctrl_c
    def finish(self) -> FinalReport:
        """Write the best kernel's sources (first: the measurements can take minutes), measure naive / best /
        reference side by side on fresh inputs (kept in the store, so a second call reuses them), and return the
        run's report, kept in the store too (`FinalReport`: what `ksearch run --json` prints)."""
        c = self.controller
        best = c.best()
        try:
            final = self.store.final()
        except StoreError as e:  # a damaged row: measured again and replaced, not the end of the run
            self.progress(f"final: the kept final measurements do not decode, measuring again ({e})")
            final = None
        best_id = best[1].id if best else None
        source_path = candidate_path = reproduce = None
        if best:   # before the final measurements (minutes on big workloads): a run killed there keeps its best
            out = self.dir / "best"
            out.mkdir(exist_ok=True)
            for name, text in best[1].sources.items():
                (out / name).write_text(text)
            (out / "candidate.json").write_text(best[1].model_dump_json(indent=2))
            source_path = str(out / next(iter(best[1].sources)))
            candidate_path = str(out / "candidate.json")
            reproduce = reproduce_command(self.cfg, candidate_path)
        if final is None or final.best_candidate_id != best_id:
            final = self._final_measurements(best)
            self.store.put_final(final)
        self.store.set_status(c.end_status())
        report = FinalReport.build(self.store.run(), c.evaluations, best[0] if best else None, final, source_path,
                                   candidate_path, reproduce)
        self.store.put_report(report)
        return report

    def _hidden_check(self, ev: Evaluator, candidate: Candidate, selected: list[Workload],
                      best_eval: Evaluation) -> HiddenWorkloads:
        """Check the best kernel on workloads it never saw (sizes drawn with a secret seed, no larger than the
        run's check workloads); a failure there becomes the best kernel's final status."""
        like = [w for w in selected if w.purpose == "check"] or selected
        try:
            workloads = ev.hidden_workloads(secrets.randbits(62), HIDDEN_WORKLOADS, like=like)
        except TaskError as e:  # the axes' ranges and constraints leave nothing to draw: say so, go on
            self.progress(f"final: no hidden workloads: {e}")
            return HiddenWorkloads(axes=[], evaluation=Evaluation(candidate_id=candidate.id, task=self.task.name,
                                                                  target=self.cfg.target, status=Status.SKIPPED,
                                                                  message=str(e)))
        self.progress(f"final: best kernel on {len(workloads)} hidden workloads")
        hidden = ev.evaluate(candidate, workloads, timing=False)
        if hidden.status is not Status.PASSED:
            self.progress(f"final: the best kernel FAILED a hidden workload: {hidden.message}")
            if best_eval.status is Status.PASSED:
                best_eval.status, best_eval.message = hidden.status, f"hidden workload {hidden.message}"
        return HiddenWorkloads(axes=[w.axes for w in workloads], evaluation=hidden)

    def _final_measurements(self, best: tuple[str, Candidate, Evaluation] | None) -> FinalMeasurements:
        cfg = EvalConfig(seeds=[secrets.randbits(62)], timeout_s=self.cfg.timeout_s, timing=self.cfg.timing)
        ev = Evaluator(self.task, self.cfg.target, self.hardware, cfg, self.progress)
        selected = self.task.select(self.cfg.workloads)
        bench = [w for w in selected if w.purpose == "bench"] or selected
        names = [w.name or w.uuid for w in bench]
        self.progress("final: naive kernel on fresh inputs")
        naive = ev.measure_naive(bench)
        if naive.status is not Status.PASSED:
            raise SearchError(f"the naive kernel failed its final check: {naive.message}")
        best_eval = hidden = None
        if best:
            self.progress("final: best kernel on fresh inputs, timed beside the naive kernel")
            best_eval = ev.evaluate(best[1], names, timing=True,
                                    references=[Reference("naive", ev.naive_candidate())])
            if best_eval.status is not Status.PASSED:
                self.progress(f"final: the best kernel FAILED on fresh inputs: {best_eval.message}")
            hidden = self._hidden_check(ev, best[1], selected, best_eval)
        ref_name, reference, ref_notes = reference_timings(self.task, names, cfg.seeds[0], self.progress,
                                                           self.cfg.target, cases=ev, plan=cfg.timing)
        return FinalMeasurements(best_candidate_id=best[1].id if best else None, naive=naive, best=best_eval,
                                 hidden=hidden, reference=reference, reference_name=ref_name or "reference",
                                 reference_notes=ref_notes)


def reference_timings(task: Task, workloads: list[str], seed: int, progress: Progress,
                      target: str = "cpu", cases: Evaluator | None = None, plan: TimingPlan | None = None,
                      ) -> tuple[str | None, dict[str, WorkloadResult], list[str]]:
    """The first of the task's baselines that can run here, timed on ``workloads`` by ``plan`` (as the candidates
    are; None: the default) with inputs from ``cases`` (an Evaluator's, None: made here): (its name, workload ->
    its WorkloadResult, notes), or (None, {}, notes) where none can; notes say which baselines were skipped
    and why, and which workloads the timed one failed (the summary prints them). A baseline that cannot run here
    (BaselineUnavailable) or does not load (TaskError) is skipped with the reason; one meant for other targets'
    runs (BaselineNotForTarget) is skipped quietly, said only where no baseline runs; one that fails on a
    workload is that workload's RUNTIME_ERROR (time_baseline): the final stage never loses the run's
    measurements to a baseline."""
    notes: list[str] = []
    other_targets: list[str] = []  # baselines for other targets' runs: said only where no baseline runs
    for name in task.baseline_sources:
        reference: dict[str, WorkloadResult] = {}
        try:
            for w in workloads:
                progress(f"final: {name} on {w}")
                reference[w] = time_baseline(task, name, w, seed=seed, target=target, cases=cases, plan=plan)
        except BaselineNotForTarget as e:
            other_targets.append(f"baseline {name} skipped: {e}")
            continue
        except (BaselineUnavailable, TaskError) as e:
            progress(f"final: baseline {name} skipped: {e}")
            notes.append(f"baseline {name} skipped: {e}")
            continue
        notes += [f"baseline {name} on {w}: {r.status.value}: {r.message}"
                  for w, r in reference.items() if r.status is not Status.PASSED]
        return name, reference, notes
    return None, {}, other_targets + notes
