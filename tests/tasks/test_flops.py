"""The cost model of a task without one (ksearch/tasks/flops.py, Definition.cost_of): FLOPs counted on a torch
reference by torch's FlopCounterMode, bytes from the shapes, and the source of the figures said where the floor is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch", reason="the FLOP counter is PyTorch's: pip install torch==2.13.0")

from ksearch.cli import app  # noqa: E402
from ksearch.hardware.roofline import roofline  # noqa: E402
from ksearch.hardware.spec import HardwareSpec  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402
from ksearch.tasks.definition import COST_ANNOTATION, COST_BYTES_ONLY, CostModel, Definition, Workload  # noqa: E402
from ksearch.tasks.flops import SOURCE, count_flops  # noqa: E402
from ksearch.tasks.importers import write_task_dir  # noqa: E402

GEMM = Path(__file__).resolve().parents[1] / "fixtures" / "kernelbench" / "level1" / \
    "2_Standard_matrix_multiplication_.py"
#: a hand-made CPU spec: 20 GB/s, 100 GFLOP/s FP32
SPEC = HardwareSpec(name="test-cpu", kind="cpu", cores=2, threads=2, simd_width=8, memory_bandwidth_gbs=20.0,
                    peak_flops={"float32": 1e11}, exp_rate_per_s=1e9, source="hand-made for tests")


def _definition(reference: str, backend: str = "torch", cost: dict | None = None, dtype: str = "float32"):
    return Definition.model_validate({
        "name": "mm", "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 6}, "K": {"type": "var"}},
        "inputs": {"a": {"shape": ["M", "K"], "dtype": dtype}, "b": {"shape": ["K", "N"], "dtype": dtype}},
        "outputs": {"c": {"shape": ["M", "N"], "dtype": dtype}}, "reference": reference,
        "reference_backend": backend, **({"cost": cost} if cost else {})})


MM = "import torch\ndef run(a, b):\n    return a @ b\n"


def test_a_kernelbench_gemm_counts_2mnk_flops_at_its_own_sizes_and_its_floor_is_compute_bound():
    """The full-size problem (M 2048, K 8192, N 4096) is counted on meta tensors: no memory, no arithmetic."""
    task = load_task(GEMM)
    wl = task.workloads[0]
    ax = task.definition.axis_values(wl)
    cost = task.definition.cost_of(wl)
    assert cost.flops == 2 * ax["M"] * ax["N"] * ax["K"] and cost.source == SOURCE
    assert cost.bytes == 4 * (ax["M"] * ax["K"] + ax["K"] * ax["N"] + ax["M"] * ax["N"])
    assert count_flops(task.definition, wl).how == "meta"
    roof = roofline(cost.bytes, cost.flops, cost.transcendentals, SPEC, dtype=cost.flops_on)
    assert roof.bound == "compute" and roof.floor_s == pytest.approx(cost.flops / 1e11)


def test_float16_inputs_count_on_the_matrix_units_and_float32_on_tf32():
    """The fastest rate a correct kernel could reach: the floor stays a lower bound on the time."""
    wl = Workload(axes={"M": 4, "K": 5})
    assert _definition(MM).cost_of(wl).flops_on == "tensor_tf32"
    half = _definition(MM, dtype="float16").cost_of(wl)
    assert half.flops_on == "tensor_float16" and half.flops == 2 * 4 * 5 * 6


def test_a_reference_that_reads_its_data_is_counted_on_real_inputs():
    ref = "import torch\ndef run(a, b):\n    n = int(a.shape[0] if a.sum().item() == a.sum().item() else 0)\n" \
          "    return a[:n] @ b\n"
    d = _definition(ref)
    wl = Workload(axes={"M": 3, "K": 2})
    got = count_flops(d, wl)
    assert got.how == "real" and got.flops == 2 * 3 * 2 * 6 and d.cost_of(wl).source == SOURCE


def test_the_task_s_own_cost_model_wins_and_numpy_or_failing_references_count_bytes_only():
    wl = Workload(axes={"M": 4, "K": 5})
    annotated = _definition(MM, cost={"flops": "3 * M"}).cost_of(wl)
    assert annotated.flops == 12 and annotated.source == COST_ANNOTATION
    numpy = _definition("def run(a, b):\n    return a @ b\n", backend="numpy").cost_of(wl)
    assert numpy.flops == 0 and numpy.source == COST_BYTES_ONLY and numpy.bytes == 4 * (20 + 30 + 24)
    broken = _definition("def run(a, b):\n    raise RuntimeError('no')\n").cost_of(wl)
    assert broken.flops == 0 and broken.source.startswith(COST_BYTES_ONLY) and "RuntimeError: no" in broken.source


def test_an_imported_task_folder_still_has_no_cost_model_and_is_counted(tmp_path):
    """`ksearch tasks import` writes the empty cost model out whole; loaded back it still says nothing."""
    task = load_task(f"{GEMM}:M=8,K=16,N=12")
    folder = write_task_dir(task, tmp_path / "gemm")
    assert json.loads((folder / "definition.json").read_text())["cost"]["flops"] == "0"
    back = load_task(folder)
    assert back.definition.cost.is_empty and back.definition.cost_of(back.workloads[0]).flops == 2 * 8 * 16 * 12
    assert not CostModel(flops="2 * M").is_empty


def test_tasks_show_says_where_the_cost_model_comes_from():
    r = CliRunner().invoke(app, ["tasks", "show", f"{GEMM}:M=8,K=16,N=12"])
    assert r.exit_code == 0, r.output
    assert "cost model: flops: torch FlopCounterMode" in " ".join(r.output.split())


FIB = Path(__file__).resolve().parents[1] / "fixtures" / "flashinfer_trace" / "definitions"


def test_flashinfer_bench_gemm_and_paged_decode_are_counted_the_decode_on_its_drawn_indices():
    """The GEMM on meta tensors; GQA paged decode reads kv_indptr, so it is counted on real inputs: per batch row,
    q . K^T and p . V over that row's pages, 2 * 2 * heads * pages * head_dim."""
    gemm = load_task(FIB / "gemm" / "gemm_n4096_k4096.json")
    wl = gemm.workloads[0]
    ax = gemm.definition.axis_values(wl)
    assert gemm.definition.cost_of(wl).flops == 2 * ax["M"] * ax["N"] * ax["K"]
    assert count_flops(gemm.definition, wl).how == "meta" and gemm.definition.cost_of(wl).flops_on == "tensor_float16"
    gqa = load_task(FIB / "gqa_paged" / "gqa_paged_decode_h32_kv8_d128_ps1.json")
    wl = min(gqa.workloads, key=gqa.definition.bytes_of)
    ax = gqa.definition.axis_values(wl)
    got = count_flops(gqa.definition, wl)
    assert got.how == "real" and got.flops == 2 * 2 * ax["num_qo_heads"] * ax["num_kv_indices"] * ax["head_dim"]


