"""Paired decisions on a busy machine (issue 18): busy loops on every core, started by the test and not ours (the
load meter counts them as other processes'), and the judge timing anyway (no waiting: busy_wait_s=0).

- an unchanged kernel, re-submitted 10 times with a comment added, is never judged faster or slower than the
  kernel it is a copy of: every verdict is a tie, and every interval holds 1 (the judge's intervals are at 99.9%,
  so a sound judge fails this about 1% of the time; a judge whose intervals ignore the load and call 30% of equal
  kernels different fails it with probability 1 - 0.7^10 = 97%, one at 20% with 89%: 20 re-submissions, 42 s of
  the suite, bought 99.9% and 99% against the same judges);
- a kernel 1.3x faster than its reference (the reference does a third of its channels twice) is never judged
  slower, and is found faster in most of 10 trials at the test's own load; where the machine was busier than its
  CPU count before, in all but one of the trials whose intervals came out narrow enough to decide the gap (the
  test asks for the judge's guarantee, no wrong direction, and for power, not for a quiet machine).

Both through the judge and the search's own record of the verdicts (`summarize`, `attach`, `update_state`)."""

from __future__ import annotations

import os
import shutil

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.eval.timing import Reference
from ksearch.run.controller import summarize
from ksearch.search.strategy import SearchState, update_state
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, NodeStatus, Tree, attach
from ksearch.search.edits import Insert, apply
from ksearch.tasks import load_task

from ..hardware.loadgen import detached_loops

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")]

TASK = load_task("selective-scan")
WORKLOAD = "small-b2"  # 64 channels: 21 of them done twice by SLOW, 1.33x the work
PLAN = TimingPlan(warmup=1, flush_bytes=1 << 20, max_time_s=2.0)
LOOP = "for (int64_t d = 0; d < dim; d++) {"
SLOW_LOOP = "for (int64_t d = 0; d < dim; d++) for (int rep = 0; rep < (d % 10 < 3 ? 2 : 1); rep++) {"


def _kernel(source: str, note: str = "") -> Candidate:
    return Candidate(target="cpu", sources={"kernel.c": source + (f"\n/* {note} */\n" if note else "")})


@pytest.fixture(scope="module")
def judge():
    ev = Evaluator(TASK, config=EvalConfig(seeds=[1], timing=PLAN, busy_wait_s=0.0))
    yield ev
    ev.close()


def _tree_with_child(root_candidate: str) -> Tree:
    root = attach(Tree.new(), ROOT_ID, root_candidate, EvalSummary(status="PASSED", score=1.0))
    tree, results = apply(root, [Insert(parent_id=ROOT_ID, id="n1", action=Action(title="copy the kernel"))])
    assert results[0].ok, results[0].reason
    return tree


def _judged(judge, candidate, reference):
    ev = judge.evaluate(candidate, [WORKLOAD], references=[Reference("parent", reference), Reference("best", reference)])
    assert ev.status is Status.PASSED, ev.message
    assert ev.workloads[0].load_cores is not None
    return ev


def test_an_unchanged_kernel_resubmitted_10_times_under_load_is_always_a_tie(judge):
    naive = _kernel(TASK.naive_sources["cpu"])
    with detached_loops():
        evs = [_judged(judge, _kernel(TASK.naive_sources["cpu"], f"copy {i}"), naive) for i in range(10)]
    busy = [ev.workloads[0].load_cores for ev in evs]
    assert sum(b > 0.5 for b in busy) >= 8, busy  # the machine really was busy while timing
    for ev in evs:
        p = ev.paired_with("parent")
        assert p is not None and p.verdict == "tie" and p.lo <= 1.0 <= p.hi, (p, ev.workloads[0].repeats)
        summary = summarize(ev)
        tree = attach(_tree_with_child(naive.id), "n1", ev.candidate_id, summary)
        assert tree["n1"].status is NodeStatus.SOLVED  # never recorded as a regression
        state = update_state(SearchState(best_score=1.0, best_node_id=ROOT_ID), tree, "n1", summary)
        assert state.best_node_id == ROOT_ID  # never recorded as an improvement


