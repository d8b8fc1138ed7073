"""The torch-facing exports of triton kernels, run on an NVIDIA GPU (marked ``cuda``: the conftest skips them, with
the reason, where CuPy or a device is missing; they skip themselves where torch's CUDA build, Triton or
flashinfer-bench is missing). On the GPU machine, from the repository root:

    PYTHONPATH=src python3 -m pytest -q -m cuda tests/export/test_export_gpu.py -rs

- flashinfer-bench's own builder (``BuilderRegistry``, its Triton builder) builds the exported Solution and calls it in
  destination-passing style; the output matches the definition's reference;
- a triton ``ModelNew`` matches KernelBench's ``Model`` on the GPU; a triton ``submission.py`` passes a GPU MODE
  look-alike's own check.

Not yet run on a GPU (the session that wrote them had no device time left): docs/export.md says so.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from ksearch.export import export_candidate
from ksearch.records import Candidate
from ksearch.tasks import load_task

pytestmark = pytest.mark.cuda

RELU = '''import torch
import triton
import triton.language as tl


@triton.jit
def _relu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def run(x, output):
    n = x.numel()
    _relu[(triton.cdiv(n, 1024),)](x, output, n, BLOCK=1024)
'''
ADD = '''import triton
import triton.language as tl


@triton.jit
def _add(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


def run(A, B, output):
    n = A.numel()
    _add[(triton.cdiv(n, 1024),)](A, B, output, n, BLOCK=1024)
'''


@pytest.fixture(autouse=True)
def _gpu(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton", reason="Triton is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))


def test_flashinfer_benchs_builder_runs_the_exported_solution(tmp_path):
    import torch

    fib = pytest.importorskip("flashinfer_bench.data", reason="pip install --no-deps flashinfer-bench==0.1.2")
    from flashinfer_bench.compile.registry import BuilderRegistry

    from tests.export.test_flashinfer_export import RMSNORM, TRITON, fib_definition

    task = load_task(RMSNORM)
    path = export_candidate(Candidate(target="triton", sources={"kernel.py": TRITON}), task.definition,
                            tmp_path / "fib", {}, "flashinfer-bench")
    sol = fib.Solution.model_validate_json(path.read_text())
    definition = fib_definition(fib)
    runnable = BuilderRegistry.get_instance().build(definition, sol)
    ns: dict = {}
    exec(compile(definition.reference, "reference", "exec"), ns)
    for batch in (1, 7):
        x = torch.randn(batch, 4096, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(batch, 4096, dtype=torch.bfloat16, device="cuda")
        runnable.call_destination_passing(x, w, out)
        torch.testing.assert_close(out.float(), ns["run"](x, w).float(), atol=2e-2, rtol=2e-2)


def test_a_triton_model_new_matches_kernelbench_model_on_the_gpu(tmp_path):
    import torch

    from tests.export.test_kernelbench_export import FIXTURES, PROBLEMS, load_module
    from ksearch.tasks.kernelbench import load_kernelbench

    rel = "level1/19_ReLU.py"
    task = load_kernelbench(FIXTURES / rel, sizes=PROBLEMS[rel][0])
    mod = load_module(export_candidate(Candidate(target="triton", sources={"kernel.py": RELU}), task.definition,
                                       tmp_path / "model_new.py", {}, "kernelbench"))
    model, new = mod.Model(*mod.get_init_inputs()).cuda(), mod.ModelNew(*mod.get_init_inputs()).cuda()
    x = torch.randn(4, 300, device="cuda")
    got = new(x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, model(x))


def test_a_triton_submission_passes_the_problems_own_check(tmp_path, monkeypatch):
    from tests.export.test_kernelbench_export import load_module
    from tests.tasks.test_gpumode_import import GPUMODE

    task = load_task(GPUMODE / "vectoradd_py")
    sub = load_module(export_candidate(Candidate(target="triton", sources={"kernel.py": ADD}), task.definition,
                                       tmp_path / "submission.py", {}, "gpumode"))
    for name in ("reference", "task", "utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(GPUMODE))
    monkeypatch.syspath_prepend(str(GPUMODE / "vectoradd_py"))
    ref = importlib.import_module("reference")
    for wl in task.workloads:
        data = tuple(t.cuda() for t in ref.generate_input(**wl.axes, seed=7))
        out = sub.custom_kernel(data)
        assert out.device.type == "cuda"
        ok, message = ref.check_implementation(data, out)
        assert ok, (wl.name, message)
