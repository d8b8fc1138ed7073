"""`ksearch export --format flashinfer-bench` (ksearch.export.flashinfer): a triton kernel's Solution and the Traces
of a run's final measurements load and validate with flashinfer-bench's own models (the PyPI package
``flashinfer-bench``, installed with ``--no-deps``: its dependency flashinfer-python pulls CUDA wheels; docs/export.md);
kernels with no counterpart there are refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ksearch.errors import ExportError
from ksearch.export import export_candidate
from ksearch.records import Candidate, Evaluation, FinalMeasurements, Status, WorkloadResult
from ksearch.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
RMSNORM = ROOT / "tests" / "fixtures" / "flashinfer_trace" / "definitions" / "rmsnorm" / "rmsnorm_h4096.json"
#: a triton kernel for rmsnorm_h4096 as the triton target takes it: run(inputs..., outputs...) on torch CUDA tensors
TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, H: tl.constexpr, EPS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, H)
    x = tl.load(x_ptr + row * H + cols).to(tl.float32)
    w = tl.load(w_ptr + cols).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + EPS)
    tl.store(out_ptr + row * H + cols, (x * inv * w).to(tl.bfloat16))


def run(hidden_states, weight, output):
    _rmsnorm[(hidden_states.shape[0],)](hidden_states, weight, output, H=hidden_states.shape[1], EPS=1e-6)
'''


def fib_definition(fib):
    """The RMSNorm fixture as flashinfer-bench's own Definition: the fixture is its format, but its
    ``"constraints": null`` is refused by 0.1.2's model, so top-level nulls are dropped first."""
    return fib.Definition.model_validate({k: v for k, v in json.loads(RMSNORM.read_text()).items() if v is not None})


def candidate() -> Candidate:
    return Candidate(target="triton", sources={"kernel.py": TRITON})


def final_for(cand: Candidate) -> FinalMeasurements:
    """What a run's final stage records: the best kernel on both workloads, the reference timed on the first."""
    ok = dict(status=Status.PASSED, max_abs_err=0.004, max_rel_err=0.01, repeats=40)
    naive = Evaluation(candidate_id="naive", task="rmsnorm_h4096", target="triton", status=Status.PASSED,
                       workloads=[WorkloadResult(workload="batch_size=1", median_ms=0.05, **ok)])
    best = Evaluation(candidate_id=cand.id, task="rmsnorm_h4096", target="triton", hardware="NVIDIA H100 80GB HBM3",
                      status=Status.PASSED,
                      workloads=[WorkloadResult(workload="batch_size=1", median_ms=0.01, speedup_vs_naive=5.0, **ok),
                                 WorkloadResult(workload="batch_size=7", median_ms=0.02, speedup_vs_naive=4.0, **ok)])
    ref = {"batch_size=1": WorkloadResult(workload="batch_size=1", status=Status.PASSED, median_ms=0.03)}
    return FinalMeasurements(best_candidate_id=cand.id, naive=naive, best=best, reference=ref,
                             reference_name="the definition's reference")


def test_the_candidate_is_one_the_triton_target_takes(tmp_path, monkeypatch):
    from ksearch.targets.triton import TritonTarget

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    assert TritonTarget().compile(candidate(), load_task(RMSNORM).definition).ok


def test_solution_and_traces_validate_with_flashinfer_benchs_own_models(tmp_path):
    fib = pytest.importorskip("flashinfer_bench.data", reason="pip install --no-deps flashinfer-bench==0.1.2 "
                                                              "(docs/export.md)")
    task = load_task(RMSNORM)
    cand = candidate()
    path = export_candidate(cand, task.definition, tmp_path / "fib", {"run": "r1"}, "flashinfer-bench",
                            task.workloads, final_for(cand))
    assert path.parent == tmp_path / "fib" / "solutions" / "rmsnorm" / "rmsnorm_h4096"
    sol = fib.Solution.model_validate_json(path.read_text())
    assert sol.definition == "rmsnorm_h4096" and sol.spec.language == fib.SupportedLanguages.TRITON
    assert sol.spec.destination_passing_style and sol.get_entry_symbol() == "run"
    assert sol.get_entry_source().content == TRITON and sol.name == path.stem
    lines = (tmp_path / "fib" / "traces" / "rmsnorm" / "rmsnorm_h4096.jsonl").read_text().splitlines()
    traces = [fib.Trace.model_validate_json(line) for line in lines]
    assert [t.workload.uuid for t in traces] == [w.uuid for w in task.workloads]
    assert all(t.is_successful() and t.solution == sol.name for t in traces)
    first, second = (t.evaluation.performance for t in traces)
    assert (first.latency_ms, first.reference_latency_ms, first.speedup_factor) == (0.01, 0.03, pytest.approx(3.0))
    assert (second.latency_ms, second.speedup_factor) == (0.02, 0.0) and "not timed" in traces[1].evaluation.log
    assert traces[0].workload.inputs["weight"].type == "random" and traces[0].workload.axes == {"batch_size": 1}
    assert traces[0].evaluation.environment.hardware == "NVIDIA H100 80GB HBM3"
    from flashinfer_bench.data import TraceSet  # the dataset layout loads as a whole

    ts = TraceSet.from_path(str(tmp_path / "fib"))
    assert [s.name for s in ts.solutions["rmsnorm_h4096"]] == [sol.name] and len(ts.traces["rmsnorm_h4096"]) == 2


