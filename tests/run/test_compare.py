"""Strategies compared at an equal budget (issue 22): the random and evolve strategies' draws, the per-strategy
summary of a comparison, and `ksearch compare` end to end on the null target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from ksearch.run.ablate_results import AblationResult, AblationRow
from ksearch.run.compare import new_comparison, parse_strategies, summarize
from ksearch.run.controller import RunConfig
from ksearch.search.edits import Insert, apply
from ksearch.search.strategy import SearchState, StrategyConfig, decide
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Tree, attach

from tests.conftest import fresh_home
from tests.quick_ksearch import command


def _tree():
    """root (1.0) -> a (solved 2.0: a1, a2 open), b (solved 1.5: b1 open), c (open)."""
    tree = attach(Tree.new(), ROOT_ID, "naive", EvalSummary(status="PASSED", score=1.0))
    ins = lambda parent, i, rating=5.0: Insert(parent_id=parent, id=i, decision=f"d-{parent}", choice=i,
                                               rating=rating, action=Action(title=i))
    tree, res = apply(tree, [ins(ROOT_ID, "a"), ins(ROOT_ID, "b"), ins(ROOT_ID, "c", rating=9.0)])
    tree = attach(tree, "a", "ka", EvalSummary(status="PASSED", score=2.0))
    tree = attach(tree, "b", "kb", EvalSummary(status="PASSED", score=1.5))
    tree, res2 = apply(tree, [ins("a", "a1"), ins("a", "a2"), ins("b", "b1")])
    assert all(r.ok for r in res + res2)
    return tree


def test_random_draws_uniformly_from_the_frontier_and_ignores_ratings():
    tree, cfg = _tree(), StrategyConfig(kind="random", seed=3)
    picks = Counter(decide(tree, SearchState(evaluations=i), cfg).node_id for i in range(400))
    assert set(picks) == {"a1", "a2", "b1", "c"}  # the frontier, and nothing else
    assert min(picks.values()) >= 70, picks  # ~100 each; c's rating of 9 buys it nothing
    again = Counter(decide(tree, SearchState(evaluations=i), cfg).node_id for i in range(400))
    assert again == picks  # seeded: the same draws


def test_evolve_breeds_from_its_islands_population_and_is_deterministic():
    tree, cfg = _tree(), StrategyConfig(kind="evolve", islands=2, seed=1)
    # families dealt in turn: island 1 holds a and c, island 2 holds b; the root belongs to both
    island1 = {decide(tree, SearchState(evaluations=2 * i), cfg).node_id for i in range(1, 5)}
    island2 = {decide(tree, SearchState(evaluations=2 * i + 1), cfg).node_id for i in range(0, 4)}
    assert island1 <= {"a1", "a2", "c"} and island2 <= {"b1", "c"}
    d = decide(tree, SearchState(evaluations=3), cfg)
    assert d.reason.startswith("evolve: island 2 of 2") and d == decide(tree, SearchState(evaluations=3), cfg)
    seen = Counter(decide(tree, SearchState(evaluations=2 * i), cfg).node_id for i in range(1, 200) if (2 * i) % 10)
    assert seen["a1"] + seen["a2"] > seen["c"], seen  # the island's elite (a, 2.0x) is bred from more than the root
    migrated = decide(tree, SearchState(evaluations=11), cfg.model_copy(update={"migration_interval": 11}))
    assert "(migration)" in migrated.reason


def test_evolve_with_no_parent_left_draws_from_the_whole_frontier():
    tree = _tree().replace(in_flight={"a1": "k1", "a2": "k2", "b1": "k3"})  # only c is left
    d = decide(tree, SearchState(evaluations=1), StrategyConfig(kind="evolve", islands=2))
    assert d.node_id == "c"
    assert decide(tree.replace(in_flight={"a1": "k", "a2": "k", "b1": "k", "c": "k"}), SearchState(),
                  StrategyConfig(kind="evolve")) is None


def test_parse_strategies_refuses_unknown_repeated_or_none():
    assert parse_strategies("worldmodel, evolve,random") == ["worldmodel", "evolve", "random"]
    for bad, why in (("greedy", "unknown strategy"), ("random,random", "more than once"), (" , ", "names none")):
        with pytest.raises(Exception, match=why):
            parse_strategies(bad)


def test_a_comparison_gives_every_strategy_the_same_seeds_and_summarizes_its_repeats():
    ab = new_comparison(RunConfig(task="selective-scan", budget=4, seed=10), ["worldmodel", "random"], 2, name="c1")
    assert [r.label for r in ab.runs] == ["worldmodel-1", "random-1", "worldmodel-2", "random-2"]
    assert {ab.config_for(x).seed for x in ("worldmodel-2", "random-2")} == {11}
    assert ab.config_for("random-1").strategy.kind == "random" and ab.config_for("random-1").strategy.seed == 10
    rows = [AblationRow(label=x, run_id=x, status="finished", evaluations=4, best_score=b, vs_naive=v)
            for x, b, v in (("worldmodel-1", 3.0, 2.8), ("random-1", 1.5, 1.4), ("worldmodel-2", 2.0, 2.1),
                            ("random-2", 1.2, None))]
    table = AblationResult(ablation_id="c1", task="selective-scan", target="cpu", budget=4, seed=10, rows=rows,
                           date="now")
    curves = {"worldmodel-1": [1.1, 2.9, 3.0, 3.0], "random-1": [1.2, 1.5, 1.5],  # a run cut short
              "worldmodel-2": [1.0, 1.0, 2.0, 2.0],
              "random-2": [1.2, 2.9, 1.2, 1.2]}  # a high reading a re-time revised down: it does not count
    s = summarize(ab, table, curves)
    assert s.best_any == 3.0 and s.goal == pytest.approx(2.85)
    wm, rnd = s.summaries
    assert (wm.vs_naive, wm.vs_naive_min, wm.vs_naive_max) == (pytest.approx(2.45), 2.1, 2.8)
    assert wm.each_to_goal == [2, None] and wm.reached == 1 and wm.evaluations_to_goal == 2
    assert wm.curve_median == [pytest.approx(1.05), pytest.approx(1.95), 2.5, 2.5]
    assert rnd.vs_naive == 1.4 and rnd.reached == 0
    assert rnd.curve_max == [1.2, 2.9, 1.5, 1.5]  # the short run keeps its last value
    assert rnd.each_to_goal == [None, None]


@pytest.mark.slow
def test_ksearch_compare_end_to_end_on_the_null_target(tmp_path):
    env = dict(os.environ, KSEARCH_HOME=str(fresh_home(tmp_path / "home")))
    out = tmp_path / "cmp" / "results.md"
    # the ksearch command with the quick timing plan (tests/quick_ksearch.py): the runs' and the re-time's figures
    # are not what this test checks
    p = subprocess.run(command("compare", "selective-scan", "--target", "null", "-w", "tiny", "--budget", "2",
                               "--repeats", "1", "-o", str(out)), env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [s["strategy"] for s in doc["summaries"]] == ["worldmodel", "evolve", "random"]
    assert all(r["status"] == "finished" and r["evaluations"] == 2 for r in doc["table"]["rows"])
    assert all(len(c) == 2 for c in doc["curves"].values())
    text = out.read_text()
    assert "evaluations to 95% of the best any run found" in text and "| worldmodel |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "pip install matplotlib" in p.stdout
    else:  # the curves as an image, linked from the results
        assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![best so far](results.png)" in text
    again = subprocess.run([sys.executable, "-m", "ksearch", "compare", "--resume", doc["table"]["ablation_id"],
                            "-o", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]  # finished: the stored results, nothing run again
    assert "to go" in again.stderr and "0 to go" in again.stderr


class ImproveOnlyCoder:
    """A proposer without a planner (any planner call fails the test): each kernel is its parent's with a comment
    added, so every one is new."""

    name = "improve-only"

    def __init__(self):
        self.calls: list[tuple[str, str, dict]] = []

    def initial_edits(self, tree):
        raise AssertionError("an evolutionary loop with a model asks no planner")

    def refine(self, tree, node_id, state, evaluation=None):
        raise AssertionError("an evolutionary loop with a model asks no planner")

    def expand(self, tree, state):
        raise AssertionError("an evolutionary loop with a model asks no planner")

    def propose(self, tree, node_id, parent):
        from ksearch.records import Candidate
        from tests.search.test_controller import TASK

        node = tree[node_id]
        self.calls.append((node_id, node.parent_id, node.payload))
        base = parent.sources["kernel.c"] if parent is not None else TASK.naive_sources["cpu"]
        return Candidate(target="cpu", sources={"kernel.c": base + f"\n/* {len(self.calls)} */\n"})


@pytest.mark.parametrize("kind", ["evolve", "random"])
def test_without_a_planner_the_loop_breeds_improvements_of_parents_it_draws(tmp_path, kind):
    from ksearch.run.controller import Controller
    from ksearch.store.db import Store
    from tests.search.test_controller import TASK, FakeJudge

    store = Store(tmp_path / "r.sqlite", create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    coder = ImproveOnlyCoder()
    cfg = RunConfig(task=TASK.name, budget=8, strategy=StrategyConfig(kind=kind, spawn=True, seed=2))
    c = Controller(store, TASK, FakeJudge(), coder, cfg)
    c.start()
    c.run()
    assert c.evaluations == 8
    assert all(payload.get("improve") is True for _, _, payload in coder.calls)  # the coder's improve prompt
    assert coder.calls[0][1] == ROOT_ID  # it starts from the naive kernel alone
    parents = {parent for _, parent, _ in coder.calls}
    assert parents - {ROOT_ID}, "later kernels are bred from measured ones, not only from the naive kernel"
    for _, parent, _ in coder.calls:  # every parent held a passing kernel when it was drawn
        assert parent == ROOT_ID or c.tree[parent].status.value in ("solved", "regressed")
    reasons = [d["reason"] for d in store.decisions()]
    assert all(r.startswith(f"{kind}:") and "a new improvement of it" in r for r in reasons)
