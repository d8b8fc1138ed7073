"""`ksearch export RUN --format F` (ksearch.export.export_run and the CLI): a run's best kernel goes out in each
format under ``<run>/best/``; a format with no counterpart for the run's target exits 2 in one line."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch", reason="KernelBench problems are PyTorch modules: pip install torch==2.13.0")

from ksearch.errors import ExportError  # noqa: E402
from ksearch.export import FORMATS, export_candidate, export_run  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.tasks.kernelbench import load_kernelbench  # noqa: E402
from tests.conftest import ksearch_main  # noqa: E402
from tests.export.test_kernelbench_export import FIXTURES, PROBLEMS, load_module  # noqa: E402

RELU = "level1/19_ReLU.py"


@pytest.fixture()
def run(tmp_path, monkeypatch):
    """A finished cpu run on the ReLU problem (at its test sizes) whose best kernel is the naive C kernel."""
    from ksearch.run.controller import RunConfig
    from ksearch.store.db import Store
    from ksearch.store.runs import run_dir

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sizes = ",".join(f"{k}={v}" for k, v in PROBLEMS[RELU][0].items())
    task = f"{FIXTURES / RELU}:{sizes}"
    d = run_dir("relu-test-run")
    d.mkdir(parents=True)
    store = Store(d / "run.sqlite", create=True)
    store.create_run(d.name, task, "cpu", RunConfig(task=task, target="cpu").model_dump(mode="json"), {}, None)
    store.close()
    (d / "best").mkdir()
    best = Candidate(target="cpu", sources={"kernel.c": PROBLEMS[RELU][1]}, node_id="n3")
    (d / "best" / "candidate.json").write_text(best.model_dump_json())
    return d


def test_a_runs_best_goes_out_as_model_new_and_submission(run):
    path = export_run("relu-test", fmt="kernelbench")
    assert path == run / "best" / "model_new.py"
    mod = load_module(path)
    assert "'run': 'relu-test-run'" in path.read_text() and "'node': 'n3'" in path.read_text()
    x = torch.randn(4, 300)
    torch.testing.assert_close(mod.ModelNew()(x), torch.relu(x))
    sub = load_module(export_run("relu-test", fmt="gpumode"))
    torch.testing.assert_close(sub.custom_kernel(x), torch.relu(x))  # one input: data is the tensor itself


def test_formats_with_no_counterpart_exit_2_in_one_line(run, monkeypatch, capsys):
    for fmt, words in (("flashinfer-bench", "a cpu kernel has no flashinfer-bench Solution form"),
                       ("mlx", "not mlx-metal or mlx-cuda")):
        code, _, err = ksearch_main(["export", "relu-test-run", "--format", fmt], capsys, monkeypatch)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, out, err = ksearch_main(["export", "relu-test-run", "-f", "kernelbench"], capsys, monkeypatch)
    assert code == 0 and out.strip() == f"wrote {run / 'best' / 'model_new.py'}", err
    with pytest.raises(ExportError, match="unknown export format 'onnx'; formats: mlx, kernelbench"):
        export_run("relu-test", fmt="onnx")
    assert list(FORMATS) == ["mlx", "kernelbench", "gpumode", "flashinfer-bench"]


def test_a_python_module_in_destination_passing_style_runs_through_the_torch_kind(tmp_path, monkeypatch):
    """The triton target's calling convention (run(inputs..., outputs...) on torch tensors), exercised on the CPU
    with a module that calls torch instead of Triton kernels (no GPU here: a real Triton kernel is not run)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    task = load_kernelbench(FIXTURES / "level2/76_Gemm_Add_ReLU.py", sizes=PROBLEMS["level2/76_Gemm_Add_ReLU.py"][0])
    source = ("import torch\n\n\ndef run(x, bias, gemm_weight, output):\n"
              "    output.copy_(torch.relu(x @ gemm_weight.T + bias))\n")
    cand = Candidate(target="triton", sources={"kernel.py": source})
    mod = load_module(export_candidate(cand, task.definition, tmp_path / "m.py", {}, "kernelbench"))
    torch.manual_seed(0)
    init = mod.get_init_inputs()
    torch.manual_seed(5)
    ref = mod.Model(*init)
    torch.manual_seed(5)
    new = mod.ModelNew(*init)
    x = mod.get_inputs()[0]
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x))


def test_a_run_over_without_a_best_kernel_says_so_rather_than_to_resume_it(run):
    """`ksearch resume` on an exhausted run writes no best kernel: the message must not send the user there."""
    from ksearch.store.db import Store

    (run / "best" / "candidate.json").unlink()
    with pytest.raises(ExportError, match="has no best kernel yet .* `ksearch resume relu-test-run`"):
        export_run("relu-test", fmt="kernelbench")
    store = Store(run / "run.sqlite")
    store.set_status("exhausted")
    store.close()
    with pytest.raises(ExportError, match="is exhausted with no best kernel .*nothing to export") as e:
        export_run("relu-test", fmt="kernelbench")
    assert "resume" not in str(e.value)
