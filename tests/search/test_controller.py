"""The search loop on a deterministic fake judge: decisions, budget, dedup, resume, failures."""

import hashlib

import pytest

from ksearch.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.proposers.patterns import PatternsProposer
from ksearch.run.controller import Controller, RunConfig, score_of
from ksearch.store.db import Store
from ksearch.tasks import load_task

TASK = load_task("selective-scan")


class FakeJudge:
    """Scores a kernel by a hash of its source (same source, same score); fails kernels using 'fast-math'."""

    def __init__(self):
        self.task = TASK
        self.naive_ms = {}
        self.calls = []

    def naive_candidate(self):
        return Candidate(target="cpu", sources={"kernel.c": TASK.naive_sources["cpu"]})

    def remember_naive(self, ev):
        self.naive_ms = {r.workload: r.median_ms for r in ev.workloads}

    def evaluate(self, candidate, workloads=None, timing=True, with_speedup=True, references=()):
        self.calls.append(candidate.id)
        self.references = list(references)
        if "-ffast-math" in candidate.compile_flags:
            return Evaluation(candidate_id=candidate.id, task=TASK.name, target="cpu",
                              status=Status.INCORRECT_NUMERICAL, message="fake: fast-math is wrong here")
        h = int(hashlib.sha256(candidate.sources["kernel.c"].encode()).hexdigest()[:8], 16)
        naive = candidate.sources["kernel.c"] == TASK.naive_sources["cpu"]
        ms = 10.0 if naive else 10.0 / (1.0 + (h % 1000) / 100.0)
        res = WorkloadResult(workload="mamba370m-L512", status=Status.PASSED, median_ms=ms,
                             speedup_vs_naive=None if naive else 10.0 / ms)
        return Evaluation(candidate_id=candidate.id, task=TASK.name, target="cpu", status=Status.PASSED,
                          workloads=[res])


