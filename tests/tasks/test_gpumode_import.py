"""GPU MODE-style problem folders (tests/fixtures/gpumode: look-alikes written for ksearch, never GPU MODE's own files)
load as tasks whose data comes from ``generate_input`` and whose verdict is the problem's ``check_implementation``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="GPU MODE problems are PyTorch code: pip install torch==2.13.0")

from ksearch.errors import TaskError  # noqa: E402
from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.protocol import TimingPlan  # noqa: E402
from ksearch.records import Candidate, Status  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402
from ksearch.tasks.importers import import_task, write_task_dir  # noqa: E402
from ksearch.tasks.inputs import make_inputs  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GPUMODE = FIXTURES / "gpumode"
QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)

VECTORADD = """#include <stdint.h>
void run(const float *A, const float *B, float *output, int64_t size) {
    for (int64_t i = 0; i < size * size; i++) output[i] = A[i] + B[i] + EPS;
}"""
ROWSUM = """#include <stdint.h>
void run(const float *x, const float *out, float *output, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int64_t c = 0; c < cols - SKIP; c++) s += x[r * cols + c];
        output[r] = s;
    }
}"""


def judge(task, source: str, timing: bool = False, seeds=(1, 2)):
    ev = Evaluator(task, config=EvalConfig(seeds=list(seeds), timeout_s=20.0, timing=QUICK, busy_wait_s=0.0))
    try:
        return ev.evaluate(Candidate(target="cpu", sources={"kernel.c": source}), timing=timing)
    finally:
        ev.close()


def test_folder_loads_with_sizes_as_axes_and_tests_as_check_workloads():
    task = load_task(GPUMODE / "vectoradd_py")
    d = task.definition
    assert list(d.axes) == ["size"] and d.axes["size"].type == "var"
    assert {k: s.shape for k, s in d.inputs.items()} == {"A": ["size", "size"], "B": ["size", "size"]}
    assert d.outputs["output"].shape == ["size", "size"] and d.outputs["output"].dtype == "float32"
    assert [(w.name, w.purpose, w.axes) for w in task.workloads] == [
        ("test0-size16", "check", {"size": 16}), ("test1-size33", "check", {"size": 33}),
        ("bench0-size64", "bench", {"size": 64})]


def test_data_comes_from_generate_input_with_the_checks_seed():
    task = load_task(GPUMODE / "vectoradd_py")
    got = make_inputs(task.definition, task.workloads[0], 5)
    gen = torch.Generator()
    gen.manual_seed(5)
    assert np.array_equal(got["A"], torch.randn(16, 16, generator=gen).numpy())
    assert np.array_equal(got["B"], torch.randn(16, 16, generator=gen).numpy())


def test_naive_kernel_passes_the_problems_own_check_and_is_timed():
    task = load_task(GPUMODE / "vectoradd_py")
    res = judge(task, VECTORADD.replace("EPS", "0.0f"), timing="bench")
    assert res.status is Status.PASSED, [w.message for w in res.workloads]
    assert [w.median_ms is not None for w in res.workloads] == [False, False, True]


def test_a_kernel_within_ksearchs_tolerance_fails_the_problems_tighter_check():
    """An error of 1e-4 passes ksearch's default float32 tolerance (atol 2e-3), not the problem's own (1e-6)."""
    res = judge(load_task(GPUMODE / "vectoradd_py"), VECTORADD.replace("EPS", "1e-4f"))
    assert res.status is Status.INCORRECT_NUMERICAL
    assert "the task's own check failed: mismatch" in res.workloads[0].message


def test_nan_fails_before_the_check():
    res = judge(load_task(GPUMODE / "vectoradd_py"), VECTORADD.replace("EPS", "__builtin_nanf(\"\")"))
    assert res.status is Status.INCORRECT_NUMERICAL and "not finite" in res.workloads[0].message


def test_an_output_buffer_in_the_data_is_a_read_only_input_and_the_scaled_check_judges():
    task = load_task(GPUMODE / "rowsum_py")
    d = task.definition
    assert list(d.inputs) == ["x", "out"] and list(d.outputs) == ["output"]
    assert judge(task, ROWSUM.replace("SKIP", "0"), seeds=(3,)).status is Status.PASSED
    wrong = judge(task, ROWSUM.replace("SKIP", "1"), seeds=(3,))
    assert wrong.status is Status.INCORRECT_NUMERICAL and "own check" in wrong.workloads[0].message


def test_an_imported_folder_stands_alone(tmp_path):
    """`ksearch tasks import` writes the problem's modules into the definition: the folder loads and judges
    without the original files."""
    out = write_task_dir(import_task(GPUMODE / "vectoradd_py"), tmp_path / "task")
    task = load_task(out)
    assert task.definition.checker and [w.name for w in task.workloads][0] == "test0-size16"
    assert judge(task, VECTORADD.replace("EPS", "0.0f"), seeds=(9,)).status is Status.PASSED


def test_kernelbench_problem_imports_to_a_folder_that_judges(tmp_path):
    from ksearch.tasks.kernelbench import load_kernelbench

    task = load_kernelbench(FIXTURES / "kernelbench/level1/19_ReLU.py", sizes={"batch_size": 2, "dim": 50})
    loaded = load_task(write_task_dir(task, tmp_path / "relu"))
    relu = "#include <stdint.h>\nvoid run(const float *x, float *output, int64_t batch_size, int64_t dim) {\n" \
           "    for (int64_t i = 0; i < batch_size * dim; i++) output[i] = x[i] > 0.0f ? x[i] : 0.0f;\n}"
    assert judge(loaded, relu, seeds=(4,)).status is Status.PASSED


def test_a_folder_without_check_implementation_is_a_clear_task_error():
    with pytest.raises(TaskError, match="defines no check_implementation"):
        load_task(GPUMODE / "broken_py")


def test_a_generate_input_that_raises_is_a_clear_task_error(tmp_path):
    folder = tmp_path / "bad_py"
    folder.mkdir()
    (folder / "task.yml").write_text('files:\n  - {"name": "reference.py", "source": "reference.py"}\n'
                                     'tests:\n  - {"size": 4, "seed": 1}\n')
    (folder / "reference.py").write_text("def generate_input(size, seed):\n    raise RuntimeError('no device')\n\n"
                                         "def ref_kernel(data):\n    return data\n\n"
                                         "def check_implementation(data, output):\n    return True\n")
    with pytest.raises(TaskError, match=r"generate_input\(\{'size': 4\}, seed=1\) for test0-size4 raised "
                                        "RuntimeError: no device"):
        load_task(folder)


PAD = """#include <stdint.h>
void run(const float *x, float *output, int64_t size, int64_t output_d0) {
    output[0] = 0.0f;
    for (int64_t i = 0; i < size; i++) output[i + 1] = x[i];
    output[size + 1] = 0.0f;
}"""


def test_a_dimension_derived_from_the_sizes_is_an_axis_tied_to_them(tmp_path):
    folder = tmp_path / "pad_py"
    folder.mkdir()
    (folder / "task.yml").write_text('files:\n  - {"name": "reference.py", "source": "reference.py"}\n'
                                     'tests:\n  - {"size": 4, "seed": 1}\n  - {"size": 9, "seed": 2}\n')
    (folder / "reference.py").write_text(
        "import torch\n\n\ndef generate_input(size, seed):\n    g = torch.Generator()\n    g.manual_seed(seed)\n"
        "    return torch.rand(size, generator=g)\n\n\ndef ref_kernel(x):\n    return torch.nn.functional.pad(x, (1, 1))\n\n\n"
        "def check_implementation(data, output):\n    return bool(torch.equal(output, ref_kernel(data)))\n")
    task = load_task(folder)
    d = task.definition
    assert d.inputs["x"].shape == ["size"] and d.outputs["output"].shape == ["output_d0"]
    assert d.constraints == ["output_d0 == size + 2"]
    assert [w.axes for w in task.workloads] == [{"size": 4, "output_d0": 6}, {"size": 9, "output_d0": 11}]
    assert judge(task, PAD, seeds=(6,)).status is Status.PASSED


def test_a_relation_no_line_explains_is_the_workloads_own_pairs():
    from ksearch.tasks.gpumode import relation

    assert relation("y", [4, 9, 25], [{"n": 2}, {"n": 3}, {"n": 5}]) == \
        "(n == 2 and y == 4) or (n == 3 and y == 9) or (n == 5 and y == 25)"
    assert relation("y", [7, 11], [{"m": 3, "n": 2}, {"m": 3, "n": 4}]) == "y == 2 * n + 3"


def test_a_flag_among_the_sizes_is_a_zero_one_axis(tmp_path):
    folder = tmp_path / "flag_py"
    folder.mkdir()
    (folder / "task.yml").write_text('tests:\n  - {"size": 4, "negate": true, "seed": 1}\n'
                                     '  - {"size": 5, "negate": false, "seed": 2}\n')
    (folder / "reference.py").write_text(
        "import torch\n\n\ndef generate_input(size, negate, seed):\n    x = torch.ones(size)\n"
        "    return -x if negate else x\n\n\ndef ref_kernel(data):\n    return data * 2\n\n\n"
        "def check_implementation(data, output):\n    return ''\n")
    task = load_task(folder)
    assert [w.axes for w in task.workloads] == [{"size": 4, "negate": 1}, {"size": 5, "negate": 0}]
    assert make_inputs(task.definition, task.workloads[0], 3)["data"].tolist() == [-1.0] * 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the hint is for a torch without CUDA")
def test_a_problem_on_cuda_without_cuda_says_so(tmp_path):
    folder = tmp_path / "cuda_py"
    folder.mkdir()
    (folder / "task.yml").write_text('tests:\n  - {"size": 4, "seed": 1}\n')
    (folder / "reference.py").write_text(
        "import torch\n\n\ndef generate_input(size, seed):\n    return torch.randn(size, device='cuda')\n\n\n"
        "def ref_kernel(data):\n    return data\n\n\ndef check_implementation(data, output):\n    return True\n")
    with pytest.raises(TaskError, match="the problem allocates on CUDA"):
        load_task(folder)


def test_a_check_returning_a_list_of_reasons_fails_on_any_and_an_unclear_value_is_refused():
    """GPU MODE's older checks return the reasons of a mismatch (empty: passed): a non-empty list must fail (its
    truth value passed it before); a value that could mean either is a TaskError, never a verdict."""
    from ksearch.tasks.generated import verdict

    assert verdict([]) == (True, "") and verdict(["mismatch at 3", "mismatch at 7"]) == (False,
                                                                                       "mismatch at 3; mismatch at 7")
    assert verdict(True) == (True, "") and verdict((False, "off")) == (False, "off") and verdict(None) == (True, "")
    for unclear in ([1, 2], 0.5, ("a", "b", 3)):
        with pytest.raises(TaskError, match="a check returns True/False"):
            verdict(unclear)


def _variant(tmp_path, name: str, reference: str):
    d = tmp_path / name
    d.mkdir()
    for f in ("task.yml", "task.py"):
        (d / f).write_text((GPUMODE / "vectoradd_py" / f).read_text())
    (tmp_path / "utils.py").write_text((GPUMODE / "utils.py").read_text())
    (d / "reference.py").write_text(reference)
    return d


def test_a_reference_returning_a_one_element_tuple_is_checked_as_a_tuple(tmp_path):
    ref = (GPUMODE / "vectoradd_py" / "reference.py").read_text()
    ref = ref.replace("    return A + B", "    return (A + B,)").replace(
        "check_implementation = make_match_reference(ref_kernel, rtol=1e-6, atol=1e-6)",
        "def check_implementation(data, output):\n"
        "    A, B = data\n"
        "    got = output[0]  # the problem indexes its tuple\n"
        "    return bool(torch.allclose(got, A + B, rtol=1e-6, atol=1e-6)), 'mismatch'\n")
    task = load_task(_variant(tmp_path, "tup_py", ref))
    res = judge(task, VECTORADD.replace("EPS", "0.0f"))
    assert res.status is Status.PASSED, [w.message for w in res.workloads]
    assert judge(task, VECTORADD.replace("EPS", "1e-3f")).status is Status.INCORRECT_NUMERICAL


def test_tasks_import_with_force_replaces_the_task_files_a_folder_held(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "definition.yaml").write_text("name: stale\n")  # read before definition.json if it stayed
    (out / "naive.cpu.c").write_text("/* stale */\n")
    (out / "notes.txt").write_text("mine\n")
    write_task_dir(import_task(GPUMODE / "vectoradd_py"), out, force=True)
    assert not (out / "definition.yaml").exists() and not (out / "naive.cpu.c").exists()
    assert (out / "notes.txt").read_text() == "mine\n"
    assert load_task(out).definition.name == "vectoradd_py"


def test_a_ref_kernel_that_never_returns_is_a_task_error_not_a_hang(tmp_path, monkeypatch):
    import ksearch.tasks.gpumode as gm

    monkeypatch.setattr(gm, "PROBE_SECONDS", 0.3)
    folder = tmp_path / "hang_py"
    folder.mkdir()
    (folder / "task.yml").write_text('files:\n  - {"name": "reference.py", "source": "reference.py"}\n'
                                     'tests:\n  - {"size": 4, "seed": 1}\n')
    (folder / "reference.py").write_text("import torch\n\ndef generate_input(size, seed):\n"
                                         "    return torch.zeros(size)\n\n"
                                         "def ref_kernel(data):\n    while True:\n        data = data + 1\n\n"
                                         "def check_implementation(data, output):\n    return True\n")
    with pytest.raises(TaskError, match=r"ref_kernel on test0-size4 did not finish in 0.3 s"):
        load_task(folder)


def test_the_probe_keeps_shapes_not_every_workloads_data():
    """Every workload's data held at once at load time could be gigabytes: meta tensors, the device kept."""
    import ksearch.tasks.gpumode as gm

    task = load_task(GPUMODE / "vectoradd_py")
    assert task.definition.inputs  # loads as before
    seen = {}
    real = gm._probe

    def spy(*a):
        seen["r"] = real(*a)
        return seen["r"]

    import unittest.mock

    with unittest.mock.patch.object(gm, "_probe", spy):
        load_task(GPUMODE / "vectoradd_py")
    data_all, out_all, _, _, device = seen["r"]
    assert device == "cpu" and all(p.is_meta for row in data_all + out_all for p in row)