def test_without_final_measurements_only_the_solution_is_written(tmp_path):
    task = load_task(RMSNORM)
    path = export_candidate(candidate(), task.definition, tmp_path / "fib", {}, "flashinfer-bench", task.workloads)
    assert json.loads(path.read_text())["spec"]["entry_point"] == "kernel.py::run"
    assert not (tmp_path / "fib" / "traces").exists()


@pytest.mark.parametrize("cand", [Candidate(target="cpu", sources={"kernel.c": "void run(void) {}"}),
                                  Candidate(target="cuda", sources={"kernel.cu": "__global__ void k() {}"},
                                            launch={"launches": []})], ids=["c-kernel", "launch-plan"])  # an id "cuda" would mark it a GPU test
def test_kernels_with_no_counterpart_are_refused(cand, tmp_path):
    with pytest.raises(ExportError, match=f"a {cand.target} kernel has no flashinfer-bench Solution form"):
        export_candidate(cand, load_task(RMSNORM).definition, tmp_path / "fib", {}, "flashinfer-bench")
    assert not (tmp_path / "fib").exists()


def test_cli_refuses_a_cpu_kernel_in_one_line_with_exit_2(tmp_path):
    cand = tmp_path / "candidate.json"
    cand.write_text(Candidate(target="cpu", sources={"kernel.c": "void run(void) {}"}).model_dump_json())
    env = {**os.environ, "KSEARCH_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "ksearch", "export", "--candidate", str(cand), "--task", str(RMSNORM),
                        "--format", "flashinfer-bench", "-o", str(tmp_path / "fib")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("error: --format flashinfer-bench: a cpu kernel") and len(
        r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "ksearch", "export", "--candidate", str(cand), "--task", str(RMSNORM),
                        "--format", "onnx"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "unknown export format 'onnx'" in r.stderr


def test_flashinfer_benchs_python_builder_imports_and_calls_the_solution(tmp_path, monkeypatch):
    """flashinfer-bench's own builder for Python sources (the one its Triton builder extends) imports the exported
    Solution and calls ``run`` in destination-passing style; the output matches the definition's reference. On the
    CPU, with a ``kernel.py`` that calls torch instead of a Triton kernel (tests/export/test_export_gpu.py runs a
    Triton kernel through the Triton builder on a GPU)."""
    fib = pytest.importorskip("flashinfer_bench.data", reason="pip install --no-deps flashinfer-bench==0.1.2")
    import torch
    from flashinfer_bench.compile.builders.python_builder import PythonBuilder

    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib-cache"))
    source = ("import torch\n\n\ndef run(hidden_states, weight, output):\n    x = hidden_states.float()\n"
              "    inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
              "    output.copy_((x * inv * weight.float()).to(output.dtype))\n")
    task = load_task(RMSNORM)
    path = export_candidate(Candidate(target="triton", sources={"kernel.py": source}), task.definition,
                            tmp_path / "fib", {}, "flashinfer-bench")
    sol = fib.Solution.model_validate_json(path.read_text())
    definition = fib_definition(fib)
    runnable = PythonBuilder().build(definition, sol)
    ns: dict = {}
    exec(compile(definition.reference, "reference", "exec"), ns)
    x, w = torch.randn(3, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    out = torch.empty(3, 4096, dtype=torch.bfloat16)
    runnable.call_destination_passing(x, w, out)
    torch.testing.assert_close(out.float(), ns["run"](x, w).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("field,value", [("name", "../../evil"), ("op_type", ".."), ("op_type", "a/b")])
def test_a_definition_name_or_op_type_that_is_a_path_writes_nothing_outside(field, value, tmp_path):
    """A definition from a downloaded dataset named ``../../evil`` wrote its Solution two levels above --out."""
    task = load_task(RMSNORM)
    bad = task.definition.model_copy(update={field: value})
    with pytest.raises(ExportError, match=f"the definition's {field} .* is not one path component"):
        export_candidate(candidate(), bad, tmp_path / "out" / "fib", {}, "flashinfer-bench", task.workloads)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))
