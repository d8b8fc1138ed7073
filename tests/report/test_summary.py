"""Tests for ksearch.report.summary: the run summary and what it says of the best kernel's final checks."""

from ksearch.records import Evaluation, Status, WorkloadResult
from ksearch.report.summary import final_summary, verdict_lines

RUN = {"id": "r1", "task": "t", "target": "cpu", "status": "finished"}


def _ev(status: Status, ms: float | None, message: str = "") -> Evaluation:
    return Evaluation(candidate_id="c", task="t", target="cpu", status=status, message=message,
                      workloads=[WorkloadResult(workload="w", status=status, median_ms=ms)])


def _hidden(status: str, message: str = "") -> dict:
    return {"axes": [{"n": 3}, {"n": 7}], "evaluation": {"status": status, "message": message}}


def test_summary_rows_and_speedups():
    s = final_summary(RUN, 5, "n1", "c", _ev(Status.PASSED, 4.0), _ev(Status.PASSED, 1.0),
                      {"w": {"median_ms": 8.0}}, "numpy", "/k.c")
    (row,) = s["workloads"]
    assert row["speedup_vs_naive"] == 4.0 and row["speedup_vs_reference"] == 8.0
    assert s["best_status"] == "PASSED" and "hidden_workloads" not in s


def test_a_best_kernel_that_fails_a_hidden_workload_is_said_so():
    best = _ev(Status.INCORRECT_NUMERICAL, 1.0, "hidden workload hidden-1: 3 of 21 elements outside")
    s = final_summary(RUN, 5, "n1", "c", _ev(Status.PASSED, 4.0), best, {}, "numpy", "/k.c",
                      _hidden("INCORRECT_NUMERICAL", "hidden-1: 3 of 21 elements outside"))
    assert s["hidden_workloads"]["status"] == "INCORRECT_NUMERICAL" and s["hidden_workloads"]["axes"][1] == {"n": 7}
    (line,) = verdict_lines(s)
    assert "FAILED its final check (INCORRECT_NUMERICAL)" in line and "hidden-1" in line


def test_hidden_workloads_passed_or_skipped_are_reported():
    s = final_summary(RUN, 5, "n1", "c", _ev(Status.PASSED, 4.0), _ev(Status.PASSED, 1.0), {}, "numpy", "/k.c",
                      _hidden("PASSED"))
    assert verdict_lines(s) == ["the best kernel also passed 2 hidden workloads (sizes drawn with a secret seed): "
                                "n=3; n=7"]
    s = final_summary(RUN, 5, "n1", "c", _ev(Status.PASSED, 4.0), _ev(Status.PASSED, 1.0), {}, "numpy", "/k.c",
                      {"axes": [], "evaluation": {"status": "SKIPPED", "message": "no valid hidden workload"}})
    assert verdict_lines(s) == ["hidden workloads: SKIPPED: no valid hidden workload"]
    assert verdict_lines(final_summary(RUN, 0, None, None, _ev(Status.PASSED, 4.0), None, {}, "numpy", None)) == []


def test_baseline_notes_reach_the_summary_and_its_lines():
    s = final_summary(RUN, 5, "n1", "c", _ev(Status.PASSED, 4.0), _ev(Status.PASSED, 1.0), {}, "reference", "/k.c",
                      reference_notes=["baseline torch-sdpa skipped: torch is not installed (pip install torch)"])
    assert s["reference_notes"] == ["baseline torch-sdpa skipped: torch is not installed (pip install torch)"]
    assert any("torch is not installed" in line for line in verdict_lines(s))
