import json

import pytest

from ksearch.errors import TaskError
from ksearch.tasks import load_definition, load_task, load_workloads
from ksearch.tasks.definition import Definition, Workload, eval_expr

# A definition written as flashinfer-bench writes them (GQA decode, torch reference, const + var axes).
FIB_DEFINITION = {
    "name": "gqa_paged_decode_h32_kv8_d128_ps1",
    "op_type": "gqa_paged",
    "tags": ["stage:decode", "status:verified", "model:llama-3.1-8b"],
    "description": "Batched GQA decode with a paged KV cache.",
    "axes": {
        "batch_size": {"type": "var", "description": "Total number of query tokens."},
        "num_qo_heads": {"type": "const", "value": 32},
        "num_kv_heads": {"type": "const", "value": 8},
        "head_dim": {"type": "const", "value": 128},
        "num_pages": {"type": "var"},
        "page_size": {"type": "const", "value": 1},
        "len_indptr": {"type": "var"},
        "num_kv_indices": {"type": "var"},
    },
    "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"][:1],
    "inputs": {
        "q": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
        "k_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": "bfloat16"},
        "v_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": "bfloat16"},
        "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
        "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
        "sm_scale": {"shape": None, "dtype": "float32", "description": "Softmax scale."},
    },
    "outputs": {
        "output": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
        "lse": {"shape": ["batch_size", "num_qo_heads"], "dtype": "float32"},
    },
    "reference": "import torch\n\n@torch.no_grad()\ndef run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):\n"
                 "    raise NotImplementedError\n",
}


def test_flashinfer_bench_definition_loads_and_round_trips(tmp_path):
    path = tmp_path / "def.json"
    path.write_text(json.dumps(FIB_DEFINITION))
    d = load_definition(path)
    assert d.var_axes == ["batch_size", "num_pages", "len_indptr", "num_kv_indices"]
    assert d.inputs["sm_scale"].shape is None
    assert d.reference_backend == "torch"  # flashinfer-bench's convention
    again = json.loads(d.model_dump_json(exclude_defaults=True))
    assert again == FIB_DEFINITION
    assert Definition.model_validate(again) == d


def test_flashinfer_bench_workload_lines_and_traces(tmp_path):
    lines = [
        {"uuid": "a1", "axes": {"batch_size": 2, "num_pages": 10, "len_indptr": 3, "num_kv_indices": 10},
         "inputs": {"q": {"type": "random"}, "sm_scale": {"type": "scalar", "value": 0.088}}},
        {"definition": "x", "workload": {"uuid": "b2", "axes": {"batch_size": 1, "num_pages": 4, "len_indptr": 2,
                                                                 "num_kv_indices": 4}, "inputs": {}}},
    ]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    ws = load_workloads(path)
    assert [w.uuid for w in ws] == ["a1", "b2"]
    assert ws[0].inputs["sm_scale"].value == 0.088
    d = Definition.model_validate(FIB_DEFINITION)
    assert d.axis_values(ws[0])["num_qo_heads"] == 32
    bad = Workload(axes={"batch_size": 2, "num_pages": 10, "len_indptr": 5, "num_kv_indices": 10})
    with pytest.raises(TaskError, match="len_indptr == batch_size \\+ 1"):
        d.axis_values(bad)


def test_builtin_selective_scan_shapes_and_cost():
    t = load_task("selective-scan")
    d = t.definition
    assert list(d.inputs) == ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]
    assert list(d.outputs) == ["out", "last_state"]
    w = t.workload("mamba370m-L4096")
    assert d.axis_values(w) == {"batch": 1, "dim": 2048, "dstate": 16, "seqlen": 4096}
    c = d.cost_of(w)
    # every input read once, every output written once: u, delta, z, out (B, D, L) + B, C (B, N, L) + A + 2 D
    # + h0 and last_state (B, D, N)
    assert c.bytes == 4 * (4 * 2048 * 4096 + 2 * 16 * 4096 + 2048 * 16 + 2 * 2048 + 2 * 2048 * 16)
    assert c.transcendentals == 2048 * 4096 * (16 + 3)
    fp16 = load_task("selective-scan-fp16").definition
    assert fp16.inputs["u"].dtype == "float16" and fp16.inputs["A"].dtype == "float32"
    assert fp16.tolerance_for("float16").rtol == 3e-3
    assert [w.name for w in t.workloads][-4:] == [f"mamba370m-L{n}" for n in (512, 1024, 2048, 4096)]


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["inputs"]["u"].update(shape=["batch", "nope"]), "axis 'nope'"),
    (lambda d: d["inputs"]["u"].update(dtype="float13"), "unknown dtype 'float13'"),
    (lambda d: d["axes"].update(batch={"type": "sometimes"}), "axes.batch"),
    (lambda d: d.update(reference="x = 1"), "run"),
    (lambda d: d.update(constraints=["__import__('os')"]), "not allowed|calls"),
    (lambda d: d.pop("outputs"), "outputs"),
])
def test_malformed_definition_names_the_field(tmp_path, mutate, match):
    import yaml

    from ksearch.tasks.loader import _BUILTIN_ROOT

    data = yaml.safe_load((_BUILTIN_ROOT / "selective-scan" / "definition.yaml").read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TaskError, match=match):
        load_definition(path)


