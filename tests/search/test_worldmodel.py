"""Tests for ksearch.search.worldmodel: records, tree queries, frontier, attach, round-trip."""

import json

import pytest
from pydantic import ValidationError

from ksearch.errors import SearchError
from ksearch.search.worldmodel import (
    ROOT_ID,
    Action,
    EvalSummary,
    Impacts,
    Node,
    NodeStatus,
    Tree,
    attach,
)


def ok(score: float) -> EvalSummary:
    return EvalSummary(status="PASSED", score=score, latency_ms={"w0": 1.0 / score})


BAD = EvalSummary(status="COMPILE_ERROR")


def node(nid: str, parent: str = ROOT_ID, **kw) -> Node:
    return Node(id=nid, parent_id=parent, action=Action(title=f"do {nid}"), **kw)


def sample() -> Tree:
    """root(1.0) -> A(solved 2.0) -> A1 (open), A2 (open); root -> B (open) -> B1 (open); root -> C (failed) -> C1."""
    t = Tree.new()
    t = attach(t, ROOT_ID, "base", ok(1.0))
    t = t.replace(node("A", choice="chunked"), node("B", choice="registers"), node("C"))
    t = t.replace(node("A1", "A"), node("A2", "A"), node("B1", "B"), node("C1", "C"))
    t = attach(t, "A", "cA", ok(2.0))
    return attach(t, "C", None, BAD)


def test_queries():
    t = sample()
    assert [n.id for n in t.children(ROOT_ID)] == ["A", "B", "C"]
    assert [n.id for n in t.path("A2")] == [ROOT_ID, "A", "A2"]
    assert t.depth(ROOT_ID) == 0 and t.depth("A") == 1 and t.depth("A2") == 2
    assert t.branch_of("A2") == "A" and t.branch_of("A") == "A" and t.branch_of(ROOT_ID) is None
    assert [n.id for n in t.siblings("A1")] == ["A2"]
    assert [n.id for n in t.subtree("A")] == ["A", "A1", "A2"]
    assert t["A"].label == "chunked" and "A" in t and "Z" not in t
    with pytest.raises(SearchError, match="'Z'"):
        t["Z"]


def test_frontier_open_nodes_under_root_or_passing_parent():
    t = sample()
    # A1, A2 under solved A; B under root; not B1 (parent open), not C1 (parent failed), not A (solved).
    assert [n.id for n in t.frontier()] == ["B", "A1", "A2"]
    t = attach(t, "A1", "cA1", ok(1.5))  # slower than A: regressed, but its code passes
    assert t["A1"].status == NodeStatus.REGRESSED
    t = t.replace(node("A1x", "A1"))
    assert "A1x" in [n.id for n in t.frontier()]


def test_attach_statuses_and_parent_score():
    t = sample()
    assert t["A"].status == NodeStatus.SOLVED and t["A"].attempts == 1
    assert t["C"].status == NodeStatus.FAILED and t["C"].candidate_id is None
    # explicit parent score overrides the tree's
    t2 = attach(t, "A2", "cA2", ok(2.5), parent_score=3.0, attempts=4)
    assert t2["A2"].status == NodeStatus.REGRESSED and t2["A2"].attempts == 4
    t3 = attach(t, "A2", "cA2", ok(2.5))
    assert t3["A2"].status == NodeStatus.SOLVED
    # an unmeasured root counts as 1.0: a first-level node slower than baseline regresses
    t4 = attach(Tree.new().replace(node("X")), "X", "cX", ok(0.8))
    assert t4["X"].status == NodeStatus.REGRESSED
    assert t["A2"].status == NodeStatus.OPEN  # the input tree is unchanged


def test_attach_never_overwrites():
    t = sample()
    with pytest.raises(SearchError, match="never overwritten"):
        attach(t, "A", "other", ok(9.0))
    with pytest.raises(SearchError, match="never overwritten"):
        attach(t, "C", "other", ok(9.0))
    with pytest.raises(SearchError, match="needs a candidate id"):
        attach(t, "B", None, ok(3.0))
    with pytest.raises(SearchError, match="unknown node id 'nope'"):
        attach(t, "nope", "x", ok(1.0))


def test_best_ignores_regressions():
    t = sample()
    assert t.best().id == "A"
    t = attach(t, "A1", "r", ok(1.9))
    assert t.best().id == "A"
    assert Tree.new().best() is None
    t = attach(Tree.new().replace(node("X")), "X", "cX", ok(0.5))
    assert t.best() is None  # only a regression is measured


def test_node_invariants():
    with pytest.raises(ValidationError, match="needs an action"):
        Node(id="x", parent_id=ROOT_ID)
    with pytest.raises(ValidationError, match="has a candidate"):
        node("x", candidate_id="c")
    with pytest.raises(ValidationError, match="no passing candidate"):
        node("x", status=NodeStatus.SOLVED)
    with pytest.raises(ValidationError):
        node("x", rating=10.5)
    with pytest.raises(ValidationError):
        node("x", confidence=-0.1)
    with pytest.raises(ValidationError):
        Action(title="t", difficulty=6)
    with pytest.raises(ValidationError):
        Impacts(hw_fit=11)
    with pytest.raises(ValidationError, match="needs a score"):
        EvalSummary(status="PASSED")


def test_tree_invariants():
    root = Node(id=ROOT_ID)
    with pytest.raises(ValidationError, match="duplicate"):
        Tree(nodes=(root, node("a"), node("a")))
    with pytest.raises(ValidationError, match="unknown parent"):
        Tree(nodes=(root, node("a", "zz")))
    with pytest.raises(ValidationError, match="no root"):
        Tree(nodes=(node("a"),))
    with pytest.raises(ValidationError, match="cycle"):
        Tree(nodes=(root, node("a", "b"), node("b", "a")))
    with pytest.raises(ValidationError, match="under dropped"):
        Tree(nodes=(root, node("a", status=NodeStatus.DROPPED), node("b", "a")))


def test_round_trip_exact():
    t = sample()
    t = t.replace(
        node(
            "P",
            "A",
            rating=7.25,
            confidence=0.1 + 0.2,  # a float with a long repr
            impacts=Impacts(memory_bandwidth=9, register_pressure=2.5, hw_fit=0, notes="spills at d=128"),
            payload={"knobs": {"chunk": 64, "vec": [2, 4]}, "pattern": "chunked-scan", "x": None},
        ),
        node("D", status=NodeStatus.DROPPED),
    )
    assert Tree.model_validate(t.model_dump()) == t
    again = Tree.model_validate_json(t.model_dump_json())
    assert again == t and again.model_dump() == t.model_dump()
    assert Tree.model_validate(json.loads(json.dumps(t.model_dump(mode="json")))) == t
    assert again["P"].confidence == 0.1 + 0.2 and again["C"].status is NodeStatus.FAILED
    assert [n.id for n in again.frontier()] == [n.id for n in t.frontier()]