def test_a_reference_py_that_never_finishes_importing_or_exits_is_a_task_error(tmp_path, monkeypatch):
    import ksearch.tasks.gpumode as gm

    monkeypatch.setattr(gm, "PROBE_SECONDS", 0.3)
    for top, words in (("while True:\n    pass\n", "does not finish importing in 0.3 s"),
                       ("import sys\nsys.exit(6)\n", "does not import: SystemExit: 6")):
        folder = tmp_path / f"p{len(top)}_py"
        folder.mkdir()
        (folder / "task.yml").write_text('files:\n  - {"name": "reference.py", "source": "reference.py"}\n'
                                         'tests:\n  - {"size": 4, "seed": 1}\n')
        (folder / "reference.py").write_text(top + "def generate_input(size, seed):\n    return None\n\n"
                                             "def ref_kernel(data):\n    return data\n\n"
                                             "def check_implementation(data, output):\n    return True\n")
        with pytest.raises(TaskError, match=words):
            load_task(folder)


def test_sys_exit_in_generate_input_or_the_check_is_a_task_error_or_a_failed_check(tmp_path):
    """Either ended `ksearch eval` with the problem's exit status and no message."""
    from ksearch.tasks.generated import run_checker

    folder = tmp_path / "exits_py"
    folder.mkdir()
    (folder / "task.yml").write_text('files:\n  - {"name": "reference.py", "source": "reference.py"}\n'
                                     'tests:\n  - {"size": 4, "seed": 1}\n')
    ref = ("import sys\nimport torch\n\ndef generate_input(size, seed):\n    GEN\n\n"
           "def ref_kernel(data):\n    return data * 2\n\n"
           "def check_implementation(data, output):\n    sys.exit(7)\n")
    (folder / "reference.py").write_text(ref.replace("GEN", "sys.exit(8)"))
    with pytest.raises(TaskError, match="generate_input.*raised SystemExit: 8"):
        load_task(folder)
    (folder / "reference.py").write_text(ref.replace("GEN", "return torch.ones(size)"))
    task = load_task(folder)
    x = np.ones(4, np.float32)
    ok, why = run_checker(task.definition, {n: x for n in task.definition.inputs},
                          {n: 2 * x for n in task.definition.outputs})
    assert not ok and "SystemExit: 7" in why