def test_unreadable_or_garbled_task_files(tmp_path):
    (tmp_path / "g.json").write_text("{not json")
    with pytest.raises(TaskError, match="not valid JSON"):
        load_definition(tmp_path / "g.json")
    (tmp_path / "l.json").write_text("[1, 2]")
    with pytest.raises(TaskError, match="one object"):
        load_definition(tmp_path / "l.json")
    with pytest.raises(TaskError, match="no task"):
        load_task(tmp_path / "missing.yaml")
    (tmp_path / "w.jsonl").write_text('{"axes": {"batch": "many"}}\n')
    with pytest.raises(TaskError, match="w.jsonl:1"):
        load_workloads(tmp_path / "w.jsonl")


def test_expressions_are_arithmetic_only():
    assert eval_expr("max(a, 2) * b + ceil(c / 2)", {"a": 1, "b": 3, "c": 5}) == 9
    for bad in ("a.__class__", "open('x')", "[x for x in ()]", "lambda: 1"):
        with pytest.raises(TaskError):
            eval_expr(bad, {"a": 1})
    with pytest.raises(TaskError, match="axes"):
        eval_expr("unknown + 1", {"a": 1})


def test_expressions_that_fail_on_their_values_are_task_errors():
    assert eval_expr("2 ** a + a ** 0.5", {"a": 4}) == 18
    for bad in ("a / (a - 1)", "9 ** 9 ** 9", "log2(a - 1)", "ceil()"):  # 9**9**9 would run for minutes
        with pytest.raises(TaskError, match="fails for"):
            eval_expr(bad, {"a": 1})


def _task_dir(tmp_path, extra_workload: dict | None = None, mutate=None):
    """A copy of the built-in selective-scan task, with one more workload line and/or a changed definition."""
    import shutil

    import yaml

    from ksearch.tasks.loader import _BUILTIN_ROOT

    d = tmp_path / "task"
    shutil.copytree(str(_BUILTIN_ROOT / "selective-scan"), d)
    if extra_workload is not None:
        with open(d / "workloads.jsonl", "a") as f:
            f.write(json.dumps(extra_workload) + "\n")
    if mutate is not None:
        data = yaml.safe_load((d / "definition.yaml").read_text())
        mutate(data)
        (d / "definition.yaml").write_text(yaml.safe_dump(data))
    return d


AXES = {"batch": 1, "dim": 4, "dstate": 4, "seqlen": 8}


@pytest.mark.parametrize("workload, match", [
    ({"name": "neg", "axes": {**AXES, "dim": -4}}, "dim=-4; 'selective-scan' allows in \\[1, 4096\\]"),
    ({"name": "big", "axes": {**AXES, "batch": 100000}}, "batch=100000; 'selective-scan' allows in \\[1, 8\\]"),
    ({"name": "tiny", "axes": {**AXES, "dim": 8}}, "two workloads named 'tiny'"),
    ({"name": "typo", "axes": AXES, "inputs": {"uu": {"type": "random"}}}, "gives input 'uu', which"),
    ({"name": "ax", "axes": {**AXES, "seqlne": 9}}, r"gives axis 'seqlne', which 'selective-scan' does not have; "
                                                   r"its axes: \['batch', 'dim', 'dstate', 'seqlen'\]"),
    ({"name": "sc", "axes": AXES, "inputs": {"u": {"type": "scalar", "value": 3}}}, "a scalar for input 'u'"),
    ({"name": "d1", "axes": AXES, "distributions": {"dt": {"kind": "normal"}}}, "distribution for input 'dt', which"),
    ({"name": "d2", "axes": AXES, "distributions": {"delta": {"kind": "integers", "low": 0, "high": 9}}},
     "distribution 'integers' for float32 input 'delta'"),
    ({"name": "d3", "axes": AXES, "distributions": {"delta": {"kind": "normal", "std": -1}}}, "std"),
    ({"name": "d4", "axes": AXES, "distributions": {"delta": {"kind": "cauchy"}}}, "kind"),
    ({"name": "d5", "axes": AXES, "distributions": {"D": {"kind": "uniform", "low": 2, "high": 1}}},
     "low 2.0 > high 1.0"),
    ({"name": "d6", "axes": AXES, "inputs": {"u": {"type": "scalar", "value": 3}},
      "distributions": {"u": {"kind": "normal"}}}, "a scalar for input 'u'|also gives as 'scalar'"),
])
def test_workloads_that_break_the_definition_are_refused_at_load(tmp_path, workload, match):
    with pytest.raises(TaskError, match=match):
        load_task(_task_dir(tmp_path, workload))


