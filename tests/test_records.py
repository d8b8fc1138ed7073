"""Tests for ksearch.records' final-stage records: FinalMeasurements and FinalReport (built, validated, serialized
as `ksearch run --json` prints it, and loaded back equal)."""

import json

import pytest
from pydantic import ValidationError

from ksearch.records import (Evaluation, FinalMeasurements, FinalReport, HiddenWorkloads, Paired, Status,
                             WorkloadResult)

RUN = {"id": "r1", "task": "t", "target": "cpu", "status": "finished", "config": {}}

#: the keys of `ksearch run --json`, in order (users and tests parse them)
TOP_KEYS = ["run_id", "task", "target", "status", "evaluations", "best_candidate_id", "best_node_id", "best_source",
            "best_candidate", "reproduce", "reference_baseline", "workloads"]
ROW_KEYS = ["name", "naive_ms", "best_ms", "reference_ms", "speedup_vs_naive", "speedup_vs_naive_interval",
            "best_spread", "load_cores", "speedup_vs_reference", "pct_of_floor", "naive_pct_of_floor", "floor_ms",
            "bound", "floor_source"]


def _final(best: bool = True, hidden: bool = True, notes: tuple[str, ...] = ()) -> FinalMeasurements:
    naive = Evaluation(candidate_id="n", task="t", target="cpu", status=Status.PASSED, workloads=[
        WorkloadResult(workload="a", status=Status.PASSED, median_ms=4.0, pct_of_floor=10.0, floor_ms=0.4,
                       bound="memory"),
        WorkloadResult(workload="b", status=Status.PASSED, median_ms=2.0),
        WorkloadResult(workload="untimed", status=Status.PASSED)])
    b = Evaluation(candidate_id="c", task="t", target="cpu", status=Status.PASSED, workloads=[
        WorkloadResult(workload="a", status=Status.PASSED, median_ms=1.0, spread=0.05, load_cores=0.2,
                       pct_of_floor=40.0, paired=[Paired(role="naive", candidate_id="n", ratio=3.9, lo=3.5, hi=4.2)]),
        WorkloadResult(workload="b", status=Status.PASSED, median_ms=0.5)]) if best else None
    h = HiddenWorkloads(axes=[{"L": 17}], evaluation=Evaluation(candidate_id="c", task="t", target="cpu",
                                                                status=Status.PASSED)) if best and hidden else None
    return FinalMeasurements(best_candidate_id="c" if best else None, naive=naive, best=b, hidden=h,
                             reference={"a": WorkloadResult(workload="a", status=Status.PASSED, median_ms=8.0)},
                             reference_name="numpy-token-loop", reference_notes=list(notes))


def test_the_report_rows_and_its_json_keys():
    r = FinalReport.build(RUN, 5, "n3", _final(notes=("baseline x skipped: no torch",)), "/runs/r1/best/k.c")
    a, b = r.workloads  # the workload the naive kernel was not timed on has no row
    assert a.speedup_vs_naive == 3.9 and a.speedup_vs_naive_interval == (3.5, 4.2)  # paired, not 4.0 / 1.0
    assert a.speedup_vs_reference == 8.0 and a.reference_ms == 8.0 and a.floor_ms == 0.4
    assert b.speedup_vs_naive == 4.0 and b.speedup_vs_naive_interval is None and b.speedup_vs_reference is None
    out = r.model_dump(mode="json")
    assert list(out) == TOP_KEYS + ["best_status", "best_message", "reference_notes", "hidden_workloads"]
    assert [list(w) for w in out["workloads"]] == [ROW_KEYS, ROW_KEYS]
    assert out["best_status"] == "PASSED" and out["best_message"] == ""
    assert out["workloads"][0]["speedup_vs_naive_interval"] == [3.5, 4.2]
    assert out["hidden_workloads"] == {"status": "PASSED", "message": "", "axes": [{"L": 17}]}
    assert out["reference_notes"] == ["baseline x skipped: no torch"]


def test_absent_parts_are_left_out_of_the_json_as_the_summary_always_did():
    r = FinalReport.build(RUN, 0, None, _final(best=False))
    out = r.model_dump(mode="json")
    assert list(out) == TOP_KEYS  # no best_status / best_message, no empty reference_notes, no hidden_workloads
    assert out["best_candidate_id"] is None and out["workloads"][0]["best_ms"] is None
    assert list(FinalReport.build(RUN, 5, "n3", _final(hidden=False)).model_dump(mode="json")) == \
        TOP_KEYS + ["best_status", "best_message"]


@pytest.mark.parametrize("best, hidden", [(True, True), (True, False), (False, False)])
def test_the_report_loads_back_equal(best, hidden):
    r = FinalReport.build(RUN, 5, "n3" if best else None, _final(best, hidden), "/k.c" if best else None)
    assert FinalReport.model_validate_json(r.model_dump_json()) == r
    assert FinalReport.model_validate(json.loads(json.dumps(r.model_dump(mode="json")))) == r


def test_the_measurements_load_back_equal_and_from_before_hidden_workloads_and_notes():
    f = _final()
    assert FinalMeasurements.model_validate(json.loads(f.model_dump_json())) == f
    old = f.model_dump(mode="json")
    del old["hidden"], old["reference_notes"]  # the `final` baseline of runs made before either existed
    loaded = FinalMeasurements.model_validate(old)
    assert loaded.hidden is None and loaded.reference_notes == []


def test_inconsistent_records_are_refused():
    f = _final()
    with pytest.raises(ValidationError, match="best_candidate_id"):
        FinalMeasurements.model_validate({**f.model_dump(), "best_candidate_id": None})
    with pytest.raises(ValidationError, match="not best_candidate_id"):
        FinalMeasurements.model_validate({**f.model_dump(), "best_candidate_id": "other"})
    r = FinalReport.build(RUN, 5, "n3", f).model_dump(mode="json")
    with pytest.raises(ValidationError, match="go together"):
        FinalReport.model_validate({**r, "best_message": None})
    del r["best_status"], r["best_message"]
    with pytest.raises(ValidationError, match="hidden_workloads without"):
        FinalReport.model_validate(r)
    with pytest.raises(ValidationError, match="greater than or equal"):
        FinalReport.model_validate({**r, "evaluations": -1, "hidden_workloads": None})
