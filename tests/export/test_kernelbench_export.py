"""`ksearch export --format kernelbench` (ksearch.export.kernelbench): the ModelNew module of a cpu kernel imports,
is built as KernelBench's harness builds it (the same seed before Model and ModelNew) and matches the reference
Model's output; a kernel with no ModelNew form is refused in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="KernelBench problems are PyTorch modules: pip install torch==2.13.0")

from ksearch.errors import ExportError  # noqa: E402
from ksearch.export import export_candidate  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.tasks.kernelbench import load_kernelbench, override_sizes  # noqa: E402
from tests.tasks.test_kernelbench_import import FIXTURES, PROBLEMS  # noqa: E402

CASES = ["level1/19_ReLU.py", "level1/40_LayerNorm.py", "level2/76_Gemm_Add_ReLU.py", "level2/68_Matmul_Min_Subtract.py"]


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_problem(rel: str) -> dict:
    """The problem file itself at the test's sizes (not the exported copy): its Model, get_inputs, ..."""
    ns: dict = {"__name__": "problem"}
    exec(compile(override_sizes((FIXTURES / rel).read_text(), PROBLEMS[rel][0], rel), rel, "exec"), ns)
    return ns


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the exported module builds its library there


@pytest.mark.parametrize("rel", CASES)
def test_model_new_matches_the_reference_model(rel, tmp_path):
    sizes, source = PROBLEMS[rel]
    task = load_kernelbench(FIXTURES / rel, sizes=sizes)
    path = export_candidate(Candidate(target="cpu", sources={"kernel.c": source}), task.definition,
                            tmp_path / "model_new.py", {"test": rel}, "kernelbench")
    mod = load_module(path)
    problem = reference_problem(rel)
    for seed in (1, 2):  # as KernelBench's harness: one seed for the inputs, one before each model is built
        torch.manual_seed(seed)
        inputs, init = problem["get_inputs"](), problem["get_init_inputs"]()
        torch.manual_seed(seed + 10)
        model = problem["Model"](*init)
        torch.manual_seed(seed + 10)
        new = mod.ModelNew(*init)
        assert isinstance(new, torch.nn.Module)
        with torch.no_grad():
            want, got = model(*inputs), new(*inputs)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # KernelBench's fp32 tolerance


def test_a_wrong_kernel_does_not_match(tmp_path):
    rel = "level1/19_ReLU.py"
    sizes, source = PROBLEMS[rel]
    task = load_kernelbench(FIXTURES / rel, sizes=sizes)
    wrong = Candidate(target="cpu", sources={"kernel.c": source.replace("x[i] : 0.0f", "x[i] : 1.0f")})
    mod = load_module(export_candidate(wrong, task.definition, tmp_path / "m.py", {}, "kernelbench"))
    x = torch.randn(4, 300)  # the problem's own inputs are all positive
    assert not torch.allclose(mod.ModelNew(*mod.get_init_inputs())(x), torch.relu(x))


def test_wrong_shapes_raise_naming_the_input(tmp_path):
    rel = "level1/19_ReLU.py"
    sizes, source = PROBLEMS[rel]
    task = load_kernelbench(FIXTURES / rel, sizes=sizes)
    mod = load_module(export_candidate(Candidate(target="cpu", sources={"kernel.c": source}), task.definition,
                                       tmp_path / "m.py", {}, "kernelbench"))
    with pytest.raises(ValueError, match=r"x: shape \(2, 3\), expected \(4, 300\)"):
        mod.ModelNew()(torch.zeros(2, 3))


def test_a_build_failure_says_so(tmp_path):
    rel = "level1/19_ReLU.py"
    task = load_kernelbench(FIXTURES / rel, sizes=PROBLEMS[rel][0])
    bad = Candidate(target="cpu", sources={"kernel.c": "void run(const float *x, float *output, long b, long d) {"})
    mod = load_module(export_candidate(bad, task.definition, tmp_path / "m.py", {}, "kernelbench"))
    with pytest.raises(RuntimeError, match="building the kernel with .* failed"):
        mod.ModelNew()(*mod.get_inputs())


def test_a_kernel_with_no_model_new_form_is_refused(tmp_path):
    rel = "level1/19_ReLU.py"
    task = load_kernelbench(FIXTURES / rel, sizes=PROBLEMS[rel][0])
    cuda = Candidate(target="cuda", sources={"kernel.cu": "__global__ void k() {}"}, launch={"launches": []})
    with pytest.raises(ExportError, match="a cuda kernel has no ModelNew form yet"):
        export_candidate(cuda, task.definition, tmp_path / "m.py", {}, "kernelbench")
    assert not (tmp_path / "m.py").exists()


def test_a_task_from_elsewhere_gets_a_model_new_over_its_inputs(tmp_path):
    """A task not imported from KernelBench (here a GPU MODE look-alike): ModelNew() takes the task's inputs in
    definition order; the var axis is read from their shapes."""
    from ksearch.tasks import load_task
    from tests.tasks.test_gpumode_import import GPUMODE, VECTORADD

    task = load_task(GPUMODE / "vectoradd_py")
    cand = Candidate(target="cpu", sources={"kernel.c": VECTORADD.replace("EPS", "0.0f")})
    mod = load_module(export_candidate(cand, task.definition, tmp_path / "m.py", {}, "kernelbench"))
    assert not hasattr(mod, "get_inputs")
    a, b = torch.randn(5, 5), torch.randn(5, 5)
    torch.testing.assert_close(mod.ModelNew()(a, b), a + b)
    with pytest.raises(TypeError, match=r"forward takes 2 inputs \(A, B\), got 1"):
        mod.ModelNew()(a)
