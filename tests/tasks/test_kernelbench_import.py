"""KernelBench problem files (tests/fixtures/kernelbench, copied unchanged: see its NOTICE) load as tasks and a naive
C kernel passes the judge on each, at sizes shrunk through the importer's ``sizes`` (the files keep their own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="KernelBench problems are PyTorch modules: pip install torch==2.13.0")

from ksearch.errors import TaskError  # noqa: E402
from ksearch.eval.evaluator import EvalConfig, Evaluator  # noqa: E402
from ksearch.protocol import TimingPlan  # noqa: E402
from ksearch.records import Candidate, Status  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402
from ksearch.tasks.inputs import make_inputs  # noqa: E402
from ksearch.tasks.kernelbench import load_kernelbench  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernelbench"
QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)
H = "#include <stdint.h>\n#include <math.h>\n"
GEMM = """
    for (int64_t b = 0; b < batch_size; b++)
        for (int64_t o = 0; o < out_features; o++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < in_features; i++) acc += x[b * in_features + i] * W[o * in_features + i];
            float y = EPILOGUE;
            output[b * out_features + o] = y;
        }
}"""

#: problem -> (size overrides, naive C kernel: inputs, weights, outputs, then the axes in the task's order)
PROBLEMS = {
    "level1/19_ReLU.py": ({"batch_size": 4, "dim": 300}, H + """
void run(const float *x, float *output, int64_t batch_size, int64_t dim) {
    for (int64_t i = 0; i < batch_size * dim; i++) output[i] = x[i] > 0.0f ? x[i] : 0.0f;
}"""),
    "level1/23_Softmax.py": ({"batch_size": 4, "dim": 300}, H + """
void run(const float *x, float *output, int64_t batch_size, int64_t dim) {
    for (int64_t b = 0; b < batch_size; b++) {
        const float *r = x + b * dim;
        float m = r[0], s = 0.0f;
        for (int64_t i = 1; i < dim; i++) m = r[i] > m ? r[i] : m;
        for (int64_t i = 0; i < dim; i++) s += expf(r[i] - m);
        for (int64_t i = 0; i < dim; i++) output[b * dim + i] = expf(r[i] - m) / s;
    }
}"""),
    "level1/2_Standard_matrix_multiplication_.py": ({"M": 8, "K": 16, "N": 12}, H + """
void run(const float *A, const float *B, float *output, int64_t M, int64_t K, int64_t N) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += A[i * K + k] * B[k * N + j];
            output[i * N + j] = acc;
        }
}"""),
    "level1/47_Sum_reduction_over_a_dimension.py": ({"batch_size": 3, "dim1": 5, "dim2": 7}, H + """
void run(const float *x, float *output, int64_t batch_size, int64_t dim1, int64_t dim2, int64_t output_d1) {
    for (int64_t b = 0; b < batch_size; b++)
        for (int64_t j = 0; j < dim2; j++) {
            float s = 0.0f;
            for (int64_t i = 0; i < dim1; i++) s += x[(b * dim1 + i) * dim2 + j];
            output[b * dim2 + j] = s;
        }
}"""),
    "level1/40_LayerNorm.py": ({"batch_size": 2, "features": 3, "dim1": 4, "dim2": 5}, H + """
void run(const float *x, const float *w, const float *bias, float *output, int64_t batch_size, int64_t features,
         int64_t dim1, int64_t dim2) {
    int64_t n = features * dim1 * dim2;
    for (int64_t b = 0; b < batch_size; b++) {
        const float *r = x + b * n;
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; i++) mean += r[i];
        mean /= n;
        for (int64_t i = 0; i < n; i++) var += (r[i] - mean) * (r[i] - mean);
        var /= n;
        float inv = 1.0f / sqrtf((float)var + 1e-5f);
        for (int64_t i = 0; i < n; i++) output[b * n + i] = ((float)(r[i] - mean)) * inv * w[i] + bias[i];
    }
}"""),
    "level2/76_Gemm_Add_ReLU.py": ({"batch_size": 4, "in_features": 16, "out_features": 8}, H + """
