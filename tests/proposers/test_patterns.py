"""The patterns proposer takes its constraints from the hardware catalog (ksearch.proposers.patterns): a move
whose rendered kernel breaks a device limit is not proposed, and the reason is kept in the tree."""

import pytest

from ksearch.eval import static_checks
from ksearch.eval.static_limits import device_limit_rules
from ksearch.hardware import catalog
from ksearch.proposers.patterns import PatternsProposer
from ksearch.search.edits import Insert, Update, apply
from ksearch.search.worldmodel import ROOT_ID, EvalSummary, Tree, attach
from ksearch.tasks import load_task

TASK = load_task("selective-scan")


@pytest.fixture
def smaller_h200(monkeypatch):
    """The catalog's h200 with 48 KB opt-in shared memory and 128 threads per block (as a smaller GPU has)."""
    real = catalog.limits

    def limits(name):
        lim = real(name)
        if lim.name != "h200":
            return lim
        return lim.model_copy(update={"shared_memory_per_block_optin_bytes": 49152, "max_threads_per_block": 128})

    monkeypatch.setattr(catalog, "limits", limits)
    static_checks._rule_file.cache_clear()  # the rule files' reference limits (h200) resolve again
    yield catalog.to_spec("h200")
    monkeypatch.undo()
    static_checks._rule_file.cache_clear()


def test_device_limit_rules_follow_the_catalog_entry(smaller_h200):
    by_id = {r.id: r for r in device_limit_rules("cuda", smaller_h200)}
    assert by_id["threads-per-block"].limit_value == 128
    assert by_id["shared-memory-total"].limit_value == 49152
    assert "hardware catalog h200 (max_threads_per_block)" in by_id["threads-per-block"].limit_source
    # the real catalog entry: the real figures
    real = {r.id: r.limit_value for r in device_limit_rules("cuda", "h100-sxm")}
    assert real["threads-per-block"] == 1024 and real["shared-memory-total"] == 232448
    assert device_limit_rules("cpu", None) == []


def test_real_catalog_keeps_every_family_and_knob():
    p = PatternsProposer(TASK, "cuda", catalog.to_spec("h200"))
    edits = p.initial_edits(Tree.new())
    assert all(isinstance(e, Insert) for e in edits)
    assert {e.choice for e in edits} == {f.id for f in p.pack.families}


def test_a_catalog_limit_removes_a_family_with_its_reason(smaller_h200):
    """warp-chunks stages B and C tiles in 64 KiB of dynamic shared memory: over a 48 KB opt-in limit."""
    p = PatternsProposer(TASK, "cuda", smaller_h200)
    edits = p.initial_edits(Tree.new())
    families = [e.choice for e in edits if isinstance(e, Insert)]
    assert "warp-chunks" not in families and "naive" in families and "block-scan" in families
    (update,) = [e for e in edits if isinstance(e, Update)]
    assert update.node_id == ROOT_ID
    (pruned,) = update.fields["payload"]["pruned"]
    assert pruned["step"] == {"family": "warp-chunks"}
    assert "static check 'shared-memory-total'" in pruned["reason"]
    assert "over the limit of 49152 B" in pruned["reason"] and "hardware catalog h200" in pruned["reason"]
    tree, _ = apply(Tree.new(), edits)  # the reason lands in the tree
    assert tree.root.payload["pruned"] == [pruned]


def test_a_catalog_limit_removes_a_knob_value_with_its_reason(smaller_h200):
    """naive's threads knob is 64, 128 or 256: 256 threads per block break a 128-thread limit."""
    p = PatternsProposer(TASK, "cuda", smaller_h200)
    tree, _ = apply(Tree.new(), p.initial_edits(Tree.new()))
    naive = next(n for n in tree if n.choice == "naive")
    tree = attach(attach(tree, ROOT_ID, "cand-root", EvalSummary(status="PASSED", score=1.0)),
                  naive.id, "cand-naive", EvalSummary(status="PASSED", score=1.0))
    edits = p.refine(tree, naive.id, None)
    knob_values = {e.choice for e in edits if isinstance(e, Insert) and e.decision == "knob threads"}
    assert knob_values == {"threads=64"}
    updates = [e for e in edits if isinstance(e, Update) and "payload" in e.fields]
    (pruned,) = [x for u in updates for x in u.fields["payload"]["pruned"]]
    assert pruned["step"] == {"knob": "threads", "value": 256}
    assert "launches.0.block [256] is 256 threads per group, over the limit of 128" in pruned["reason"]
    assert "hardware catalog h200 (max_threads_per_block)" in pruned["reason"]
    # on another catalog entry (the real h100-sxm figures) the same node gets both values
    full = PatternsProposer(TASK, "cuda", catalog.to_spec("h100-sxm"))
    assert {e.choice for e in full.refine(tree, naive.id, None)
            if isinstance(e, Insert) and e.decision == "knob threads"} == {"threads=64", "threads=256"}


def test_a_knob_the_new_choice_also_has_is_kept_when_the_choice_changes():
    """token_tile=32 set under gather stays when the next step picks vector-transpose (which has token_tile too):
    the path said 32 while the kernel was rendered with the default 64."""
    p = PatternsProposer(TASK, "cpu", None)
    tree, _ = apply(Tree.new(), p.initial_edits(Tree.new()))
    fam = next(n for n in tree if n.choice == "channel-vectorized")
    tree, (r,) = apply(tree, [Insert(parent_id=fam.id, decision="knob token_tile", choice="token_tile=32",
                                     action=fam.action, payload={**fam.payload, "knobs": {"token_tile": 32},
                                                                 "step": {"knob": "token_tile", "value": 32}})])
    tile = tree[r.node_ids[0]]
    tree = attach(attach(tree, ROOT_ID, "c0", EvalSummary(status="PASSED", score=1.0)),
                  fam.id, "c1", EvalSummary(status="PASSED", score=2.0))
    tree = attach(tree, tile.id, "c2", EvalSummary(status="PASSED", score=3.0))
    kids = [e for e in p.refine(tree, tile.id, None) if isinstance(e, Insert) and e.payload["step"].get("decision")]
    moved = [k for k in kids if k.payload["choices"].get(k.payload["step"]["decision"]) in
             ("vector-transpose", "pipelined-transpose", "gather")]
    assert moved and all(k.payload["knobs"] == {"token_tile": 32} for k in moved)
