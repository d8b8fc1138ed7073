"""The search loop: choose an action, get its kernel, judge it, record what happened, refine the tree.

The controller is the only writer of run state. One *step* = one decision of the strategy, one candidate from
the proposer, one evaluation by the judge (on a worker of the executor: `ksearch.run.executor`), `attach`, the
proposer's refinement edits, and one atomic write to the store (evaluation + tree + strategy state). A candidate
is stored when it is sent, with the tree marking its node in flight (`Tree.in_flight`), so a run killed at any
point loses no committed evaluation, judges what was in flight first on resume, and never repeats a committed one.
With several workers, several steps are under way at once and commit in the order their evaluations end.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticSerializationError

from ksearch import __version__
from ksearch.errors import KnowledgeError, LLMError, SearchError, StoreError
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Evaluation, Status
from ksearch.eval.timing import Reference
from ksearch.llm.settings import LLMSettings
from ksearch.proposers.base import Proposer
from ksearch.search.edits import Insert, apply
from ksearch.search.strategy import Decision, SearchState, StrategyConfig, decide, update_state
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, NodeStatus, Tree, attach, retimed
from ksearch.run.executor import Executor, InlineExecutor, Lost
from ksearch.run.host import JobSpec, RefSpec, failed_evaluation
from ksearch.store.db import Store

if TYPE_CHECKING:
    from ksearch.tasks.loader import Task


#: the clock of --time-limit (a module attribute, so tests can replace it without touching the time module)
clock = time.monotonic

#: consecutive steps without a new evaluation after which a run ends (see `Controller.run`)
MAX_IDLE_STEPS = 25
#: seconds the loop waits for an evaluation to end before it refreshes the progress display
TICK_S = 0.5
#: workers the judge starts ahead for the next step (the candidate, its parent, the best: `EvalConfig.spare_workers`)
SPARE_WORKERS = 3


class RunConfig(BaseModel):
    """Everything that determines a run's decisions (saved with the run; resume reuses it as saved).

    ``budget``: evaluations of candidates (the naive baseline not counted); ``seed``: the strategy's tie
    breaks and the correctness inputs' seeds; ``timeout_s``: per kernel call; ``workers``, ``executor``,
    ``ray_address``: where and how many evaluations run at once (a resume may change them).
    """

    task: str
    #: a workloads file (JSONL) replacing the task's own (``--workloads-file``); absolute, so a resume finds it
    workloads_file: str | None = None
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
    #: evaluations at once, one worker each (`ksearch.run.executor`): 1 judges in this process as before
    workers: int = Field(default=1, ge=1)
    #: where the workers run: local (processes of this machine) or ray (a Ray cluster)
    executor: Literal["local", "ray"] = "local"
    #: the Ray cluster to join (None: start one on this machine; "auto": the one `ray start` runs here)
    ray_address: str | None = None


def run_config(store: Store) -> RunConfig:
    """The configuration a run was saved with. Raises StoreError when it does not decode."""
    try:
        return RunConfig.model_validate(store.run()["config"])
    except ValidationError as e:
        raise StoreError(f"{store.path} holds a run configuration that does not decode: "
                         f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None


def load_snapshot(store: Store, on_skip: Callable[[str], None] | None = None) -> tuple[Tree, SearchState] | None:
    """The newest tree and strategy state of a run that decode (None before the first). A newer snapshot that
    does not read or decode (a damaged store) is skipped, and ``on_skip`` told which and why: a resume goes on
    from the newest intact one, reusing the evaluations committed after it (`Controller._start_one`). Raises
    StoreError when no snapshot decodes."""
    seqs = store.snapshot_seqs()
    skipped: list[str] = []
    for seq in seqs:
        try:
            snap = store.snapshot(seq)
            if snap is None:
                continue
            loaded = Tree.model_validate_json(snap[1]), SearchState.model_validate_json(snap[2])
        except ValidationError as e:
            skipped.append(f"snapshot {seq} does not decode: {e.errors()[0]['msg']}")
            continue
        except StoreError as e:
            skipped.append(f"snapshot {seq} does not read: {e}")
            continue
        if skipped and on_skip is not None:
            on_skip(f"{store.path}: {'; '.join(skipped)}; going on from snapshot {seq}, the newest intact one")
        return loaded
    if skipped:
        raise StoreError(f"{store.path}: no snapshot decodes ({'; '.join(skipped[:3])})")
    return None


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
    #: the worker that judged it (None: none did)
    worker: str | None = None
    #: an llm limit or endpoint failure met while refining after it (the run stops once what is in flight is in)
    stop: LLMError | None = None


def unwrap_ctrl_c(fn):
    """``fn`` with a Ctrl-C that landed inside pydantic's serializer (its Rust core reports the KeyboardInterrupt
    raised there as a PydanticSerializationError naming it; seen under load, dumping the tree) re-raised as the
    KeyboardInterrupt it is, so every caller's Ctrl-C handling (``ksearch run``/``resume``, ablate's and compare's
    runs) sees it; any other serialization error is raised as it is."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PydanticSerializationError as e:
            if "KeyboardInterrupt" in str(e):
                raise KeyboardInterrupt from e
            raise

    return wrapper


