"""A search with hostile candidates mixed in, judged by the real evaluator: the run finishes, every hostile
candidate is stored with a failing status, and none of them ever becomes a parent (quarantine)."""

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.jail.sandbox import Policy
from ksearch.proposers.patterns import PatternsProposer
from ksearch.run.controller import Controller, RunConfig
from ksearch.search.worldmodel import ROOT_ID, EvalSummary, NodeStatus, Tree, attach
from ksearch.store.db import Store
from ksearch.tasks import load_task

from tests.eval.adversarial import hostile as k

TASK = load_task("selective-scan")
WORKLOADS = ["tiny"]  # one small workload: every hostile kernel shows itself on it
QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=0.5, flush_bytes=1 << 20)
HOSTILE = [k.SEGFAULT, k.ENDLESS, k.FORK_BOMB, k.ENV_KEYS, k.STALE_OUTPUT, k.FORGE_REPLY, k.MEMORY_HOG,
           k.BACKGROUND_THREAD]
FAILING = {Status.REJECTED, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.INCORRECT_NUMERICAL}


class HostileProposer(PatternsProposer):
    """The patterns proposer, except that every other kernel it writes is replaced by a hostile one."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls, self.hostile_ids = 0, set()

    def propose(self, tree, node_id, parent):
        self.calls += 1
        if self.calls % 2 == 1 and self.calls // 2 < len(HOSTILE):
            cand = Candidate(target="cpu", sources={"kernel.c": HOSTILE[self.calls // 2]}, meta={"hostile": True})
            self.hostile_ids.add(cand.id)
            return cand
        return super().propose(tree, node_id, parent)


def test_run_with_hostile_candidates_finishes_and_quarantines_them(tmp_path):
    store = Store(tmp_path / "run.sqlite", create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    cfg = RunConfig(task=TASK.name, budget=2 * len(HOSTILE), workloads=WORKLOADS, timeout_s=2.0, timing=QUICK)
    evaluator = Evaluator(TASK, config=EvalConfig(seeds=[1, 2, 3], timeout_s=2.0, timing=QUICK,
                                                  sandbox=Policy(address_space_bytes=1 << 30)))
    proposer = HostileProposer(TASK, "cpu", None)
    c = Controller(store, TASK, evaluator, proposer, cfg)
    c.start()
    c.run()
    assert c.evaluations == cfg.budget
    assert len(proposer.hostile_ids) == len(HOSTILE)
    for cid in proposer.hostile_ids:
        ev = store.evaluation_of(cid)
        assert ev is not None and ev.status in FAILING, (cid, ev and ev.status, ev and ev.message)
    nodes = {n.candidate_id: n for n in c.tree if n.candidate_id}
    for cid in proposer.hostile_ids:
        node = nodes[cid]
        assert node.status == NodeStatus.FAILED
        assert all(kid.status == NodeStatus.OPEN for kid in c.tree.children(node.id))  # never expanded
        assert node.id not in {n.parent_id for n in c.tree.frontier()}
    best = c.best()
    assert best is None or best[1].id not in proposer.hostile_ids
    assert any(store.evaluation_of(n.candidate_id).status is Status.PASSED for n in c.tree
               if n.candidate_id and n.candidate_id not in proposer.hostile_ids and n.id != ROOT_ID)
    evaluator.close()


def test_a_rejected_node_never_becomes_a_parent():
    t = attach(Tree.new(), ROOT_ID, "base", EvalSummary(status="PASSED", score=1.0, latency_ms={"w": 1.0}))
    from ksearch.search.worldmodel import Action, Node

    t = t.replace(Node(id="H", parent_id=ROOT_ID, action=Action(title="hostile")))
    t = t.replace(Node(id="H1", parent_id="H", action=Action(title="child of hostile")))
    t = attach(t, "H", "cH", EvalSummary(status="REJECTED"))
    assert t["H"].status == NodeStatus.FAILED
    assert "H1" not in [n.id for n in t.frontier()]
    assert t.best().id == ROOT_ID
