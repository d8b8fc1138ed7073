"""The Ray executor on a cluster of two Ray nodes on this machine, standing for two hosts (issue 27; Ray's own
`ray.cluster_utils.Cluster`: a head node and a second node, each with its own raylet; no mocks of Ray): one worker
lands on each node; the second node is killed while its worker judges a kernel; the kernel is judged again on the
head, the replacement actor (for which no node has room) is given up after `REPLACE_S` without holding up the
run, which goes on with one worker; the run is then stopped with evaluations in flight and resumed on the
surviving node: every evaluation recorded once, none lost."""

from __future__ import annotations

import os
import time

import pytest

from ksearch.proposers.patterns import PatternsProposer
from ksearch.records import Status
from ksearch.run import ray_executor
from ksearch.run.controller import Controller
from ksearch.run.executor import make_executor
from ksearch.store.db import Store

from tests.run.test_executor import REAL, SlowNthProposer, real_controller

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers need two CPUs")]

#: room after the replacement is given up (REPLACE_S below): with 5, a quiet machine finished the run while the lost
#: worker's replacement was still pending, before the test's stop (Ctrl-C with one worker busy) could happen
BUDGET = 8


def test_two_ray_nodes_one_killed_mid_evaluation_lose_and_repeat_nothing_and_the_run_resumes(tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setattr(ray_executor, "REPLACE_S", 2.0)
    t0 = time.monotonic()
    # one CPU each in Ray's accounting: one worker per node, and no room for a replacement once a node is gone
    cluster = cluster_utils.Cluster(initialize_head=True, connect=False,
                                    head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        head_id, second_id = cluster.head_node.node_id, second.node_id
        cfg = REAL.model_copy(update={"executor": "ray", "ray_address": cluster.address, "budget": BUDGET,
                                      "workloads": ["tiny", "small-b2"]})  # a 100M-spin kernel judged long enough
        c, judge = real_controller(tmp_path, cfg)
        lines: list[str] = []
        c.progress = lambda m: lines.append(f"{time.monotonic() - t0:.1f} {m}")
        lines.append(f"{time.monotonic() - t0:.1f} cluster up")
        c.make_executor = lambda naive: make_executor(cfg, judge, naive, progress=c.progress)
        c.proposer = proposer = SlowNthProposer(c.task, "cpu", None, n=None, spins=100_000_000)
        c.start()
        seen: dict = {}

        def kill_the_second_node_then_stop():
            pool = c._executor
            seen.setdefault("nodes", dict(pool.nodes()))
            if "killed" not in seen:
                busy = [s for s in pool.states() if s.job is not None and s.job.candidate.id == proposer.slow
                        and pool.nodes()[s.name] == second_id
                        and not s.stage.startswith((s.job.node_id + ":", "static checks", "compile"))]
                if busy:
                    seen["killed"] = busy[0].job.candidate.id
                    cluster.remove_node(second, allow_graceful=False)  # its raylet and its workers, SIGKILL
            elif c.evaluations >= 3 and pool.busy() and pool.workers() == 1 and "stopped" not in seen:
                seen["stopped"] = dict(c.tree.in_flight)
                raise KeyboardInterrupt  # the controller stopped with evaluations in flight

        def first_propose(*a, _orig=proposer.propose):
            if proposer.n is None:  # the first two kernels go to w1 then w2: slow the one bound for the 2nd node
                nodes = c._executor.nodes()
                proposer.n = 1 + sorted(nodes).index(next(w for w, n in nodes.items() if n == second_id))
            return _orig(*a)

        proposer.propose = first_propose
        c.on_tick = kill_the_second_node_then_stop
        with pytest.raises(KeyboardInterrupt):
            try:
                c.run()
            finally:
                c.close()
        first_s = time.monotonic() - t0
        assert sorted(seen["nodes"].values()) == sorted([head_id, second_id])  # a worker on each node
        assert seen.get("killed") == proposer.slow, "the second node's worker never judged the slow kernel"
        assert [(f["candidate_id"], f["outcome"]) for f in c.store.faults()] == [(proposer.slow, "requeued")]
        lost = next(float(ln.split()[0]) for ln in lines if "lost; starting a new Ray actor" in ln)
        gave_up = next(float(ln.split()[0]) for ln in lines
                       if "was not placed (no node has the CPUs" in ln and "going on with 1 worker" in ln)
        assert gave_up - lost < 30  # the replacement was given up after REPLACE_S, not HOST_START_S (120 s)
        done, in_flight = c.evaluations, dict(c.tree.in_flight)
        assert 3 <= done < BUDGET and in_flight == seen["stopped"]
        c.store.close()

        # resume on the surviving node, one worker
        resumed = cfg.model_copy(update={"workers": 1})
        store = Store(tmp_path / "run.sqlite")
        c2 = Controller(store, c.task, judge, PatternsProposer(c.task, "cpu", None), resumed,
                        make_executor=lambda naive: make_executor(resumed, judge, naive))
        c2.start()
        try:
            c2.run()
            nodes_after = c2._executor.nodes()
        finally:
            c2.close()
            judge.close()
        assert set(nodes_after.values()) == {head_id}
        ids = [e.candidate_id for _, _, e in store.evaluations()]
        assert len(ids) == len(set(ids)) == BUDGET  # every kernel judged once, none lost
        assert set(in_flight.values()) <= set(ids)  # what was in flight at the stop was judged after the resume
        assert store.evaluation_of(proposer.slow).status is Status.PASSED  # the killed node's kernel, judged again
        assert [f["outcome"] for f in store.faults()] == ["requeued"]
        assert not c2.tree.in_flight
        print(f"two nodes: {first_s:.1f} s to the stop ({done} evaluations), {time.monotonic() - t0:.1f} s in all")
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