def test_definition_ranges_const_axes_and_cost_expressions_are_checked(tmp_path):
    with pytest.raises(TaskError, match="min 9 is above max 8"):
        load_task(_task_dir(tmp_path, mutate=lambda d: d["axes"]["batch"].update(min=9)))
    with pytest.raises(TaskError, match="cost"):
        load_task(_task_dir(tmp_path / "b", mutate=lambda d: d["cost"].update(flops="batch *")))
    with pytest.raises(TaskError, match="flops_on 'tensor_fp16' is not a peak_flops key"):
        load_task(_task_dir(tmp_path / "c", mutate=lambda d: d["cost"].update(flops_on="tensor_fp16")))
    d = Definition.model_validate({**FIB_DEFINITION, "cost": {"flops": "batch_size / (page_size - 1)"}})
    w = Workload(axes={"batch_size": 2, "num_pages": 10, "len_indptr": 3, "num_kv_indices": 10})
    with pytest.raises(TaskError, match="ZeroDivisionError"):
        d.cost_of(w)
    with pytest.raises(TaskError, match="fixes it at 32"):
        d.axis_values(w.model_copy(update={"axes": {**w.axes, "num_qo_heads": 16}}))


def test_a_task_without_workloads_cannot_be_selected_from(tmp_path):
    d = _task_dir(tmp_path)
    (d / "workloads.jsonl").unlink()
    t = load_task(d)
    assert t.workloads == []
    with pytest.raises(TaskError, match="has no workloads"):
        t.select(None)
    with pytest.raises(TaskError, match="has no workloads"):
        load_task(d / "definition.yaml").select(None)


def test_a_workloads_distribution_overrides_the_definitions_for_that_input_only():
    """extreme-dt draws delta from its own normal(0, 40); the other inputs, and every input of a workload
    without ``distributions``, are drawn as the definition says (the same values as before the override
    existed: one stream per input)."""
    import numpy as np

    from ksearch.tasks.inputs import make_inputs

    task = load_task("selective-scan")
    w = task.workload("extreme-dt")
    assert w.distributions["delta"].describe() == "normal(mean 0, std 40)"
    plain = w.model_copy(update={"distributions": {}})
    got, ref = make_inputs(task.definition, w, 5), make_inputs(task.definition, plain, 5)
    assert 35 < float(np.std(got["delta"])) < 45 and float(np.std(ref["delta"])) < 0.6
    for name in task.definition.inputs:
        if name != "delta":
            assert np.array_equal(got[name], ref[name]), name
    # a line without the key loads as before (flashinfer-bench workloads have none)
    assert Workload.model_validate({"axes": AXES}).distributions == {}


def test_a_zeros_distribution_draws_zeros_and_a_workload_can_draw_over_it():
    """selective-scan's h0 defaults to zeros (every workload without an h0 starts from zero); the h0 check
    workloads draw it from a normal; zeros also serves integer inputs and consumes no other input's stream."""
    import numpy as np

    from ksearch.tasks.definition import Distribution
    from ksearch.tasks.inputs import make_inputs

    task = load_task("selective-scan")
    assert task.definition.inputs["h0"].distribution.describe() == "zeros"
    plain = make_inputs(task.definition, task.workload("small-b2"), 7)
    drawn = make_inputs(task.definition, task.workload("h0"), 7)
    assert plain["h0"].dtype == np.float32 and plain["h0"].shape == (2, 64, 16) and not plain["h0"].any()
    assert 0.8 < float(np.std(drawn["h0"])) < 1.2
    assert all(np.array_equal(plain[k], drawn[k]) for k in plain if k != "h0")
    w = task.workload("tiny").model_copy(update={"distributions": {"u": Distribution(kind="zeros")}})
    assert not make_inputs(task.definition, w, 1)["u"].any()
    Distribution(kind="zeros", low=5, high=1)  # low/high mean nothing to zeros
    ints = Definition.model_validate({
        "name": "t", "axes": {"n": {"type": "var"}}, "reference": "def run(i):\n    return i\n",
        "inputs": {"i": {"shape": ["n"], "dtype": "int32", "distribution": {"kind": "zeros"}}},
        "outputs": {"o": {"shape": ["n"], "dtype": "int32"}}})
    got = make_inputs(ints, Workload(axes={"n": 5}, distributions={"i": Distribution(kind="zeros")}), 0)["i"]
    assert got.dtype == np.int32 and not got.any()


@pytest.mark.parametrize("dist", [
    {"kind": "normal", "mean": float("nan")},
    {"kind": "normal", "std": float("inf")},
    {"kind": "uniform", "low": 0, "high": float("inf")},
    {"kind": "uniform", "low": -1.7e308, "high": 1.7e308},  # high - low overflows: numpy's uniform raises
    {"kind": "integers", "low": 0.2, "high": 0.7},  # no integer in [0, 0)
])
def test_a_distribution_that_cannot_draw_finite_values_is_refused_at_load(dist):
    """A NaN/inf parameter made NaN inputs (the judge then blamed the kernel: 'non-finite reference values
    not reproduced') or a traceback from numpy at the first draw; the workload line is refused instead."""
    with pytest.raises(ValueError):
        Workload.model_validate({"axes": AXES, "distributions": {"delta": dist}})