def test_a_hanging_or_exiting_reference_gives_bytes_only_with_the_reason(monkeypatch):
    """`ksearch tasks show` and `eval` must not hang on a reference that never returns, nor exit with it."""
    import ksearch.tasks.flops as flops

    monkeypatch.setattr(flops, "COUNT_SECONDS", 0.3)
    hang = _definition("import torch\ndef run(a, b):\n    while True:\n        pass\n")
    cost = hang.cost_of(Workload(axes={"M": 4, "K": 5}))
    assert cost.flops == 0 and "did not finish in 0.3 s" in cost.source
    again = count_flops(hang, Workload(axes={"M": 7, "K": 5}))  # another shape: not 0.3 s again
    assert again.flops is None and "did not finish" in again.note
    loads = _definition("while True:\n    pass\ndef run(a, b):\n    return a @ b\n")
    assert "did not load in 0.3 s" in count_flops(loads, Workload(axes={"M": 4, "K": 5})).note
    leave = _definition("import sys\ndef run(a, b):\n    sys.exit(3)\n")
    assert "SystemExit" in leave.cost_of(Workload(axes={"M": 4, "K": 5})).source


def test_a_huge_workload_that_cannot_run_on_meta_is_not_drawn(monkeypatch):
    """A reference that reads its data at 16 GiB of inputs: refused by size, nothing allocated."""
    import ksearch.tasks.inputs as inputs

    monkeypatch.setattr(inputs, "make_inputs", lambda *a: pytest.fail("drew the inputs of a 16 GiB workload"))
    reads = _definition("import torch\ndef run(a, b):\n    a[0, 0].item()\n    return a @ b\n")
    counted = count_flops(reads, Workload(axes={"M": 65536, "K": 65536}))
    assert counted.flops is None and "MiB of inputs and outputs, over the 512 MiB" in counted.note, counted.note
    assert "not on meta tensors (" in counted.note


def test_a_reason_that_names_each_workload_is_said_three_times_then_counted():
    """A dataset whose 48 workloads lack their blobs printed 48 reasons under `ksearch tasks show`."""
    from ksearch.tasks.definition import join_cost_sources

    reasons = [f"bytes only (FLOPs not counted: workload {i} lacks its blob)" for i in range(48)]
    text = join_cost_sources([*reasons, reasons[0]])
    assert text.count("bytes only") == 3 and text.endswith("; and 45 more (one per workload)")
    assert join_cost_sources([SOURCE, SOURCE]) == SOURCE