void run(const float *x, const float *bias, const float *W, float *output, int64_t batch_size,
         int64_t in_features, int64_t out_features) {""" + GEMM.replace("EPILOGUE", "fmaxf(acc + bias[o], 0.0f)")),
    "level2/12_Gemm_Multiply_LeakyReLU.py": ({"batch_size": 4, "in_features": 16, "out_features": 8}, H + """
void run(const float *x, const float *W, const float *bias, float *output, int64_t batch_size,
         int64_t in_features, int64_t out_features) {""" + GEMM.replace(
        "EPILOGUE", "(acc + bias[o]) * 2.0f;\n            y = y > 0.0f ? y : 0.1f * y")),
    "level2/9_Matmul_Subtract_Multiply_ReLU.py": ({"batch_size": 4, "in_features": 16, "out_features": 8}, H + """
void run(const float *x, const float *W, const float *bias, float *output, int64_t batch_size,
         int64_t in_features, int64_t out_features) {""" + GEMM.replace(
        "EPILOGUE", "fmaxf((acc + bias[o] - 2.0f) * 1.5f, 0.0f)")),
    # a 0-d parameter (nn.Parameter(torch.tensor(2.0))) reaches the kernel as a one-element array
    "level2/68_Matmul_Min_Subtract.py": ({"batch_size": 4, "in_features": 16, "out_features": 8}, H + """
void run(const float *x, const float *c, const float *W, const float *bias, float *output, int64_t batch_size,
         int64_t in_features, int64_t out_features) {""" + GEMM.replace(
        "EPILOGUE", "fminf(acc + bias[o], c[0]) - c[0]")),
}


def load(rel: str):
    sizes, _ = PROBLEMS[rel]
    return load_kernelbench(FIXTURES / rel, sizes=sizes)


def test_the_fixtures_are_nine_problems_of_both_levels():
    files = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.py"))
    assert files == sorted(PROBLEMS)
    assert {f.split("/")[0] for f in files} == {"level1", "level2"}


@pytest.mark.parametrize("rel", sorted(PROBLEMS))
def test_naive_kernel_passes_on_each_problem(rel):
    task = load(rel)
    ev = Evaluator(task, config=EvalConfig(seeds=[3, 4], timeout_s=20.0, timing=QUICK))
    try:
        res = ev.evaluate(Candidate(target="cpu", sources={"kernel.c": PROBLEMS[rel][1]}), timing=False)
    finally:
        ev.close()
    assert res.status is Status.PASSED, res.workloads[0].message


def test_problem_loads_at_its_own_sizes_without_allocating_them():
    """ReLU is 4096 x 393216 floats (6 GiB): the shapes are learnt on the meta device."""
    task = load_task(FIXTURES / "level1/19_ReLU.py")
    d = task.definition
    assert d.name == "level1-19_ReLU" and "kernelbench" in d.tags
    assert {k: a.value for k, a in d.axes.items()} == {"batch_size": 4096, "dim": 393216}
    assert d.inputs["x"].shape == ["batch_size", "dim"] and d.outputs["output"].shape == ["batch_size", "dim"]
    assert [w.name for w in task.workloads] == ["problem-sizes"]
    assert d.tolerance_for("float32").rtol == 1e-4  # KernelBench's fp32 tolerance


def test_weights_are_inputs_named_and_shaped_and_derived_constants_follow_an_override():
    d = load("level2/76_Gemm_Add_ReLU.py").definition
    assert list(d.inputs) == ["x", "bias", "gemm_weight"]
    assert d.inputs["gemm_weight"].shape == ["out_features", "in_features"]
    assert d.inputs["bias"].shape == ["out_features"]  # bias_shape = (out_features,) followed the override
    assert [a.value for a in d.axes.values()] == [4, 16, 8]
    assert d.inputs["gemm_weight"].description == "the module's parameter 'gemm.weight'"
    # the constructor's arguments have their place in the description (their values are baked into the reference)
    assert "Model(in_features=16, out_features=8, bias_shape=(8,))" in d.description


def test_inputs_are_the_problems_own_under_the_seed():
    """get_inputs() under torch.manual_seed(seed), then the module's weights under the same seed: torch.rand stays
    uniform [0, 1), Linear keeps its kaiming-uniform initialisation, and a new seed gives new values."""
    task = load("level2/9_Matmul_Subtract_Multiply_ReLU.py")
    wl = task.workloads[0]
    got = make_inputs(task.definition, wl, 7)
    torch.manual_seed(7)
    assert np.array_equal(got["x"], torch.rand(4, 16).numpy())
    torch.manual_seed(7)
    lin = torch.nn.Linear(16, 8)
    assert np.array_equal(got["linear_weight"], lin.weight.detach().numpy())
    assert got["linear_weight"].dtype == np.float32 and np.abs(got["linear_weight"]).max() <= 1 / 4  # 1/sqrt(16)
    assert not np.array_equal(make_inputs(task.definition, wl, 8)["x"], got["x"])


def test_wrong_kernel_fails_and_naive_kernel_is_timed():
    task = load("level1/19_ReLU.py")
    ev = Evaluator(task, config=EvalConfig(seeds=[5], timeout_s=20.0, timing=QUICK, busy_wait_s=0.0))
    wrong = PROBLEMS["level1/19_ReLU.py"][1].replace("x[i] > 0.0f ? x[i] : 0.0f", "x[i] > 0.5f ? x[i] : 0.0f")
    try:
        bad = ev.evaluate(Candidate(target="cpu", sources={"kernel.c": wrong}), timing=False)
        task.naive_sources["cpu"] = PROBLEMS["level1/19_ReLU.py"][1]
        timed = ev.measure_naive(task.workloads)
    finally:
        ev.close()
    assert bad.status is Status.INCORRECT_NUMERICAL
    assert timed.status is Status.PASSED and timed.workloads[0].median_ms is not None


def write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "problem.py"
    f.write_text(text)
    return f


def test_a_file_without_model_is_a_clear_task_error(tmp_path):
    f = write(tmp_path, "import torch\n\ndef get_inputs():\n    return [torch.rand(2)]\n\n"
                        "def get_init_inputs():\n    return []\n")
    with pytest.raises(TaskError, match="defines no Model"):
        load_task(f)


def test_get_inputs_that_raises_is_a_clear_task_error(tmp_path):
    f = write(tmp_path, "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n"
                        "def get_inputs():\n    raise ValueError('no inputs today')\n\n"
                        "def get_init_inputs():\n    return []\n")
    with pytest.raises(TaskError, match=r"get_inputs\(\) raised ValueError: no inputs today"):
        load_task(f)


def test_an_override_of_an_unknown_constant_names_it(tmp_path):
    with pytest.raises(TaskError, match="no top-level constant \\['batch'\\]"):
        load_kernelbench(FIXTURES / "level1/19_ReLU.py", sizes={"batch": 2})


def test_a_workloads_file_is_refused_with_the_reason(tmp_path):
    with pytest.raises(TaskError, match="fixes its sizes"):
        load_kernelbench(FIXTURES / "level1/19_ReLU.py", tmp_path / "w.jsonl")


def test_the_command_line_spelling_overrides_sizes():
    task = load_task(f"{FIXTURES / 'level1/19_ReLU.py'}:batch_size=2,dim=10")
    assert {k: a.value for k, a in task.definition.axes.items()} == {"batch_size": 2, "dim": 10}
    assert [w.name for w in task.workloads] == ["scaled-sizes"]
    with pytest.raises(TaskError, match="'dim=ten' is not NAME=INTEGER"):
        load_task(f"{FIXTURES / 'level1/19_ReLU.py'}:dim=ten")


def test_sizes_below_one_and_annotated_constants():
    """A size of 0 makes empty tensors any kernel passes: refused. ``NAME: int = 16`` is overridden like
    ``NAME = 16``."""
    with pytest.raises(TaskError, match=r"sizes \['dim'\] must be at least 1"):
        load_task(f"{FIXTURES / 'level1/19_ReLU.py'}:dim=0")
    from ksearch.tasks.kernelbench import override_sizes

    assert override_sizes("batch_size: int = 16\ndim = 8\n", {"batch_size": 4}, "p.py") == \
        "batch_size: int = 4\ndim = 8\n"


def test_an_input_that_is_neither_a_tensor_nor_a_number_is_a_clear_task_error(tmp_path):
    f = write(tmp_path, "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x, shape, mode):\n"
                        "        return x * 2\n\n"
                        "def get_inputs():\n    return [torch.rand(4), (4, 16), 'double']\n\n"
                        "def get_init_inputs():\n    return []\n")
    with pytest.raises(TaskError, match="'shape' is tuple .*ksearch passes tensors and numbers"):
        load_task(f)


def test_a_forward_that_never_returns_is_a_task_error_not_a_hang(tmp_path, monkeypatch):
    import ksearch.tasks.kernelbench as kb

    monkeypatch.setattr(kb, "LOAD_SECONDS", 0.3)
    f = write(tmp_path, "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        while True:\n"
                        "            x = x + 1\n\ndef get_inputs():\n    return [torch.rand(2)]\n\n"
                        "def get_init_inputs():\n    return []\n")
    with pytest.raises(TaskError, match=r"did not finish in 0.3 s"):
        load_task(f)


def test_a_huge_problem_that_cannot_run_on_meta_is_refused_not_built_on_the_cpu(tmp_path):
    """32 GiB of inputs whose forward reads data (.item()): refused by the size learnt on meta tensors."""
    f = write(tmp_path, "import torch\nclass Model(torch.nn.Module):\n    def forward(self, A, B):\n"
                        "        A[0, 0].item()\n        return A @ B\n\nM = 65536\n"
                        "def get_inputs():\n    return [torch.randn(M, M), torch.randn(M, M)]\n\n"
                        "def get_init_inputs():\n    return []\n")
    with pytest.raises(TaskError, match=r"item\(\) cannot be called on meta.*32768 MiB, over the 1024 MiB.*shrink"):
        load_task(f)


def test_a_problem_whose_top_level_never_finishes_or_exits_is_a_task_error(tmp_path, monkeypatch):
    import ksearch.tasks.kernelbench as kb

    monkeypatch.setattr(kb, "LOAD_SECONDS", 0.3)
    with pytest.raises(TaskError, match=r"does not finish running its top level in 0.3 s"):
        load_task(write(tmp_path, "while True:\n    pass\n\nclass Model:\n    pass\n"))
    with pytest.raises(TaskError, match=r"does not run: SystemExit: 5"):
        load_task(write(tmp_path, "import sys\nsys.exit(5)\n\nclass Model:\n    pass\n"))


#: a level-3 look-alike (ksearch's own, not a KernelBench file): state kept as a plain tensor attribute, a forward
#: argument named ``output``, and a constant named like the input generator's ``seed`` argument
STATEFUL = '''import torch
import torch.nn as nn

seed = 4
batch_size = 4
hidden = 8


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.h0 = torch.randn(batch_size, hidden)
        self.scale = nn.Parameter(torch.randn(hidden))

    def forward(self, x, output):
        self.h0 = self.h0.to(x.device)
        return x * self.scale + self.h0 + output


def get_inputs():
    return [torch.randn(batch_size, hidden), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
'''


def test_plain_tensor_state_an_output_argument_and_a_seed_constant_load_and_judge(tmp_path):
    (tmp_path / "rnn_like.py").write_text(STATEFUL)
    task = load_task(tmp_path / "rnn_like.py")
    d = task.definition
    assert list(d.inputs) == ["x", "output", "scale", "h0"] and list(d.outputs) == ["result"]
    assert list(d.axes) == ["batch_size", "hidden"]  # never `seed`: generate(seed, **axes) takes the seed
    assert d.inputs["h0"].description == "the module's tensor attribute 'h0'"
    one, two = (make_inputs(d, task.workloads[0], s) for s in (1, 2))
    assert not np.array_equal(one["h0"], two["h0"])  # drawn under each check's seed, as the weights are
    kernel = "def run(x, output, scale, h0, result, batch_size, hidden):\n    result[:] = x * scale + h0 + output\n"
    ev = Evaluator(task, target="null", config=EvalConfig(seeds=[3, 4], timeout_s=20.0, timing=QUICK))
    try:
        res = ev.evaluate(Candidate(target="null", sources={"kernel.py": kernel}), timing=False)
    finally:
        ev.close()
    assert res.status is Status.PASSED, res.workloads[0].message
