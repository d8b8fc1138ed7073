"""Tests for ksearch.search.edits: every edit op, valid and rejected, and batch semantics."""

import pytest
from pydantic import ValidationError

from ksearch.search.edits import Delete, Insert, NodeSpec, Split, Update, apply
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Node, NodeStatus, Tree, attach

ACT = {"title": "vectorize loads", "difficulty": 2}


def node(nid: str, parent: str = ROOT_ID, **kw) -> Node:
    return Node(id=nid, parent_id=parent, action=Action(title=f"do {nid}"), **kw)


def base() -> Tree:
    """root(1.0) -> A(solved 2.0, cand cA) -> A1 (open); root -> B (open) -> B1 (open); root -> C (failed)."""
    t = Tree.new()
    t = attach(t, ROOT_ID, "base", EvalSummary(status="PASSED", score=1.0))
    t = t.replace(node("A"), node("B"), node("C"), node("A1", "A"), node("B1", "B"))
    t = attach(t, "A", "cA", EvalSummary(status="PASSED", score=2.0))
    return attach(t, "C", None, EvalSummary(status="TIMEOUT"))


def one(tree, edit):
    new, (res,) = apply(tree, [edit])
    if not res.ok:
        assert new == tree  # a rejected edit changes nothing
    return new, res


def rejected(tree, edit, match):
    new, res = one(tree, edit)
    assert not res.ok and match in res.reason, res.reason
    assert new == tree and new is tree


# ---- insert ----------------------------------------------------------------------------------------


def test_insert_valid_generates_ids():
    t = base()
    batch = [Insert(parent_id="A", action=Action(**ACT), rating=7), {"op": "insert", "parent_id": "A", "action": ACT}]
    t2, results = apply(t, batch)
    assert [r.node_ids for r in results] == [("n1",), ("n2",)]
    assert t2["n1"].parent_id == "A" and t2["n1"].rating == 7 and t2["n1"].status == NodeStatus.OPEN
    assert t2.next_seq == 3 and "n1" not in t  # the input tree is unchanged
    t3, res = one(t2, Insert(id="mine", parent_id="B", action=Action(**ACT)))  # under an open node: allowed
    assert res.ok and t3["mine"].parent_id == "B"
    t4, res = one(t2.replace(node("n3")), Insert(parent_id=ROOT_ID, action=Action(**ACT)))
    assert res.node_ids == ("n4",)  # generated ids skip taken ones


def test_insert_rejected():
    t = base()
    rejected(t, Insert(parent_id="nope", action=Action(**ACT)), "unknown node id 'nope'")
    rejected(t, Insert(parent_id="C", action=Action(**ACT)), "parent 'C' failed")
    rejected(t, Insert(id="A1", parent_id="A", action=Action(**ACT)), "node id 'A1' already exists")
    rejected(t, {"op": "insert", "parent_id": "A", "action": ACT, "rating": 11}, "rating")
    rejected(t, {"op": "insert", "parent_id": "A", "action": {"title": "x", "difficulty": 0}}, "difficulty")
    rejected(t, {"op": "insert", "parent_id": "A"}, "action")
    rejected(t, {"op": "insert", "parent_id": "A", "action": ACT, "candidate_id": "sneaky"}, "candidate_id")
    rejected(t, {"op": "frobnicate"}, "malformed edit")
    t2, _ = one(t, Delete(node_id="B"))
    rejected(t2, Insert(parent_id="B", action=Action(**ACT)), "parent 'B' is dropped")


# ---- update ----------------------------------------------------------------------------------------


def test_update_valid():
    t = base()
    t2, res = one(t, Update(node_id="B", fields={"rating": 8.5, "confidence": 0.9, "action": {"difficulty": 1}}))
    assert res.ok and t2["B"].rating == 8.5 and t2["B"].confidence == 0.9
    assert t2["B"].action.difficulty == 1 and t2["B"].action.title == "do B"  # partial action merged
    t3, res = one(t2, Update(node_id="B", fields={"impacts": {"hw_fit": 9}, "payload": {"chunk": 32}}))
    assert res.ok and t3["B"].impacts.hw_fit == 9 and t3["B"].impacts.memory_bandwidth == 5
    # a tried node's beliefs may change, its candidate stays
    t4, res = one(t, Update(node_id="A", fields={"rating": 9, "confidence": 1}))
    assert res.ok and t4["A"].candidate_id == "cA" and t4["A"].rating == 9
    # move an open node under another live one
    t5, res = one(t, Update(node_id="B1", fields={"parent_id": "A"}))
    assert res.ok and t5["B1"].parent_id == "A" and "B1" in [n.id for n in t5.frontier()]


