"""Profiles of passing candidates (eval/profiling.py, EvalConfig.profile): the cpu target's vectorizer report end to
end, a profiler run through the judge's worker (a stand-in profiler program that starts the worker as ncu does and
writes the report ncu wrote on the H200), and every failure of the tool a Profile error with the verdict unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ksearch.eval import profiling
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.eval.profiling import profiled_workload
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Evaluation, Profile, Status
from ksearch.store.db import Store
from ksearch.targets.cuda_profile import NcuProfiler, parse_ncu_csv
from ksearch.tasks import load_task
from tests.eval.kernels import VECTOR_SPLIT, WRONG

QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=3, max_time_s=0.5)
SAMPLE = Path(__file__).parents[1] / "targets" / "data" / "ncu-raw-h200-warp-chunks.csv"

#: a profiler program as ncu behaves: runs the command after its arguments (the worker), then writes its report
FAKE = """import subprocess, sys, time
report, sample, mode, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rc = subprocess.call(argv)
if mode == "hang":
    time.sleep(600)
if mode != "silent":
    open(report, "w").write(open(sample).read())
sys.exit(rc)
"""


class StandIn:
    """A RunProfiler whose program is `FAKE`; ``mode``: ok | hang | silent (writes no report)."""

    tool = "stand-in 1.0"

    def __init__(self, program: Path, mode: str = "ok"):
        self.program, self.mode = program, mode

    def available(self):
        return None

    def command(self, candidate, definition, report):
        return [sys.executable, str(self.program), str(report), str(SAMPLE), self.mode]

    def read(self, report, candidate, workload):
        return NcuProfiler("ncu").read(report, candidate, workload) if report.is_file() else \
            [Profile(tool=self.tool, workload=workload, error="no report")]


@pytest.fixture(scope="module")
def judge():
    ev = Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[5], timing=QUICK, profile=True, busy_wait_s=0,
                                                                  profile_timeout_s=20))
    yield ev
    ev.close()


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "fake_profiler.py"
    path.write_text(FAKE)
    return path


SPLIT = Candidate(target="cpu", sources={"kernel.c": VECTOR_SPLIT})


def test_a_passing_cpu_candidate_carries_its_vectorizer_report(judge):
    ev = judge.evaluate(SPLIT, ["tiny", "small-b2"])
    assert ev.status is Status.PASSED, ev.message
    (report,) = ev.profiles  # the cpu target has no profiler: the compiler's report alone
    assert report.workload is None and not report.error
    assert report.metrics["loops_vectorized"] >= 1 and report.metrics["loops_not_vectorized"] >= 1
    assert any("loop vectorized" in n for n in report.notes) and any("not vectorized" in n for n in report.notes)
    again = Evaluation.model_validate_json(ev.model_dump_json())
    assert again.profiles == ev.profiles


def test_profiles_only_when_asked_timed_and_passed(judge):
    quiet = Evaluator(judge.task, config=EvalConfig(seeds=[5], timing=QUICK, busy_wait_s=0))
    try:
        assert quiet.evaluate(SPLIT, ["tiny"]).profiles == []
    finally:
        quiet.close()
    assert judge.evaluate(SPLIT, ["tiny"], timing=False).profiles == []  # hidden workloads: checks only
    failed = judge.evaluate(Candidate(target="cpu", sources={"kernel.c": WRONG}), ["tiny"])
    assert failed.status is Status.INCORRECT_NUMERICAL and failed.profiles == []


def test_a_profiler_runs_the_judges_worker_once_and_its_report_is_read(judge, program, monkeypatch):
    monkeypatch.setattr(judge.target, "profiler", lambda: StandIn(program), raising=False)
    ev = judge.evaluate(SPLIT, ["tiny", "small-b2"])
    assert ev.status is Status.PASSED, ev.message
    compiler, *run = ev.profiles
    assert compiler.workload is None and run and all(p.workload == "small-b2" for p in run)  # the largest bench one
    assert all(not p.error for p in run), run
    assert run[0].metrics["registers_per_thread"] > 0 and run[0].notes[0].startswith("kernel ")


#: the profiler's time limits tried in turn: a stand-in stopped before its call ended (on a 2-core machine at a
#: load of 9-12, starting python, the worker and the kernel took over 3 s) tells nothing of how it ends
PROFILE_TIMEOUTS_S = (3.0, 6.0, 12.0, 24.0)


@pytest.mark.parametrize("mode, error", [("hang", "did not finish within {t:g} s (stopped after the call"),
                                         ("silent", "no report")])
def test_a_profiler_that_hangs_or_writes_nothing_is_an_error_not_a_verdict(judge, program, monkeypatch, mode, error):
    """A stand-in that hangs after the call is stopped at the time limit, after the call; one that writes no report
    says so. Each is run with 3 s, and again with twice as long (up to 24 s) while it was stopped otherwise than
    asked (before its call ended, or the silent one at all: a busy machine): the error asked for is that of the
    first run not stopped so, or of the 24 s run."""
    monkeypatch.setattr(judge.target, "profiler", lambda: StandIn(program, mode), raising=False)
    seen = []
    for t in PROFILE_TIMEOUTS_S:
        monkeypatch.setattr(judge.config, "profile_timeout_s", t)
        ev = judge.evaluate(SPLIT, ["tiny"])
        assert ev.status is Status.PASSED and ev.workloads[0].median_ms is not None
        seen.append(ev.profiles[-1].error)
        if "did not finish within" not in (seen[-1] or "") or error.format(t=t) in seen[-1]:
            break
    assert error.format(t=t) in seen[-1] and ev.profiles[-1].workload == "tiny", seen


def test_a_missing_tool_or_a_broken_report_is_an_error_not_a_verdict(judge, monkeypatch):
    monkeypatch.setattr(judge.target, "profiler", lambda: NcuProfiler(None), raising=False)

    def broken(*args):
        raise RuntimeError("the compiler's report broke")

    monkeypatch.setattr(judge.target, "compile_report", broken, raising=False)
    ev = judge.evaluate(SPLIT, ["tiny"])
    assert ev.status is Status.PASSED
    assert [p.error for p in ev.profiles] == [
        "RuntimeError: the compiler's report broke",
        "Nsight Compute (ncu) is not installed here (not on PATH, nor in /usr/local/cuda/bin): no profile"]


def test_the_profiled_workload_is_the_largest_bench_one():
    task = load_task("selective-scan-fp16")
    assert profiled_workload(task.definition, task.workloads).label == "mamba370m-L4096"
    checks = [w for w in task.workloads if w.purpose == "check"]
    assert profiled_workload(task.definition, checks).label == "long-seq"


def test_profiles_survive_the_store_and_old_evaluations_load_without_them(tmp_path):
    ev = Evaluation(candidate_id="c1", task="t", target="cpu", status=Status.PASSED,
                    profiles=[Profile(tool="gcc", metrics={"loops_vectorized": 2.0}, notes=["k.c:1:1: loop vectorized"]),
                              Profile(tool="ncu 2025.3.1", workload="w", error="timed out")])
    store = Store(tmp_path / "r.sqlite", create=True)
    cand = Candidate(target="cpu", sources={"kernel.c": "void run(void) {}"})
    store.record_step(cand, ev.model_copy(update={"candidate_id": cand.id}), 1.0, "{}", "{}", None)
    assert store.evaluation_of(cand.id).profiles == ev.profiles
    old = ev.model_dump(mode="json")
    del old["profiles"]
    assert Evaluation.model_validate(old).profiles == []


def test_profiles_module_names_its_worker_program():
    assert profiling.PROFILED_WORKER_MODULE == "ksearch.eval.profiled_worker"
    assert parse_ncu_csv("==ERROR== the profiler failed\n", "ncu", "w")[0].error == "ncu: the profiler failed"