@pytest.fixture(scope="module")
def patient_judge():
    """The judge with up to 60 rounds and 6 s a workload, not 25 and 2: a decided comparison stops early (a quiet
    machine decides a 1.3x gap in well under 2 s); an undecided one on a machine busier than the test's own load
    gets the rounds that narrow its interval (beside another test process, 2 s left 8 of 10 ties)."""
    plan = PLAN.model_copy(update={"max_time_s": 6.0, "max_rounds": 60})
    ev = Evaluator(TASK, config=EvalConfig(seeds=[1], timing=plan, busy_wait_s=0.0))
    yield ev
    ev.close()


#: an interval no wider than this (hi / lo) that holds a ratio of 1.2 or more lies above 1: narrow enough to tell
#: the 1.33x gap (less what a busy machine takes off it)
DECIDES = 1.2


def test_a_kernel_1_3x_faster_is_never_judged_slower_and_mostly_faster_under_load(patient_judge):
    """Whatever the load: never judged slower, every tie's interval holds 1, every interval reaches 1.1. At the
    test's own load, at least 6 of 10 found faster and the point ratios centre on 1.33x; on a machine already
    busier than its CPU count (a load average of 9-12 on 2 cores left intervals such as [0.87, 2.85], and once ten
    point ratios of 0.64-1.02 whose intervals all held 1.33: nothing there can decide a 1.33x gap, nor is a point
    ratio there an estimate of it), only the comparisons whose intervals are narrow enough to decide the gap
    (`DECIDES`) are asked to: all of them but one faster; with none that narrow, the power is not checked (the
    guarantees above still are)."""
    slow = _kernel(TASK.naive_sources["cpu"].replace(LOOP, SLOW_LOOP))
    assert slow.sources["kernel.c"] != TASK.naive_sources["cpu"]
    # the power asked for is at the test's own load (a loop on every core); a machine already busier than its CPU
    # count before those loops start (a parallel test run, a shared host) gets fewer decided rounds (at a load
    # average of 7-10 on 2 cores, 2-3 of 10 were decided faster; at 9-12, 1)
    busy_before = os.getloadavg()[0] >= (os.cpu_count() or 1)
    with detached_loops():
        evs = [_judged(patient_judge, _kernel(TASK.naive_sources["cpu"], f"fast {i}"), slow) for i in range(10)]
    pairs = [ev.paired_with("parent") for ev in evs]
    seen = [(p.verdict, round(p.ratio, 3), p.lo, p.hi, ev.workloads[0].load_cores) for p, ev in zip(pairs, evs)]
    wrong = [(s, ev.workloads[0].repeats, p.n, p.note) for s, p, ev in zip(seen, pairs, evs)
             if p.verdict not in ("faster", "tie")]
    assert not wrong, (wrong, seen)  # never the wrong direction (nor no verdict): the offending comparisons first
    # every interval reaches the gap: none excludes a ratio of 1.1, the least the point estimates centre on
    short = [(s, p.n) for s, p in zip(seen, pairs) if p.hi is None or p.hi < 1.1]
    assert not short, (short, seen)
    if not busy_before:
        assert sum(p.verdict == "faster" for p in pairs) >= 6, (busy_before, seen)
        ratios = sorted(p.ratio for p in pairs)
        assert 1.1 < (ratios[4] + ratios[5]) / 2 < 1.6, seen  # the point estimates centre on the true 1.33x
    else:
        # the power asked for on a machine busier than its CPU count: of the comparisons whose intervals came out
        # narrow enough to tell the gap, all but one decided it (the width says how noisy the rounds were, not
        # which way they leaned: choosing by it favours no verdict)
        decidable = [p for p in pairs if p.lo is not None and p.hi is not None and p.hi / p.lo <= DECIDES]
        assert sum(p.verdict == "faster" for p in decidable) >= len(decidable) - 1, (busy_before, seen)
    for p, ev in zip(pairs, evs):
        summary = summarize(ev)
        assert summary.vs_parent == p.verdict and summary.vs_best in ("faster", "tie")
        if p.verdict == "tie":
            assert p.lo <= 1.0 <= p.hi, seen