def make(tmp_path, budget=8, seed=0, name="run.sqlite"):
    store = Store(tmp_path / name, create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    cfg = RunConfig(task=TASK.name, budget=budget, seed=seed)
    c = Controller(store, TASK, FakeJudge(), PatternsProposer(TASK, "cpu", None), cfg)
    return c


def decisions(c):
    return [d["node_id"] for d in c.store.decisions()]


def test_run_spends_the_budget_and_never_judges_a_kernel_twice(tmp_path):
    c = make(tmp_path, budget=10)
    c.start()
    c.run()
    assert c.evaluations == 10
    judged = c.evaluator.calls[1:]  # the first call is the naive kernel
    assert len(judged) == len(set(judged)) == 10
    best = c.best()
    assert best is not None and best[2].status is Status.PASSED
    assert c.state.best_score == pytest.approx(score_of(best[2]))


def test_same_seed_same_decisions(tmp_path):
    runs = []
    for i in range(2):
        c = make(tmp_path, budget=12, name=f"r{i}.sqlite")
        c.start()
        c.run()
        runs.append(decisions(c))
    assert runs[0] == runs[1] and len(runs[0]) == 12


def test_resume_from_the_store_continues_identically(tmp_path):
    whole = make(tmp_path, budget=12, name="whole.sqlite")
    whole.start()
    whole.run()
    first = make(tmp_path, budget=12, name="part.sqlite")
    first.start()
    for _ in range(5):
        first.step()
    # a new process: only the store survives
    store = Store(tmp_path / "part.sqlite")
    again = Controller(store, TASK, FakeJudge(), PatternsProposer(TASK, "cpu", None), first.cfg)
    again.start()
    assert again.evaluations == 5 and again.tree == first.tree and again.state == first.state
    again.run()
    assert again.evaluations == 12
    assert decisions(again) == decisions(whole)
    assert again.evaluator.calls[0] not in first.evaluator.calls[1:]  # nothing committed is judged again


def test_failures_are_recorded_and_never_become_parents(tmp_path):
    c = make(tmp_path, budget=30)
    c.start()
    c.run()
    failed = [n for n in c.tree if n.status.value == "failed"]
    assert failed, "the fake judge fails every fast-math kernel; the search should have tried one"
    for n in failed:
        assert not c.tree.children(n.id)
    evs = c.store.evaluations()
    assert any(e.status is Status.INCORRECT_NUMERICAL for _, _, e in evs)


def test_regression_is_recorded_not_progress(tmp_path):
    c = make(tmp_path, budget=20)
    c.start()
    c.run()
    regressed = [n for n in c.tree if n.status.value == "regressed"]
    assert regressed, "the fake judge's hash scores make some child slower than its parent in 20 evaluations"
    for n in regressed:
        assert n.id in c.state.regressions
        assert n.evaluation.score < c.tree.parent_score(n.id)
    assert c.tree.best().status.value == "solved" and c.state.best_node_id not in c.state.regressions


def test_an_llm_stop_during_refinement_keeps_the_measurement(tmp_path):
    """The llm proposer's budget running out (or its endpoint dying) while it refines the tree after an
    evaluation: the evaluation is committed first, then the error stops the run; a resumed run goes on."""
    from ksearch.errors import LLMBudgetExhausted

    c = make(tmp_path, budget=6)
    c.start()
    real = c.proposer.refine
    calls = {"n": 0}

    def refine(tree, node_id, state, evaluation=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise LLMBudgetExhausted("--max-cost 0.01 USD reached")
        return real(tree, node_id, state, evaluation)

    c.proposer.refine = refine
    reports = []
    with pytest.raises(LLMBudgetExhausted):
        c.run(reports.append)
    assert c.evaluations == 3 and len(c.evaluator.calls) == 4  # naive + 3, the third one kept
    assert [r.seq for r in reports] == [1, 2, 3]  # the stopped step is reported too (its line was missing)
    c.proposer.refine = real
    again = Controller(c.store, TASK, c.evaluator, PatternsProposer(TASK, "cpu", None), c.cfg)
    again.start()
    again.run()
    assert again.evaluations == 6


def test_a_refinement_the_model_failed_is_asked_again_on_resume(tmp_path):
    """A 401 (or a timeout) during the planner's refine dropped that refinement: the resumed run never asked again.
    It is kept pending in the run's state and asked for first on resume, with the node's stored evaluation; a second
    failure keeps it pending."""
    from ksearch.errors import LLMError

    c = make(tmp_path, budget=6)
    c.start()
    real = c.proposer.refine
    failed = []

    def refine(tree, node_id, state, evaluation=None):
        if len(failed) == 0 and state.evaluations == 2:
            failed.append(node_id)
            raise LLMError("openai: HTTP 401: invalid api key")
        return real(tree, node_id, state, evaluation)

    c.proposer.refine = refine
    with pytest.raises(LLMError):
        c.run()
    assert c.evaluations == 2 and c.state.refine_pending == (failed[0],)
    asked = []

    def refuse(tree, node_id, state, evaluation=None):
        asked.append((node_id, evaluation))
        raise LLMError("openai: HTTP 401: invalid api key")

    store = Store(tmp_path / "run.sqlite")
    again = Controller(store, TASK, c.evaluator, PatternsProposer(TASK, "cpu", None), c.cfg)
    again.start()
    assert again.state.refine_pending == (failed[0],)  # saved with the step
    again.proposer.refine = refuse
    with pytest.raises(LLMError):
        again.run()
    assert again.evaluations == 2 and [a[0] for a in asked] == failed and asked[0][1].status is Status.PASSED
    third = Controller(Store(tmp_path / "run.sqlite"), TASK, c.evaluator, PatternsProposer(TASK, "cpu", None), c.cfg)
    third.start()
    assert third.state.refine_pending == (failed[0],)  # still pending after the second failure
    seen = []
    fine = third.proposer.refine
    third.proposer.refine = lambda tree, node_id, state, evaluation=None: seen.append(node_id) or fine(
        tree, node_id, state, evaluation)
    third.run()
    assert seen[0] == failed[0] and third.evaluations == 6 and third.state.refine_pending == ()


def test_a_stop_while_building_the_first_tree_does_not_measure_the_naive_kernel_again(tmp_path):
    """The llm proposer stopped at its first question (plan:initial: a limit, a dead endpoint, Ctrl-C): resume
    measured the naive kernel again, so the first prompt (which quotes its times) changed and the answer paid
    for, or written in the queue directory, was never used."""
    from ksearch.errors import LLMUnavailable

    c = make(tmp_path)
    seen = []

    def initial_edits(tree):
        seen.append(tree.model_dump_json())
        raise LLMUnavailable("the endpoint stayed down")

    c.proposer.initial_edits = initial_edits
    with pytest.raises(LLMUnavailable):
        c.start()
    again = Controller(c.store, TASK, FakeJudge(), PatternsProposer(TASK, "cpu", None), c.cfg)
    again.proposer.initial_edits = lambda tree: seen.append(tree.model_dump_json()) or []
    again.start()
    assert again.evaluator.calls == [] and seen[0] == seen[1]  # not judged again; the same tree to plan from
    assert again.evaluator.naive_ms == c.evaluator.naive_ms


def test_a_proposer_that_only_repeats_itself_cannot_keep_a_run_going(tmp_path):
    """Every step's kernel already judged (an llm can do that): the budget counts judged kernels, so the
    loop must end on its own after MAX_IDLE_STEPS idle steps."""
    from ksearch.run.controller import MAX_IDLE_STEPS

    c = make(tmp_path, budget=8)
    c.start()
    same = c.evaluator.naive_candidate()
    c.proposer.propose = lambda tree, node_id, parent: same
    reports = []
    c.run(reports.append)
    assert c.evaluations == 1 and all(r.reused for r in reports[1:])
    assert len(reports) <= MAX_IDLE_STEPS + 1


def test_time_limit_stops_starting_steps_and_resume_goes_on(tmp_path, monkeypatch):
    import ksearch.run.controller as controller

    clock = iter(range(0, 1000, 10))  # each monotonic() call: 10 s later
    monkeypatch.setattr(controller, "clock", lambda: next(clock))
    c = make(tmp_path, budget=12)
    c.start()
    c.run(time_limit_s=35)  # deadline at t=35: checks at 10, 20, 30 start steps, the one at 40 stops
    assert c.evaluations == 3 and c.end_status() == "time-limit"  # the run's status: not "exhausted"
    c.run()  # no limit: the rest of the budget (what `ksearch resume` does)
    assert c.evaluations == 12 and c.end_status() == "finished"


def test_a_family_whose_root_fails_is_searched_through_its_variants_once_nothing_passing_is_left(tmp_path):
    """A judge that fails every family's root render (one broken part of each default, as a decode combine
    kernel was on the H200): the run does not end with its budget left; the failed roots' one-step variants
    are tried under the root, marked as repairs, some pass and one becomes the best; a failed variant is not
    expanded again."""
    from ksearch.knowledge.pack import load_pack

    pack = load_pack(TASK.name, "cpu")
    roots = {pack.render(TASK.definition, {"family": f.id}, {}).sources["kernel.c"] for f in pack.families}
    roots.discard(TASK.naive_sources["cpu"])

    class RootsFail(FakeJudge):
        def evaluate(self, candidate, *a, **k):
            if candidate.sources["kernel.c"] in roots:
                self.calls.append(candidate.id)
                return Evaluation(candidate_id=candidate.id, task=TASK.name, target="cpu",
                                  status=Status.INCORRECT_NUMERICAL, message="fake: the default's combine is wrong")
            return super().evaluate(candidate, *a, **k)

    store = Store(tmp_path / "run.sqlite", create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    c = Controller(store, TASK, RootsFail(), PatternsProposer(TASK, "cpu", None), RunConfig(task=TASK.name, budget=15))
    c.start()
    c.run()
    assert c.evaluations == 15
    failed_roots = [n for n in c.tree.children("root") if n.status.value == "failed" and "repair_of" not in n.payload]
    assert failed_roots and not any(c.tree.children(n.id) for n in failed_roots)
    repairs = [n for n in c.tree if "repair_of" in n.payload]
    assert repairs and {n.parent_id for n in repairs} == {"root"}
    assert all(n.payload["repair_of"] in {f.id for f in failed_roots} for n in repairs)
    assert not any(c.tree.children(n.id) for n in repairs if n.status.value == "failed")
    best = c.best()
    assert best is not None and best[1].sources["kernel.c"] not in roots
    top = c.tree[best[0]]
    while top.parent_id != "root":
        top = c.tree[top.parent_id]
    assert "repair_of" in top.payload   # the best descends from a failed root's variant


def test_a_family_broken_in_a_shared_part_gets_one_batch_of_variants(tmp_path):
    """A judge that fails every non-naive kernel (the broken part is in all of a family's variants): each failed
    root gets REPAIR_BATCH variants, all fail, and the root is given up; the run ends with budget left."""
    from ksearch.proposers.patterns import REPAIR_BATCH

    class AllFail(FakeJudge):
        def evaluate(self, candidate, *a, **k):
            if candidate.sources["kernel.c"] == TASK.naive_sources["cpu"]:
                return super().evaluate(candidate, *a, **k)
            self.calls.append(candidate.id)
            return Evaluation(candidate_id=candidate.id, task=TASK.name, target="cpu",
                              status=Status.COMPILE_ERROR, message="fake: a shared header is broken")

    store = Store(tmp_path / "run.sqlite", create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    c = Controller(store, TASK, AllFail(), PatternsProposer(TASK, "cpu", None), RunConfig(task=TASK.name, budget=60))
    c.start()
    c.run()
    roots = [n for n in c.tree.children("root") if "repair_of" not in n.payload and n.status.value == "failed"]
    assert roots
    for r in roots:
        repairs = [n for n in c.tree if n.payload.get("repair_of") == r.id]
        assert len(repairs) == REPAIR_BATCH and all(n.status.value == "failed" for n in repairs)
    assert c.evaluations < 60 and not [n for n in c.tree if n.status.value == "open"]


def _planner_asks(c, first_refine_edits):
    """Make the proposer's first refinement add ``first_refine_edits(tree, node_id)`` to its own edits."""
    real = c.proposer.refine
    calls = {"n": 0, "evaluations": []}

    def refine(tree, node_id, state, evaluation=None):
        calls["n"] += 1
        calls["evaluations"].append((node_id, evaluation))
        edits = real(tree, node_id, state, evaluation)
        return edits + (first_refine_edits(tree, node_id) if calls["n"] == 1 else [])

    c.proposer.refine = refine
    return calls


def test_a_retime_the_planner_asks_for_is_judged_next_counted_and_kept_as_a_new_round(tmp_path):
    """issue 20: `retime` queues a solved node; the next step judges its kernel again beside its parent (not beside
    itself), the budget counts it, the store keeps both rounds, the tree shows the new reading and the old score,
    and the refinement after it gets the fresh evaluation."""
    from ksearch.search.edits import Retime

    c = make(tmp_path, budget=4)
    c.start()
    calls = _planner_asks(c, lambda tree, nid: [Retime(node_id=nid)] if tree[nid].status.value == "solved" else [])
    first = c.step()
    assert first.node_status == "solved", "the fake judge scores every first family above the naive kernel"
    assert c.tree.retime == (first.node_id,)
    second = c.step()
    assert second.node_id == first.node_id and "re-time" in second.decision.reason
    assert c.evaluator.calls[-1] == c.evaluator.calls[-2]  # the same kernel judged again
    assert first.evaluation.candidate_id not in [r.candidate.id for r in c.evaluator.references]
    assert c.evaluations == 2 and c.tree.retime == ()
    node = c.tree[first.node_id]
    assert node.evaluation.round == 1 and node.evaluation.previous_score == pytest.approx(first.score)
    rows = [e for _, _, e in c.store.evaluations() if e.candidate_id == first.evaluation.candidate_id]
    assert len(rows) == 2
    assert calls["evaluations"][-1][0] == first.node_id and calls["evaluations"][-1][1] is not None
    c.run()
    assert c.evaluations == 4


def test_a_retime_pending_when_the_run_stops_is_done_after_resume(tmp_path):
    from ksearch.search.edits import Retime

    c = make(tmp_path, budget=3)
    c.start()
    _planner_asks(c, lambda tree, nid: [Retime(node_id=nid)] if tree[nid].status.value == "solved" else [])
    first = c.step()
    again = Controller(c.store, TASK, c.evaluator, PatternsProposer(TASK, "cpu", None), c.cfg)
    again.start()
    assert again.tree.retime == (first.node_id,)
    report = again.step()
    assert report.node_id == first.node_id and "re-time" in report.decision.reason


def test_the_planners_choice_is_tried_next_over_the_ranking(tmp_path):
    """issue 20: `choose` names the next node; the strategy takes it (and says what its ranking would have
    taken), then the choice is spent."""
    from ksearch.search.edits import Choose
    from ksearch.search.strategy import decide

    c = make(tmp_path, budget=4)
    c.start()
    picked = {}

    def choose_lowest(tree, nid):
        frontier = sorted(tree.frontier(), key=lambda n: n.rating)
        ranked = decide(tree, c.state, c.cfg.strategy)
        low = next(n for n in frontier if ranked is None or n.id != ranked.node_id)
        picked["id"] = low.id
        return [Choose(node_id=low.id)]

    _planner_asks(c, choose_lowest)
    c.step()
    assert c.tree.chosen == picked["id"]
    report = c.step()
    assert report.node_id == picked["id"] and "the planner's choice" in report.decision.reason
    assert c.tree.chosen is None
