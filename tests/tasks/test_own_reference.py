"""A task's own torch reference timed as its baseline (ksearch/tasks/own_reference.py): an outside task gets the
``reference`` baseline, the final stage times it beside the best kernel, and the final table shows ``vs reference``
(the speedup KernelBench and flashinfer-bench report)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="KernelBench problems are PyTorch modules: pip install torch==2.13.0")

from ksearch.eval.baselines import time_baseline  # noqa: E402
from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.eval.timing import Reference  # noqa: E402
from ksearch.hardware.spec import HardwareSpec  # noqa: E402
from ksearch.protocol import TimingPlan  # noqa: E402
from ksearch.records import Candidate, FinalMeasurements, FinalReport, Status  # noqa: E402
from ksearch.report.summary import summary_table  # noqa: E402
from ksearch.run.session import reference_timings  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402
from ksearch.tasks.flops import SOURCE  # noqa: E402
from ksearch.tasks.importers import write_task_dir  # noqa: E402
from ksearch.tasks.own_reference import REFERENCE_BASELINE  # noqa: E402
from tests.tasks.test_kernelbench_import import PROBLEMS  # noqa: E402

GEMM = Path(__file__).resolve().parents[1] / "fixtures" / "kernelbench" / "level1" / \
    "2_Standard_matrix_multiplication_.py"
SMALL = f"{GEMM}:M=8,K=16,N=12"
QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=0.2, flush_bytes=0,
                   max_rounds=4)
SPEC = HardwareSpec(name="test-cpu", kind="cpu", cores=2, threads=2, simd_width=8, memory_bandwidth_gbs=20.0,
                    peak_flops={"float32": 1e11}, exp_rate_per_s=1e9, source="hand-made for tests")
NAIVE = PROBLEMS["level1/2_Standard_matrix_multiplication_.py"][1]  # the same naive GEMM the import tests judge


def test_an_outside_torch_task_gets_its_reference_as_a_baseline_and_built_ins_do_not():
    task = load_task(SMALL)
    assert list(task.baseline_sources) == [REFERENCE_BASELINE] and not task.definition.baselines
    assert "numpy-token-loop" in load_task("selective-scan").baseline_sources  # a NumPy reference: its own
    assert REFERENCE_BASELINE not in load_task("selective-scan").baseline_sources


def test_an_imported_folder_does_not_copy_the_generated_baseline_and_gets_it_back(tmp_path):
    folder = write_task_dir(load_task(SMALL), tmp_path / "gemm")
    assert sorted(p.name for p in folder.iterdir()) == ["definition.json", "workloads.jsonl"]
    assert list(load_task(folder).baseline_sources) == [REFERENCE_BASELINE]


def test_the_reference_baseline_passes_its_check_and_is_timed_on_the_cpu():
    task = load_task(SMALL)
    r = time_baseline(task, REFERENCE_BASELINE, task.workloads[0].label, seed=3, target="cpu", plan=QUICK)
    assert r.status is Status.PASSED and r.checks == 1 and r.max_abs_err == 0.0
    assert r.median_ms is not None and r.median_ms > 0 and r.repeats >= 3


def test_the_final_table_has_a_vs_reference_column_with_a_finite_ratio_and_says_where_the_floor_comes_from():
    """The final stage's steps (session._final_measurements) on the cpu target: naive, best beside it, the task's
    baselines by `reference_timings`, then the report and its table."""
    task = load_task(SMALL)
    task.naive_sources["cpu"] = NAIVE
    best_src = NAIVE.replace("float acc = 0.0f;", "float acc = 0.0f; /* best */")
    ev = Evaluator(task, "cpu", SPEC, EvalConfig(seeds=[11], timeout_s=20.0, timing=QUICK, busy_wait_s=0.0))
    try:
        names = [w.label for w in task.workloads]
        naive = ev.measure_naive(task.workloads)
        best = ev.evaluate(Candidate(target="cpu", sources={"kernel.c": best_src}), names, timing=True,
                           references=[Reference("naive", ev.naive_candidate())])
        ref_name, reference, notes = reference_timings(task, names, 11, lambda m: None, "cpu", cases=ev, plan=QUICK)
    finally:
        ev.close()
    assert naive.status is Status.PASSED and best.status is Status.PASSED, (naive.message, best.message)
    assert ref_name == REFERENCE_BASELINE and notes == []
    final = FinalMeasurements(best_candidate_id=best.candidate_id, naive=naive, best=best, reference=reference,
                              reference_name=ref_name)
    report = FinalReport.build({"id": "r1", "task": task.name, "target": "cpu", "status": "finished"}, 1, "n1",
                               final)
    row = report.workloads[0]
    assert row.reference_ms > 0 and math.isfinite(row.speedup_vs_reference) and row.speedup_vs_reference > 0
    assert row.floor_source == SOURCE and row.bound in ("memory", "compute")
    table = summary_table(report)
    assert [c.header for c in table.columns][3:6] == ["reference ms", "vs naive (paired, 99.9%)", "vs reference"]
    assert table.caption.startswith(f"floor from: {SOURCE}")
