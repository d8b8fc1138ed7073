"""The search loop: choose an action, get its kernel, judge it, record what happened, refine the tree.

The controller is the only writer of run state. One *step* = one decision of the strategy, one candidate from
the proposer, one evaluation by the judge, `attach`, the proposer's refinement edits, and one atomic write
to the store (evaluation + tree + strategy state). Resume reloads the last committed tree and state, so a
run killed at any point loses at most the evaluation that was in flight and never repeats a committed one.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from ksearch import __version__
from ksearch.errors import KnowledgeError, LLMError, SearchError, StoreError
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Evaluation, Status
from ksearch.eval.timing import Reference
from ksearch.llm.settings import LLMSettings
from ksearch.proposers.base import Proposer
from ksearch.search.edits import apply
from ksearch.search.strategy import Decision, SearchState, StrategyConfig, decide, update_state
from ksearch.search.worldmodel import ROOT_ID, EvalSummary, Tree, attach, retimed
from ksearch.store.db import Store

if TYPE_CHECKING:
    from ksearch.tasks.loader import Task


#: the clock of --time-limit (a module attribute, so tests can replace it without touching the time module)
clock = time.monotonic

#: consecutive steps without a new evaluation after which a run ends (see `Controller.run`)
MAX_IDLE_STEPS = 25
#: workers the judge starts ahead for the next step (the candidate, its parent, the best: `EvalConfig.spare_workers`)
SPARE_WORKERS = 3


class RunConfig(BaseModel):
    """Everything that determines a run's decisions (saved with the run; resume reuses it as saved).

    ``budget``: evaluations of candidates (the naive baseline not counted); ``seed``: the strategy's tie
    breaks and the correctness inputs' seeds; ``timeout_s``: per kernel call.
    """

    task: str
    target: str = "cpu"
    proposer: str = "patterns"
    budget: int = Field(default=40, ge=1)
    workloads: list[str] | None = None  # None: all of the task's workloads
    seed: int = 0
    timeout_s: float = 60.0
    checks: int = Field(default=3, ge=1)
    timing: TimingPlan = Field(default_factory=TimingPlan)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    llm: LLMSettings | None = None  # the llm proposer's settings (None for patterns)


def run_config(store: Store) -> RunConfig:
    """The configuration a run was saved with. Raises StoreError when it does not decode."""
    try:
        return RunConfig.model_validate(store.run()["config"])
    except ValidationError as e:
        raise StoreError(f"{store.path} holds a run configuration that does not decode: "
                         f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None


def load_snapshot(store: Store) -> tuple[Tree, SearchState] | None:
    """The newest tree and strategy state of a run (None before the first). Raises StoreError when they do not
    decode."""
    snap = store.latest_snapshot()
    if snap is None:
        return None
    try:
        return Tree.model_validate_json(snap[1]), SearchState.model_validate_json(snap[2])
    except ValidationError as e:
        raise StoreError(f"{store.path}: snapshot {snap[0]} does not decode: {e.errors()[0]['msg']}") from None


def correctness_seeds(seed: int, checks: int) -> list[int]:
    """The run's input seeds: fixed per run, so reference outputs are computed once and reused (each
    evaluation is a fresh process, so a candidate cannot carry answers from one evaluation to the next)."""
    return [(seed * 1_000_003 + 7919 * (i + 1)) % (1 << 62) for i in range(checks)]


def score_of(ev: Evaluation) -> float | None:
    """Geometric-mean speedup over the naive kernel across the timed workloads; None if it did not pass."""
    if ev.status is not Status.PASSED:
        return None
    ups = [r.speedup_vs_naive for r in ev.workloads if r.speedup_vs_naive]
    return math.exp(sum(math.log(u) for u in ups) / len(ups)) if ups else None


def summarize(ev: Evaluation) -> EvalSummary:
    """The tree's view of an evaluation: status, score, latencies, and the verdicts against the parent and the
    best kernel when they were timed beside it (a reference that failed in the session gives no verdict)."""
    score = score_of(ev)
    status = ev.status.value if (score is not None or ev.status is not Status.PASSED) else "RUNTIME_ERROR"
    verdicts = {p.role: p.verdict for p in ev.paired if p.verdict is not None}
    intervals = {p.role: [p.ratio, p.lo, p.hi] for p in ev.paired if p.ratio is not None}
    passed = status == Status.PASSED.value
    return EvalSummary(status=status, score=score,
                       latency_ms={r.workload: r.median_ms for r in ev.workloads if r.median_ms is not None},
                       vs_parent=verdicts.get("parent") if passed else None,
                       vs_best=verdicts.get("best") if passed else None, intervals=intervals if passed else {})


def environment() -> dict:
    return {"ksearch": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "machine": platform.machine()}


@dataclass
class StepReport:
    """What one step did, for progress display."""

    seq: int
    node_id: str
    label: str
    decision: Decision
    evaluation: Evaluation
    score: float | None
    node_status: str
    reused: bool


class Controller:
    """Runs (or resumes) one search on one store.

    Args:
        store: the run's store (created, with its run row, by `start`, or an existing one for `resume`).
        task: the loaded task; evaluator: its judge; proposer: who writes edits and kernels; cfg: RunConfig.
        progress: called with short status lines during evaluation.
    """

    def __init__(self, store: Store, task: Task, evaluator: Evaluator, proposer: Proposer, cfg: RunConfig,
                 progress: Callable[[str], None] | None = None):
        self.store, self.task, self.evaluator, self.proposer, self.cfg = store, task, evaluator, proposer, cfg
        self.progress = progress or (lambda msg: None)
        self.time_limited = False  # the last run() stopped at its time limit, budget left
        self._hardware = getattr(evaluator, "hardware", None)
        self.tree: Tree = Tree.new()
        self.state = SearchState()
        selected = task.select(cfg.workloads)
        # time the bench workloads; a selection of check workloads only is timed whole (small test runs)
        self.timing: bool | str = "bench" if any(w.purpose == "bench" for w in selected) else True

    # -- setup --------------------------------------------------------------------------------------

    @staticmethod
    def eval_config(cfg: RunConfig) -> EvalConfig:
        """The search's judge settings. The llm proposer's prompts from context "hardware" on show profiler and
        compiler evidence of passing kernels (`EvalConfig.profile`); the patterns proposer reads none of it."""
        profile = cfg.proposer == "llm" and cfg.llm is not None and cfg.llm.context != "none"
        return EvalConfig(seeds=correctness_seeds(cfg.seed, cfg.checks), timeout_s=cfg.timeout_s, timing=cfg.timing,
                          spare_workers=SPARE_WORKERS, profile=profile)

    def start(self) -> None:
        """Measure the naive kernel as the root, build the first tree, and save both (or reload them)."""
        snap = load_snapshot(self.store)
        if snap is not None:
            self._load(*snap)
            return
        naive = self.evaluator.naive_candidate()
        ev = self._stored_naive()  # a run stopped while building its first tree: measured already
        if ev is None:
            self.progress("baseline: judging the naive kernel")
            ev = self.evaluator.evaluate(naive, self.cfg.workloads, timing=self.timing, with_speedup=False)
            if ev.status is not Status.PASSED:
                raise SearchError(f"the task's naive kernel does not pass ({ev.status.value}): {ev.message}")
            self.evaluator.remember_naive(ev)
            for r in ev.workloads:
                if r.median_ms is not None:
                    r.speedup_vs_naive = 1.0
            self.store.put_baseline("naive", "candidate", {"candidate": naive.model_dump(mode="json"),
                                                           "evaluation": ev.model_dump(mode="json")})
        else:
            self.evaluator.remember_naive(ev)
        # the same measurement, so the same first prompt: an llm proposer's paid answer to it is replayed
        tree = attach(Tree.new(), ROOT_ID, naive.id, summarize(ev))
        tree, log = self._apply(tree, self.proposer.initial_edits(tree), "proposer:init")
        self.tree, self.state = tree, SearchState()
        self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(), log)

    def _stored_naive(self) -> Evaluation | None:
        """The naive kernel's saved evaluation when it passed, else None."""
        naive = self.store.baseline("naive")
        try:
            ev = Evaluation.model_validate(naive["evaluation"]) if naive else None
        except (ValidationError, KeyError, TypeError):
            return None
        return ev if ev is not None and ev.status is Status.PASSED else None

    def _load(self, tree: Tree, state: SearchState) -> None:
        self.tree, self.state = tree, state
        naive = self.store.baseline("naive")
        try:
            naive_ev = Evaluation.model_validate(naive["evaluation"]) if naive else None
        except (ValidationError, KeyError, TypeError):
            naive_ev = None
        if naive_ev is None:
            raise StoreError(f"run store {self.store.path} has a tree but no readable naive baseline")
        self.evaluator.remember_naive(naive_ev)

    # -- the loop -----------------------------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        """Candidate evaluations committed so far (what the budget counts)."""
        return self.store.evaluation_count()

    def done(self) -> bool:
        return self.evaluations >= self.cfg.budget

    def end_status(self) -> str:
        """The run's status once the search loop is over: ``finished`` (budget spent), ``time-limit`` (stopped by
        run()'s time limit: resumable) or ``exhausted`` (no action left, or a proposer repeating itself)."""
        return "finished" if self.done() else "time-limit" if self.time_limited else "exhausted"

    def run(self, on_step: Callable[[StepReport], None] | None = None, time_limit_s: float | None = None) -> None:
        """Steps until the budget is spent, no action is left, `MAX_IDLE_STEPS` steps in a row judged nothing
        new (a proposer that keeps writing kernels already judged: the budget counts judged kernels, so without
        this bound such a run would never end), or ``time_limit_s`` seconds (wall clock, from this call) have
        passed: no new step starts after that, the one under way finishes. Ctrl-C propagates after the store is
        safe."""
        idle, self.time_limited = 0, False
        deadline = None if time_limit_s is None else clock() + time_limit_s
        while not self.done():
            if deadline is not None and clock() >= deadline:
                self.progress(f"stopping: the time limit ({time_limit_s:g} s) is spent after "
                              f"{self.evaluations} of {self.cfg.budget} evaluations")
                self.time_limited = True
                break
            try:
                report = self.step()
            except LLMError as e:  # a stop during the refinement: the step's evaluation is saved, show it too
                done = getattr(e, "step_report", None)
                if done is not None and on_step:
                    on_step(done)
                raise
            if report is None:
                break
            if on_step:
                on_step(report)
            idle = idle + 1 if report.reused else 0
            if idle >= MAX_IDLE_STEPS:
                self.progress(f"stopping: {idle} steps in a row produced kernels already judged")
                break

    def _decide(self) -> Decision | None:
        decision = decide(self.tree, self.state, self.cfg.strategy)
        if decision is None:
            edits = self.proposer.expand(self.tree, self.state)
            if edits:
                self.tree, log = self._apply(self.tree, edits, "proposer:expand")
                self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(), log)
                decision = decide(self.tree, self.state, self.cfg.strategy)
        return decision

    def step(self) -> StepReport | None:
        """One decision, one evaluation, one atomic write. None when nothing is left to try.

        Raises the llm proposer's LLMBudgetExhausted / LLMUnavailable (the run stops; resumable): after the
        step's evaluation is saved when they come from the refinement, before anything is judged otherwise.

        A re-time the planner asked for (`Tree.retime`) is done first: one evaluation of that node's kernel beside
        its parent and the best, counted in the budget like any other."""
        while self.tree.retime:
            report = self._retime(self.tree.retime[0])
            if report is not None:
                return report
        decision = self._decide()
        if decision is None:
            return None
        node_id = decision.node_id
        node = self.tree[node_id]
        parent_cand = self._candidate_of(node.parent_id)
        try:
            candidate = self.proposer.propose(self.tree, node_id, parent_cand)
        except KnowledgeError as e:  # nothing to judge: the node fails, the run goes on
            candidate = None
            evaluation = Evaluation(candidate_id="", task=self.task.name, target=self.cfg.target,
                                    status=Status.COMPILE_ERROR, message=f"proposer could not write a kernel: {e}")
            reused = True
        if candidate is not None:
            candidate = candidate.model_copy(update={"node_id": node_id,
                                                     "parent_id": parent_cand.id if parent_cand else None})
            self.progress(f"{node_id} {node.label}: judging candidate {candidate.id}")
            previous = self.store.evaluation_of(candidate.id)
            if previous is not None:  # identical kernel already judged in this run: reuse, don't re-run
                evaluation, reused = previous, True
            else:
                evaluation = self.evaluator.evaluate(candidate, self.cfg.workloads, self.timing,
                                                     references=self.references_for(node.parent_id))
                reused = False
                self._keep_hardware()
        summary = summarize(evaluation)
        tree = attach(self.tree, node_id, candidate.id if candidate else None, summary)
        state = update_state(self.state, tree, node_id, summary)
        stop: LLMError | None = None
        try:
            refinement = self.proposer.refine(tree, node_id, state, None if reused else evaluation)
        except LLMError as e:  # out of budget, or the endpoint is down: keep the measurement, then stop
            refinement, stop = [], e
        tree, log = self._apply(tree, refinement, "proposer:refine")
        if reused:
            # no new evaluation row (the budget counts judged kernels); the tree change is still saved
            self.store.record_snapshot(tree.model_dump_json(), state.model_dump_json(), log)
            seq = self.evaluations
        else:
            seq = self.store.record_step(candidate, evaluation, summary.score, tree.model_dump_json(),
                                         state.model_dump_json(), decision.model_dump_json(), log)
        self.tree, self.state = tree, state
        report = StepReport(seq, node_id, node.label, decision, evaluation, summary.score,
                            tree[node_id].status.value, reused)
        if stop is not None:
            stop.step_report = report  # what `run` hands to on_step before the stop goes on
            raise stop
        return report

    def _retime(self, node_id: str) -> StepReport | None:
        """Judge the kernel of ``node_id`` again (see `step`); None when it cannot be (the request is dropped)."""
        node = self.tree[node_id] if node_id in self.tree else None
        cand = self.store.candidate(node.candidate_id) if node is not None and node.candidate_id else None
        if node is None or cand is None:
            self.tree = self.tree.replace(retime=tuple(i for i in self.tree.retime if i != node_id))
            self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(),
                                       [("controller", node_id, False, "re-time dropped: no stored kernel")])
            return None
        decision = Decision(node_id=node_id, reason=f"re-time {node_id} {node.label!r}: the planner asked",
                            score=0.0, alternatives=((node_id, 0.0),))
        self.progress(f"{node_id} {node.label}: re-timing candidate {cand.id} (the planner asked)")
        refs = [r for r in self.references_for(node.parent_id) if r.candidate.id != cand.id]  # not beside itself
        evaluation = self.evaluator.evaluate(cand, self.cfg.workloads, self.timing, references=refs)
        self._keep_hardware()
        summary = summarize(evaluation)
        tree = retimed(self.tree, node_id, cand.id, summary)
        state = update_state(self.state, tree, node_id, tree[node_id].evaluation)
        stop: LLMError | None = None
        try:
            refinement = self.proposer.refine(tree, node_id, state, evaluation)
        except LLMError as e:
            refinement, stop = [], e
        tree, log = self._apply(tree, refinement, "proposer:refine")
        seq = self.store.record_step(cand, evaluation, summary.score, tree.model_dump_json(), state.model_dump_json(),
                                     decision.model_dump_json(), log, retime=True)
        self.tree, self.state = tree, state
        report = StepReport(seq, node_id, node.label, decision, evaluation, summary.score,
                            tree[node_id].status.value, False)
        if stop is not None:
            stop.step_report = report
            raise stop
        return report

    # -- helpers ------------------------------------------------------------------------------------

    def _keep_hardware(self) -> None:
        """The judge re-probes a ceiling before it rejects a time below the floor: keep the corrected spec in the run
        (resume uses the stored one) and hand it to the proposer (its prompts quote the ceilings)."""
        hw = getattr(self.evaluator, "hardware", None)
        if hw is None or hw is self._hardware:
            return
        self._hardware = hw
        self.store.set_hardware(hw.model_dump(mode="json"))
        if hasattr(self.proposer, "hardware"):
            self.proposer.hardware = hw

    def references_for(self, parent_id: str | None) -> list[Reference]:
        """The kernels a child of ``parent_id`` is timed beside: its parent's (the naive kernel for a family
        root) and the current best's (the same kernel may hold both roles), with the speedups they were
        measured at."""
        refs: list[Reference] = []
        best = self.tree.best()
        for role, node_id in (("parent", parent_id), ("best", best.id if best else None)):
            if node_id is None:
                continue
            node = self.tree[node_id]
            if node_id == ROOT_ID or node.candidate_id == self.tree.root.candidate_id:
                cand, speedups = self.evaluator.naive_candidate(), None
            else:
                cand = self.store.candidate(node.candidate_id) if node.candidate_id else None
                ev = self.store.evaluation_of(node.candidate_id) if cand else None
                if cand is None or ev is None:
                    continue
                speedups = {r.workload: r.speedup_vs_naive for r in ev.workloads if r.speedup_vs_naive}
            refs.append(Reference(role, cand, speedups))  # the parent that is the best: one worker, two roles
        return refs

    def _candidate_of(self, node_id: str | None) -> Candidate | None:
        if node_id is None or node_id == ROOT_ID:
            return None
        cid = self.tree[node_id].candidate_id
        return self.store.candidate(cid) if cid else None

    @staticmethod
    def _apply(tree: Tree, edits, source: str) -> tuple[Tree, list[tuple[str, str, bool, str]]]:
        new, results = apply(tree, edits)
        log = []
        for edit, res in zip(edits, results):
            body = edit.model_dump_json() if hasattr(edit, "model_dump_json") else str(edit)
            log.append((source, body, res.ok, res.reason))
        return new, log

    def best(self) -> tuple[str, Candidate, Evaluation] | None:
        """(node id, candidate, evaluation) of the best solved node other than the root, or None."""
        node = self.tree.best()
        if node is None or node.id == ROOT_ID:
            return None
        cand = self.store.candidate(node.candidate_id)
        ev = self.store.evaluation_of(node.candidate_id)
        return node.id, cand, ev