class Controller:
    """Runs (or resumes) one search on one store.

    Args:
        store: the run's store (created, with its run row, by `start`, or an existing one for `resume`).
        task: the loaded task; evaluator: its judge; proposer: who writes edits and kernels; cfg: RunConfig.
        progress: called with short status lines during evaluation.
        make_executor: makes the executor from the naive kernel's evaluation (`ksearch.run.executor.make_executor`);
            None: the inline executor on ``evaluator``, one evaluation at a time.
    """

    def __init__(self, store: Store, task: Task, evaluator: Evaluator, proposer: Proposer, cfg: RunConfig,
                 progress: Callable[[str], None] | None = None,
                 make_executor: Callable[[Evaluation | None], Executor] | None = None):
        self.store, self.task, self.evaluator, self.proposer, self.cfg = store, task, evaluator, proposer, cfg
        self.progress = progress or (lambda msg: None)
        #: called about every `TICK_S` while evaluations are in flight (the progress display's refresh)
        self.on_tick: Callable[[], None] = lambda: None
        self.make_executor = make_executor
        self._executor: Executor | None = None
        self._jobs: dict[str, JobSpec] = {}  # node id -> its job, sent to a worker and not yet back
        self._decisions: dict[str, Decision] = {}  # node id -> the decision that sent it
        self._avoid: dict[str, str] = {}  # candidate id -> the worker lost judging it (sent elsewhere when it can)
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
        snap = load_snapshot(self.store, on_skip=self.progress)
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
        if not self.cfg.strategy.spawn:  # an evolutionary loop without a planner starts from the naive kernel alone
            tree, log = self._apply(tree, self.proposer.initial_edits(tree), "proposer:init")
        else:
            log = []
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

    @property
    def executor(self) -> Executor:
        """Where evaluations run, made on first use (`make_executor` with the naive kernel's evaluation; without
        it, the inline executor on this controller's judge)."""
        if self._executor is None:
            if self.make_executor is not None:
                self._executor = self.make_executor(self._stored_naive())
            else:
                self._executor = InlineExecutor(self.evaluator)
        return self._executor

    def close(self) -> None:
        """Stop the executor's workers (evaluations still in flight stay in the store's tree: resume judges them)."""
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    @unwrap_ctrl_c
    def run(self, on_step: Callable[[StepReport], None] | None = None, time_limit_s: float | None = None) -> None:
        """Evaluations until the budget is spent, no action is left, `MAX_IDLE_STEPS` steps in a row judged nothing
        new (a proposer that keeps writing kernels already judged: the budget counts judged kernels, so without
        this bound such a run would never end), or ``time_limit_s`` seconds (wall clock, from this call) have
        passed: no new evaluation starts after that, those under way finish.

        With several workers, every free worker gets a job (a queued re-time, else the strategy's next action,
        spread over branches: `ksearch.search.strategy.decide`), the proposer writes the next kernels while
        others are judged, and results are committed one at a time as they arrive (each with its refinement, in
        one transaction); the store records the order. An llm limit or an endpoint that stays down stops new
        work; the evaluations in flight are still committed (without refinement: asked for on resume, as is the one
        the model failed on), then the LLMError propagates.
        Ctrl-C propagates after the store is safe (evaluations in flight are judged again on resume)."""
        on_step = on_step or (lambda r: None)
        idle, self.time_limited = 0, False
        deadline = None if time_limit_s is None else clock() + time_limit_s
        stop: LLMError | None = None
        self.refine_pending()  # a stopped run's refinements first: the tree they change decides what comes next
        for report in self._requeue() if self.tree.in_flight else []:
            on_step(report)
        while True:
            while stop is None and self._left() > 0 and self.executor.free() > 0:
                if deadline is not None and clock() >= deadline:
                    if not self.time_limited:
                        self.progress(f"stopping: the time limit ({time_limit_s:g} s) is spent after "
                                      f"{self.evaluations} of {self.cfg.budget} evaluations")
                        self.time_limited = True
                    break
                if idle >= MAX_IDLE_STEPS:
                    break
                try:
                    started = self._start_one()
                except LLMError as e:  # before anything was judged for this step
                    stop = e
                    break
                if started is None:
                    break
                if isinstance(started, StepReport):  # ended at once: a kernel judged before, or none written
                    on_step(started)
                    idle = idle + 1 if started.reused else 0
                    if idle >= MAX_IDLE_STEPS:
                        self.progress(f"stopping: {idle} steps in a row produced kernels already judged")
                    if started.stop is not None:
                        stop = started.stop
            if self._executor is None or not self.executor.busy():
                if not self._waiting():
                    break
                if not self.executor.workers():  # jobs wait for a worker, and none can come back
                    raise SearchError("every worker is down, with evaluations still to judge (kept in the run): "
                                      "continue with ksearch resume")
            for report in self._collect(refine=stop is None):
                on_step(report)
                idle = idle + 1 if report.reused else 0
                if report.stop is not None and stop is None:
                    stop = report.stop
                    stop.step_report = report  # type: ignore[attr-defined]
            self.on_tick()
        if stop is not None:
            raise stop

    def refine_pending(self) -> None:
        """Ask the proposer for the refinements a stopped run did not get (`SearchState.refine_pending`: its model
        failed during them, or the run stopped before them), oldest first, each written as it comes.

        Raises the proposer's LLMError when it fails again (what was asked stays pending)."""
        while self.state.refine_pending:
            node_id, rest = self.state.refine_pending[0], self.state.refine_pending[1:]
            refinement: list = []
            if node_id in self.tree:
                node = self.tree[node_id]
                ev = self.store.evaluation_of(node.candidate_id) if node.candidate_id else None
                self.progress(f"{node_id} {node.label}: asking again for the refinement the stopped run did not get")
                refinement = self.proposer.refine(self.tree, node_id, self.state, ev)
            state = self.state.model_copy(update={"refine_pending": rest})
            tree, log = self._apply(self.tree, refinement, "proposer:refine")
            self.store.record_snapshot(tree.model_dump_json(), state.model_dump_json(), log)
            self.tree, self.state = tree, state

    def step(self) -> StepReport | None:
        """One decision, one evaluation, one atomic write, on the executor's first free worker and waiting for its
        result. None when nothing is left to try. Refinements a stopped run did not get are asked for first
        (`refine_pending`).

        Raises the llm proposer's LLMBudgetExhausted / LLMUnavailable (the run stops; resumable): after the
        step's evaluation is saved when they come from the refinement, before anything is judged otherwise.

        A re-time the planner asked for (`Tree.retime`) is done first: one evaluation of that node's kernel beside
        its parent and the best, counted in the budget like any other."""
        self.refine_pending()
        for report in self._requeue() if self.tree.in_flight else []:
            return self._raise_stop(report)
        if not self.executor.busy():
            started = self._start_one()
            if started is None:
                return None
            if isinstance(started, StepReport):
                return self._raise_stop(started)
        reports: list[StepReport] = []
        while not reports:
            reports = self._collect()
        return self._raise_stop(reports[0])

    @staticmethod
    def _raise_stop(report: StepReport) -> StepReport:
        if report.stop is not None:
            report.stop.step_report = report  # type: ignore[attr-defined]
            raise report.stop
        return report

    def _left(self) -> int:
        """Evaluations that may still start: the budget less those committed and those in flight (sent, waiting to
        be sent again after a lost worker, or to be judged after a resume; a kernel in flight for several nodes
        counts once)."""
        return self.cfg.budget - self.evaluations - len(set(self.tree.in_flight.values()))

    def _decide(self) -> Decision | None:
        decision = decide(self.tree, self.state, self.cfg.strategy)
        if decision is None and not self.tree.in_flight:  # with results still to come, wait for them first
            edits = self.proposer.expand(self.tree, self.state)
            if edits:
                self.tree, log = self._apply(self.tree, edits, "proposer:expand")
                self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(), log)
                decision = decide(self.tree, self.state, self.cfg.strategy)
        return decision

    def _start_one(self) -> StepReport | JobSpec | None:
        """Start the next evaluation: a queued re-time first, else the strategy's next action with the proposer's
        kernel. Returns the job sent (or parked behind the same kernel in flight), a StepReport when the step ended
        at once (the kernel was judged before, or the proposer wrote none), None when nothing can start now.
        Raises LLMError from the proposer (nothing judged)."""
        for node_id in list(self.tree.retime):
            if node_id in self.tree.in_flight:
                continue
            started = self._start_retime(node_id)
            if started is not None:
                return started
        decision = self._decide()
        if decision is None:
            return None
        if decision.spawn:
            decision = self._spawn(decision)
        node_id = decision.node_id
        node = self.tree[node_id]
        parent_cand = self._candidate_of(node.parent_id)
        try:
            candidate = self.proposer.propose(self.tree, node_id, parent_cand)
        except KnowledgeError as e:  # nothing to judge: the node fails, the run goes on
            evaluation = Evaluation(candidate_id="", task=self.task.name, target=self.cfg.target,
                                    status=Status.COMPILE_ERROR, message=f"proposer could not write a kernel: {e}")
            return self._commit(node_id, None, evaluation, decision, reused=True)
        candidate = candidate.model_copy(update={"node_id": node_id,
                                                 "parent_id": parent_cand.id if parent_cand else None})
        previous = self.store.evaluation_of(candidate.id)
        if previous is not None:  # identical kernel already judged in this run: reuse, don't re-run
            self.progress(f"{node_id} {node.label}: candidate {candidate.id} was judged before")
            return self._commit(node_id, candidate, previous, decision, reused=True)
        job = JobSpec(key=f"{node_id}:{candidate.id}", node_id=node_id, candidate=candidate,
                      workloads=self.cfg.workloads, timing=self.timing,
                      references=[RefSpec.of(r) for r in self.references_for(node.parent_id)])
        return self._send(job, decision)

    def _spawn(self, decision: Decision) -> Decision:
        """A new open child of ``decision``'s node: an improvement of its kernel (payload ``improve``: the coder gets
        its code and measurements), the action the decision stands for from now on."""
        parent = decision.node_id
        tree, results = apply(self.tree, [Insert(
            parent_id=parent, decision="mutation", choice=f"improve {parent}",
            action=Action(title=f"improve the kernel of {parent}", difficulty=2,
                          description="Make this kernel faster without breaking it, from its code and its "
                                      "measurements."),
            payload={"improve": True})])
        if not results[0].ok:
            raise SearchError(f"cannot add an improvement under {parent}: {results[0].reason}")
        child = results[0].node_ids[0]
        self.tree = tree
        return decision.model_copy(update={"node_id": child, "spawn": False,
                                           "reason": f"{decision.reason} ({child})"})

    def _start_retime(self, node_id: str) -> JobSpec | None:
        """Send the kernel of ``node_id`` to be judged again (see `step`); None when it cannot be (the request is
        dropped)."""
        node = self.tree[node_id] if node_id in self.tree else None
        cand = self.store.candidate(node.candidate_id) if node is not None and node.candidate_id else None
        if node is None or cand is None:
            self.tree = self.tree.replace(retime=tuple(i for i in self.tree.retime if i != node_id))
            self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(),
                                       [("controller", node_id, False, "re-time dropped: no stored kernel")])
            return None
        decision = Decision(node_id=node_id, reason=f"re-time {node_id} {node.label!r}: the planner asked",
                            score=0.0, alternatives=((node_id, 0.0),))
        refs = [r for r in self.references_for(node.parent_id) if r.candidate.id != cand.id]  # not beside itself
        job = JobSpec(key=f"{node_id}:{cand.id}:retime", node_id=node_id, candidate=cand,
                      workloads=self.cfg.workloads, timing=self.timing, references=[RefSpec.of(r) for r in refs],
                      retime=True)
        return self._send(job, decision)

    def _send(self, job: JobSpec, decision: Decision, avoid: str | None = None, record: bool = True) -> JobSpec:
        """Mark ``job``'s node in flight, save that with its candidate, and hand the job to a free worker; a job
        whose kernel is already in flight for another node waits for that evaluation (parked, not sent)."""
        node = self.tree[job.node_id]
        verb = "re-timing" if job.retime else "judging"
        parked = not job.retime and job.candidate.id in {j.candidate.id for j in self._jobs.values()}
        self._decisions[job.node_id] = decision
        if record:
            self.tree = self.tree.replace(in_flight={**self.tree.in_flight, job.node_id: job.candidate.id})
            log = [("controller", json.dumps({"dispatch": job.node_id, "candidate": job.candidate.id,
                                              "retime": job.retime, "parked": parked}), True, "")]
            self.store.record_dispatch(job.candidate, self.tree.model_dump_json(), self.state.model_dump_json(), log)
        if parked:
            self.progress(f"{job.node_id} {node.label}: candidate {job.candidate.id} is being judged for another "
                          "node; waiting for it")
            return job
        self._jobs[job.node_id] = job
        worker = self.executor.submit(job, avoid=avoid)
        self.progress(f"{job.node_id} {node.label}: {verb} candidate {job.candidate.id}"
                      + ("" if self.executor.slots == 1 else f" on {worker}"))
        return job

    def _requeue(self, refine: bool = True) -> list[StepReport]:
        """Send again the jobs of nodes the tree has in flight that no worker runs (a run stopped or killed with
        evaluations in flight, or a lost worker's job), first come first; each kernel is judged once. A node whose
        kernel the store has judged meanwhile (it waited on the same kernel for another node, and the run stopped
        between the two commits) takes that evaluation at once: those steps are returned."""
        reports: list[StepReport] = []
        for node_id, cand_id in list(self.tree.in_flight.items()):
            if node_id in self._jobs or any(j.candidate.id == cand_id for j in self._jobs.values()):
                continue  # running, or parked behind the same kernel in flight
            node = self.tree[node_id]
            cand = self.store.candidate(cand_id)
            if cand is None:
                raise StoreError(f"{self.store.path}: node {node_id} is in flight with candidate {cand_id}, "
                                 "which the store does not hold")
            retime = node.status is not NodeStatus.OPEN
            judged = None if retime else self.store.evaluation_of(cand_id)
            if judged is not None:
                reports.append(self._commit(node_id, cand.model_copy(update={"node_id": node_id}), judged,
                                            self._decisions.pop(node_id, None), reused=True, refine=refine))
                continue
            if not self.executor.free():
                continue
            avoid = self._avoid.get(cand_id)
            if avoid is not None and self.executor.busy() and not self.executor.free(avoid):
                continue  # lost on ``avoid``: wait for another worker while others are still judging
            refs = [r for r in self.references_for(node.parent_id) if r.candidate.id != cand.id]
            job = JobSpec(key=f"{node_id}:{cand.id}" + (":retime" if retime else ""), node_id=node_id,
                          candidate=cand, workloads=self.cfg.workloads, timing=self.timing,
                          references=[RefSpec.of(r) for r in refs], retime=retime)
            decision = self._decisions.get(node_id) or Decision(
                node_id=node_id, reason=f"in flight when the run stopped; judged after it resumed ({node.label!r})",
                score=0.0, alternatives=((node_id, 0.0),))
            self._avoid.pop(cand_id, None)
            self._send(job, decision, avoid=avoid, record=False)
        return reports

    def _waiting(self) -> bool:
        """Whether nodes are in flight that no worker runs (jobs waiting for a worker to come back)."""
        return any(n not in self._jobs for n in self.tree.in_flight)

    def _collect(self, refine: bool = True) -> list[StepReport]:
        """Wait (up to `TICK_S`) for evaluations to end and commit each, in the order they arrive; a lost worker's
        job is sent again once (then failed), an infrastructure fault recorded either way."""
        reports: list[StepReport] = []
        for event in self.executor.wait(TICK_S):
            job = event.job
            self._jobs.pop(job.node_id, None)
            if isinstance(event, Lost):
                reports += self._lost(event, refine)
                continue
            self._keep_hardware(event.result.hardware)
            reports.append(self._commit(job.node_id, job.candidate, event.result.evaluation,
                                        self._decisions.pop(job.node_id, None), reused=False, retime=job.retime,
                                        refine=refine, worker=event.worker))
            if not job.retime:
                reports += self._settle_parked(job, event.result.evaluation, refine)
        return reports + self._requeue(refine)

    def _settle_parked(self, job: JobSpec, evaluation: Evaluation, refine: bool) -> list[StepReport]:
        """The nodes that waited on ``job``'s kernel take its evaluation (reused: no second evaluation row)."""
        return [self._commit(other, job.candidate.model_copy(update={"node_id": other}), evaluation,
                             self._decisions.pop(other, None), reused=True, refine=refine)
                for other, cand_id in list(self.tree.in_flight.items())
                if cand_id == job.candidate.id and other not in self._jobs]

    def _lost(self, event: Lost, refine: bool) -> list[StepReport]:
        """A job whose worker was lost: sent again once (elsewhere when another worker is free); lost again, a
        re-time is dropped (the node keeps its verdict: it was never found wrong), any other job fails unjudged,
        and the nodes waiting on its kernel with it. Every loss is a fault in the store."""
        job = event.job
        attempt = f"{job.key}#{self.store.rounds(job.candidate.id)}"  # this judgment, not an earlier round's
        if self.store.faults_of(attempt) < 1:
            self.store.record_fault(job.node_id, job.candidate.id, event.worker, event.reason, "requeued", attempt)
            self.progress(f"{job.node_id}: worker {event.worker} lost ({event.reason[:80]}); judging "
                          f"{job.candidate.id} again on another worker")
            self._avoid[job.candidate.id] = event.worker  # `_requeue` sends it again, elsewhere when it can
            return []
        if job.retime:
            self.store.record_fault(job.node_id, job.candidate.id, event.worker, event.reason, "dropped", attempt)
            self.progress(f"{job.node_id}: worker {event.worker} lost again; the re-time is dropped, the node keeps "
                          "its verdict")
            self.tree = self.tree.replace(retime=tuple(i for i in self.tree.retime if i != job.node_id),
                                          in_flight={k: v for k, v in self.tree.in_flight.items() if k != job.node_id})
            self.store.record_snapshot(self.tree.model_dump_json(), self.state.model_dump_json(),
                                       [("controller", job.node_id, False, "re-time dropped: its worker was lost "
                                                                           "twice")])
            self._decisions.pop(job.node_id, None)
            return []
        self.store.record_fault(job.node_id, job.candidate.id, event.worker, event.reason, "failed", attempt)
        self.progress(f"{job.node_id}: worker {event.worker} lost again; {job.candidate.id} fails unjudged")
        ev = failed_evaluation(job, self.task.name, self.cfg.target, event.reason[:300])
        return [self._commit(job.node_id, job.candidate, ev, self._decisions.pop(job.node_id, None),
                             reused=False, refine=refine, worker=event.worker),
                *self._settle_parked(job, ev, refine)]

    def _commit(self, node_id: str, candidate: Candidate | None, evaluation: Evaluation, decision: Decision | None,
                *, reused: bool, retime: bool = False, refine: bool = True, worker: str | None = None) -> StepReport:
        """Attach an evaluation to its node, update the strategy state, ask the proposer to refine the tree, and
        write it all in one transaction (no evaluation row when ``reused``: the budget counts judged kernels)."""
        decision = decision or Decision(node_id=node_id, reason="resumed", score=0.0, alternatives=((node_id, 0.0),))
        node = self.tree[node_id]
        in_flight = {k: v for k, v in self.tree.in_flight.items() if k != node_id}
        summary = summarize(evaluation)
        if retime:
            assert candidate is not None
            tree = retimed(self.tree.replace(in_flight=in_flight), node_id, candidate.id, summary)
            state = update_state(self.state, tree, node_id, tree[node_id].evaluation)  # type: ignore[arg-type]
        else:
            tree = attach(self.tree.replace(in_flight=in_flight), node_id, candidate.id if candidate else None,
                          summary)
            state = update_state(self.state, tree, node_id, summary)
        stop: LLMError | None = None
        refinement: list = []
        if not self.cfg.strategy.spawn:  # no planner for an evolutionary loop with a model
            if refine:
                try:
                    refinement = self.proposer.refine(tree, node_id, state, None if reused else evaluation)
                except LLMError as e:  # out of budget, or the endpoint is down: keep the measurement, then stop
                    stop = e
            if not refine or stop is not None:  # asked for again when the run resumes
                state = state.model_copy(update={"refine_pending": (*state.refine_pending, node_id)})
        tree, log = self._apply(tree, refinement, "proposer:refine")
        if reused or candidate is None:
            self.store.record_snapshot(tree.model_dump_json(), state.model_dump_json(), log)
            seq = self.evaluations
        else:
            seq = self.store.record_step(candidate, evaluation, summary.score, tree.model_dump_json(),
                                         state.model_dump_json(), decision.model_dump_json(), log, retime=retime)
        self.tree, self.state = tree, state
        return StepReport(seq, node_id, node.label, decision, evaluation, summary.score, tree[node_id].status.value,
                          reused, worker=worker, stop=stop)

    # -- helpers ------------------------------------------------------------------------------------

    def _keep_hardware(self, spec: dict | None) -> None:
        """A judge re-probes a ceiling before it rejects a time below the floor: keep the corrected spec (``spec``,
        as JSON; None: unchanged) in the run (resume uses the stored one), in this controller's judge and in the
        proposer (its prompts quote the ceilings)."""
        if spec is None:
            return
        from ksearch.hardware.spec import HardwareSpec

        hw = HardwareSpec.model_validate(spec)
        self._hardware = hw
        if hasattr(self.evaluator, "hardware"):
            self.evaluator.hardware = hw
        self.store.set_hardware(spec)
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