def test_update_rejected():
    t = base()
    rejected(t, Update(node_id="nope", fields={"rating": 1}), "unknown node id 'nope'")
    rejected(t, Update(node_id="B", fields={"rating": 11}), "rating")
    rejected(t, Update(node_id="B", fields={"confidence": -0.5}), "confidence")
    rejected(t, Update(node_id="B", fields={"action": {"difficulty": 9}}), "difficulty")
    rejected(t, Update(node_id="A", fields={"candidate_id": "evil"}), "would overwrite candidate 'cA'")
    rejected(t, Update(node_id="A", fields={"candidate_id": None}), "would overwrite candidate 'cA'")
    rejected(t, Update(node_id="B", fields={"candidate_id": "x"}), "only by the controller")
    for key in ("status", "evaluation", "attempts"):
        rejected(t, Update(node_id="A", fields={key: None}), "only by the controller")
    rejected(t, Update(node_id="B", fields={"id": "Z"}), "ids never change")
    rejected(t, Update(node_id="B", fields={"colour": "red"}), "unknown field 'colour'")
    rejected(t, Update(node_id="B", fields={}), "changes no field")
    rejected(t, Update(node_id="A", fields={"action": {"title": "rewrite history"}}), "history")
    rejected(t, Update(node_id="C", fields={"choice": "other"}), "history")
    rejected(t, Update(node_id="B", fields={"parent_id": "B1"}), "cycle")
    rejected(t, Update(node_id="B", fields={"parent_id": "B"}), "cycle")
    rejected(t, Update(node_id="B", fields={"parent_id": "C"}), "failed")
    rejected(t, Update(node_id="A1", fields={"parent_id": "nope"}), "unknown node id 'nope'")
    rejected(t, Update(node_id="A", fields={"parent_id": "B"}), "history")
    rejected(t, Update(node_id=ROOT_ID, fields={"parent_id": "B"}), "root")
    t2, _ = one(t, Delete(node_id="B"))
    rejected(t2, Update(node_id="B", fields={"rating": 1}), "dropped")


# ---- split -----------------------------------------------------------------------------------------


def test_split_valid():
    t = base()
    alts = [
        NodeSpec(choice="smem", action=Action(**ACT)),
        NodeSpec(id="regs", choice="regs", action=Action(**ACT), rating=8),
    ]
    t2, res = one(t, Split(node_id="B", into=alts))
    assert res.ok and res.node_ids[:2] == ("n1", "regs")
    assert t2["B"].status == NodeStatus.DROPPED and t2["B1"].status == NodeStatus.DROPPED
    assert [n.id for n in t2.children(ROOT_ID, live=True)] == ["A", "C", "n1", "regs"]
    assert t2["regs"].rating == 8 and t2["regs"].parent_id == ROOT_ID
    assert {"n1", "regs"} <= {n.id for n in t2.frontier()} and "B" not in {n.id for n in t2.frontier()}


def test_split_rejected():
    t = base()
    alts = [NodeSpec(action=Action(**ACT)), NodeSpec(action=Action(**ACT))]
    rejected(t, Split(node_id="A", into=alts), "only an open node")
    rejected(t, Split(node_id=ROOT_ID, into=alts), "only an open node")
    rejected(t, Split(node_id="nope", into=alts), "unknown node id")
    rejected(t, {"op": "split", "node_id": "B", "into": [{"action": ACT}]}, "at least 2")
    dup = [NodeSpec(id="x", action=Action(**ACT)), NodeSpec(id="x", action=Action(**ACT))]
    rejected(t, Split(node_id="B", into=dup), "'x' already exists")
    with pytest.raises(ValidationError):
        Split(node_id="B", into=alts[:1])
    # an open node whose subtree holds a tried node (attached out of frontier order) cannot be split
    t2 = attach(t, "B1", "cB1", EvalSummary(status="PASSED", score=1.1))
    rejected(t2, Split(node_id="B", into=alts), "'B1' in its subtree is solved")


# ---- delete ----------------------------------------------------------------------------------------


def test_delete_valid_drops_open_subtree():
    t = base()
    t2, res = one(t, Delete(node_id="B"))
    assert res.ok and set(res.node_ids) == {"B", "B1"}
    assert len(t2) == len(t) and t2["B1"].status == NodeStatus.DROPPED
    assert "B" not in {n.id for n in t2.frontier()} and [n.id for n in t2.children(ROOT_ID, live=True)] == ["A", "C"]


def test_delete_rejected():
    t = base()
    rejected(t, Delete(node_id=ROOT_ID), "cannot delete the root")
    rejected(t, Delete(node_id="A"), "tried nodes are history")  # has candidate cA
    rejected(t, Delete(node_id="C"), "tried nodes are history")  # failed
    rejected(t, Delete(node_id="nope"), "unknown node id")
    t2, _ = one(t, Delete(node_id="B1"))
    rejected(t2, Delete(node_id="B1"), "already dropped")


# ---- batches ---------------------------------------------------------------------------------------


def test_batch_per_edit_and_atomic():
    t = base()
    batch = [
        {"op": "insert", "id": "N", "parent_id": "A", "action": ACT},
        {"op": "update", "node_id": "N", "fields": {"rating": 9}},  # sees the insert before it
        {"op": "update", "node_id": "A", "fields": {"candidate_id": "evil"}},
        {"op": "delete", "node_id": "B1"},
    ]
    t2, results = apply(t, batch)
    assert [r.ok for r in results] == [True, True, False, True]
    assert t2["N"].rating == 9 and t2["A"].candidate_id == "cA" and t2["B1"].status == NodeStatus.DROPPED
    t3, results = apply(t, batch, atomic=True)
    assert t3 is t and not any(r.ok for r in results)
    assert results[0].reason == "rolled back: edit 2 was rejected"
    assert "would overwrite" in results[2].reason
    t4, results = apply(t, batch[:2], atomic=True)
    assert all(r.ok for r in results) and t4["N"].rating == 9


def test_edits_round_trip():
    from pydantic import TypeAdapter

    from ksearch.search.edits import Edit

    ta = TypeAdapter(list[Edit])
    edits = [
        Insert(parent_id="A", action=Action(**ACT), payload={"k": [1, 2]}),
        Update(node_id="B", fields={"rating": 3.5, "action": {"difficulty": 2}}),
        Split(node_id="B", into=[NodeSpec(action=Action(**ACT)), NodeSpec(id="q", action=Action(**ACT))]),
        Delete(node_id="B1"),
    ]
    assert ta.validate_json(ta.dump_json(edits)) == edits


# ---- retime and choose (issue 20) -------------------------------------------------------------------

def test_retime_queues_a_passing_node_once():
    from ksearch.search.edits import Retime
    t, res = one(base(), Retime(node_id="A"))
    assert res.ok and t.retime == ("A",)
    t2, res = one(t, {"op": "retime", "node_id": "A"})
    assert res.ok and "already queued" in res.reason and t2.retime == ("A",)


@pytest.mark.parametrize("nid, match", [("root", "the root"), ("C", "is failed"), ("B", "is open"),
                                        ("nope", "nope")])
def test_retime_refuses_what_holds_no_passing_kernel(nid, match):
    from ksearch.search.edits import Retime
    rejected(base(), Retime(node_id=nid), match)


def test_choose_takes_a_frontier_node_only():
    from ksearch.search.edits import Choose
    t, res = one(base(), Choose(node_id="A1"))
    assert res.ok and t.chosen == "A1"
    rejected(base(), Choose(node_id="B1"), "its parent 'B' holds no passing kernel yet")
    rejected(base(), Choose(node_id="A"), "it is solved")
    # an insert earlier in the same batch can be chosen
    t, results = apply(base(), [Insert(parent_id="A", id="A2", action=ACT), Choose(node_id="A2")])
    assert all(r.ok for r in results) and t.chosen == "A2"
