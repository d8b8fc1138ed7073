"""flashinfer-bench inputs: the dataset layout, workloads found beside a definition, labels, tolerance rule, paged
index arrays, data constraints, safetensors, float8 and uint8, dict references, `ksearch tasks import`
(ksearch.tasks.flashinfer, importers, structured, inputs, fp8, safetensors_io; eval.compare)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ksearch.errors import TaskError
from ksearch.records import Candidate, Status
from ksearch.tasks import load_task
from ksearch.tasks.definition import Definition, Tolerance, Workload
from ksearch.tasks.inputs import make_inputs
from tests.tasks import fib_kernels as K

ROOT = Path(__file__).parents[1] / "fixtures" / "flashinfer_trace"
GQA = "gqa_paged_decode_h32_kv8_d128_ps1"
MLA = "mla_paged_decode_h16_ckv512_kpe64_ps1"
MOE = "moe_fp8_softmax_topk2_e4_h64_i32"
#: DeepSeek-V3's fused MoE at its real size: loaded and checked, not judged (its weights alone are 1.4 GB)
MOE_DS = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"
#: definition -> (naive cpu kernel, workloads to judge it on: None for all)
JUDGED = {"gemm_n4096_k4096": (K.GEMM, ["M=1"]), "rmsnorm_h4096": (K.RMSNORM, None), GQA: (K.GQA_DECODE, None),
          MLA: (K.MLA_DECODE, None), MOE: (K.MOE_FP8, None)}


def _evaluate(task, source: str, names=None, seeds=(1,)):
    from ksearch.eval.evaluator import EvalConfig, Evaluator

    ev = Evaluator(task, "cpu", None, EvalConfig(seeds=list(seeds), stop_on_failure=False))
    try:
        return ev.evaluate(Candidate(target="cpu", sources={"kernel.c": source}), task.select(names), timing=False)
    finally:
        ev.data.close()


@pytest.mark.parametrize("name", sorted(JUDGED) + [MOE_DS])
def test_a_dataset_definition_loads_by_root_and_name_with_its_workloads(name):
    task = load_task(f"{ROOT}/{name}")
    assert task.name == name and task.workloads
    assert all(w.name for w in task.workloads)  # unnamed lines get a readable label -w selects
    assert task.workload(task.workloads[0].name) is task.workloads[0]
    tol = task.definition.tolerance_for(next(iter(task.definition.outputs.values())).dtype)
    ratio = 0.95 if task.definition.op_type == "moe" else 1.0  # flashinfer-bench's eval_config.yaml
    assert (tol.rule, tol.atol, tol.rtol, tol.matched_ratio) == ("either", 1e-2, 1e-2, ratio)


def test_the_deepseek_moe_definition_keeps_its_fp8_inputs_and_sizes():
    task = load_task(f"{ROOT}/{MOE_DS}")
    d = task.definition
    assert [s.dtype for n, s in d.inputs.items() if "weights" in n] == ["float8_e4m3fn", "float32"] * 2
    assert [w.name for w in task.workloads] == ["seq_len=1", "seq_len=7"]
    assert d.cost_of(task.workloads[0]).bytes > 1.4e9  # the fp8 weights of 32 experts, read once


@pytest.mark.parametrize("name", sorted(JUDGED))
def test_a_naive_kernel_passes_the_judge_on_each_definition(name):
    pytest.importorskip("torch", reason="flashinfer-bench references are PyTorch")
    source, names = JUDGED[name]
    ev = _evaluate(load_task(f"{ROOT}/{name}"), source, names)
    assert ev.status is Status.PASSED, [w.message for w in ev.workloads]


def test_a_wrong_kernel_fails_on_a_paged_definition_and_on_the_moe():
    pytest.importorskip("torch", reason="flashinfer-bench references are PyTorch")
    wrong = K.GQA_DECODE.replace("s[j] = dot * (float)sm_scale;", "s[j] = dot;")
    assert _evaluate(load_task(f"{ROOT}/{GQA}"), wrong).status is Status.INCORRECT_NUMERICAL
    unnormalised = K.MOE_FP8.replace("{pa / (pa + pb), pb / (pa + pb)}", "{pa, pb}")
    ev = _evaluate(load_task(f"{ROOT}/{MOE}"), unnormalised)
    assert ev.status is Status.INCORRECT_NUMERICAL and "0.05 share allowed" in ev.workloads[0].message


def test_workload_labels_are_the_axis_values_that_differ_and_hold_no_comma():
    task = load_task(f"{ROOT}/gemm_n4096_k4096")
    assert [w.name for w in task.workloads[:3]] == ["M=256", "M=248", "M=240"] and len(task.workloads) == 43
    assert [w.name for w in load_task(f"{ROOT}/{GQA}").workloads] == ["num_kv_indices=6", "num_kv_indices=7"]
    assert [w.name for w in load_task(f"{ROOT}/{MLA}").workloads] == [
        "batch_size=3+num_pages=12+len_indptr=4+num_kv_indices=9"]  # -w splits on commas: none in a label


def test_a_definition_file_finds_its_workloads_in_the_dataset_layout_and_beside_it(tmp_path):
    direct = load_task(ROOT / "definitions" / "rmsnorm" / "rmsnorm_h4096.json")
    assert [w.name for w in direct.workloads] == ["batch_size=1", "batch_size=7"]
    shutil.copy(ROOT / "definitions" / "rmsnorm" / "rmsnorm_h4096.json", tmp_path / "d.json")
    assert load_task(tmp_path / "d.json").workloads == []
    (tmp_path / "d.jsonl").write_text(json.dumps({"axes": {"batch_size": 3}, "uuid": "u-1"}) + "\n")
    assert [w.name for w in load_task(tmp_path / "d.json").workloads] == ["batch_size=3"]
    given = tmp_path / "other.jsonl"
    given.write_text(json.dumps({"axes": {"batch_size": 5}, "uuid": "u-2", "inputs": {}}) + "\n")
    assert [w.axes for w in load_task(tmp_path / "d.json", workloads=given).workloads] == [{"batch_size": 5}]


def test_a_dataset_root_alone_or_an_unknown_name_is_a_clear_error():
    with pytest.raises(TaskError, match="flashinfer-bench dataset: name one of its definitions.*rmsnorm_h4096"):
        load_task(ROOT)
    with pytest.raises(TaskError, match="has no definition 'rmsnorm_h9'.*rmsnorm_h4096"):
        load_task(f"{ROOT}/rmsnorm_h9")


def test_equal_axes_get_the_uuid_prefix_in_their_label(tmp_path):
    shutil.copy(ROOT / "definitions" / "rmsnorm" / "rmsnorm_h4096.json", tmp_path / "d.json")
    lines = [{"axes": {"batch_size": 2}, "uuid": "aaaaaaaa-1"}, {"axes": {"batch_size": 2}, "uuid": "bbbbbbbb-2"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [w.name for w in load_task(tmp_path / "d.json").workloads] == ["batch_size=2@aaaaaaaa",
                                                                          "batch_size=2@bbbbbbbb"]


# -- index arrays and data constraints ---------------------------------------------------------------

PAGED = {
    "name": "paged_lpl", "op_type": "gqa_paged",
    "axes": {"batch_size": {"type": "var"}, "len_indptr": {"type": "var"}, "num_kv_indices": {"type": "var"},
             "num_pages": {"type": "var"}, "page_size": {"type": "const", "value": 4},
             "total_q": {"type": "var"}},
    "constraints": ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()",
                    "total_q == qo_indptr[-1].item()"],
    "inputs": {"qo_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32"},
               "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32"},
               "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32"}},
    "outputs": {"o": {"shape": ["batch_size"], "dtype": "float32"}},
    "reference": "def run(qo_indptr, kv_indptr, kv_indices, kv_last_page_len):\n    return kv_last_page_len\n",
}


@pytest.mark.parametrize("seed", range(20))
def test_paged_index_arrays_are_consistent(seed):
    d = Definition.model_validate(PAGED)
    w = Workload(axes={"batch_size": 5, "len_indptr": 6, "num_kv_indices": 9, "num_pages": 11, "total_q": 7})
    x = make_inputs(d, w, seed)
    for name, total in (("kv_indptr", 9), ("qo_indptr", 7)):
        assert x[name][0] == 0 and x[name][-1] == total and (np.diff(x[name]) >= 1).all(), x[name]
    assert ((0 <= x["kv_indices"]) & (x["kv_indices"] < 11)).all() and len(set(x["kv_indices"])) == 9
    assert ((1 <= x["kv_last_page_len"]) & (x["kv_last_page_len"] <= 4)).all()
    keys = (np.diff(x["kv_indptr"]) - 1) * 4 + x["kv_last_page_len"]
    assert (np.diff(x["qo_indptr"]) <= keys).all()  # causal prefill: no sequence has more queries than keys


def test_a_data_constraint_is_checked_on_the_inputs_not_refused(tmp_path):
    d = Definition.model_validate(PAGED)
    assert d.data_constraints == PAGED["constraints"][1:] and d.axis_constraints == PAGED["constraints"][:1]
    from safetensors.numpy import save_file

    save_file({"p": np.array([0, 2, 3, 5, 6, 8], np.int32)}, tmp_path / "b.safetensors")
    w = Workload(axes={"batch_size": 5, "len_indptr": 6, "num_kv_indices": 9, "num_pages": 11, "total_q": 7},
                 inputs={"kv_indptr": {"type": "safetensors", "path": str(tmp_path / "b.safetensors"),
                                       "tensor_key": "p"}})
    with pytest.raises(TaskError, match=r"breaks constraint 'num_kv_indices == kv_indptr\[-1\].item\(\)'"):
        make_inputs(d, w, 0)
    with pytest.raises(ValueError, match="reads .__class__"):
        Definition.model_validate({**PAGED, "constraints": ["kv_indptr.__class__ == 1"]})
    torchish = Definition.model_validate({**PAGED, "constraints": ["kv_indices.numel() == kv_indptr[-1].item()",
                                                                   "kv_indptr.dim() == 1"]})
    make_inputs(torchish, Workload(axes=w.axes), 0)  # torch's numel() and dim() answered on the drawn arrays
    with pytest.raises(ValueError, match="reads 'nothere', which is neither an axis nor an input"):  # at load
        Definition.model_validate({**PAGED, "constraints": ["num_kv_indices == kv_indptr[-1].item() + nothere"]})


def test_constraints_null_is_no_constraint():
    assert Definition.model_validate({**PAGED, "constraints": None}).constraints == []


def test_safetensors_inputs_that_do_not_fit_are_clear_errors(tmp_path):
    from safetensors.numpy import save_file

    save_file({"p": np.arange(6, dtype=np.int64)}, tmp_path / "b.safetensors")
    d = Definition.model_validate({**PAGED, "constraints": []})
    axes = {"batch_size": 5, "len_indptr": 6, "num_kv_indices": 9, "num_pages": 11, "total_q": 7}
    for key, match in (("q", "has no tensor 'q'"), ("p", "is I64, the definition says int32")):
        w = Workload(axes=axes, inputs={"kv_indptr": {"type": "safetensors", "path": str(tmp_path / "b.safetensors"),
                                                      "tensor_key": key}})
        with pytest.raises(TaskError, match=match):
            make_inputs(d, w, 0)
    (tmp_path / "bad.safetensors").write_bytes(b"nonsense")
    w = Workload(axes=axes, inputs={"kv_indptr": {"type": "safetensors", "path": str(tmp_path / "bad.safetensors"),
                                                  "tensor_key": "p"}})
    with pytest.raises(TaskError, match="not a safetensors file"):
        make_inputs(d, w, 0)


# -- dtypes and references -----------------------------------------------------------------------

FP8 = {
    "name": "fp8_scale", "op_type": "moe",
    "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float8_e4m3fn"}, "y": {"shape": ["n"], "dtype": "float8_e5m2"},
               "m": {"shape": ["n"], "dtype": "uint8"}, "s": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["n"], "dtype": "float32"}, "mask": {"shape": ["n"], "dtype": "int32"}},
    "reference": "import torch\n\ndef run(x, y, m, s):\n"
                 "    assert x.dtype == torch.float8_e4m3fn and y.dtype == torch.float8_e5m2 and m.dtype == torch.uint8\n"
                 "    return {'mask': (m > 50).to(torch.int32), 'out': (x.float() + y.float()) * s}\n",
}


def test_float8_and_uint8_inputs_reach_a_torch_reference_and_it_may_return_a_dict():
    torch = pytest.importorskip("torch", reason="the reference is PyTorch")
    from ksearch.tasks import fp8
    from ksearch.tasks.reference import run_reference

    d = Definition.model_validate(FP8)
    x = make_inputs(d, Workload(axes={"n": 64}, inputs={"s": {"type": "scalar", "value": 2.0}}), 3)
    assert x["x"].dtype == np.uint8 and x["m"].dtype == np.uint8 and x["m"].max() < 100
    out = run_reference(d, x)
    want = (fp8.decode(x["x"], "float8_e4m3fn") + fp8.decode(x["y"], "float8_e5m2")) * 2
    np.testing.assert_allclose(out["out"], want.astype(np.float32), rtol=1e-6)
    assert (out["mask"] == (x["m"] > 50)).all()
    vals = np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 100
    for dt, tdt in (("float8_e4m3fn", torch.float8_e4m3fn), ("float8_e5m2", torch.float8_e5m2)):
        assert (fp8.encode(vals, dt) == torch.from_numpy(vals).to(tdt).view(torch.uint8).numpy()).all()
    missing = {**FP8, "reference": FP8["reference"].replace("'mask'", "'mask2'")}
    with pytest.raises(TaskError, match=r"returned a dict without outputs \['mask'\]"):
        run_reference(Definition.model_validate(missing), x)


E5M2_OUT = {
    "name": "to_e5m2", "op_type": "quantize", "axes": {"n": {"type": "var"}},
    "inputs": {"x": {"shape": ["n"], "dtype": "float16"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "float8_e5m2"}},
    "reference": "import torch\n\ndef run(x):\n    return x.to(torch.float8_e5m2)\n",
}
#: float16 -> float8_e5m2 is float16's top byte, rounded to nearest even (finite inputs)
E5M2_KERNEL = """#include <stdint.h>
#include <string.h>
void run(const _Float16 *x, uint8_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h; memcpy(&h, &x[i], 2);
        h += 0x7f + ((h >> 8) & 1);
        y[i] = (uint8_t)(h >> 8);
    }
}
"""


def test_a_float8_output_is_decoded_before_it_is_compared():
    pytest.importorskip("torch", reason="the reference is PyTorch")
    from ksearch.tasks.loader import Task

    task = Task(Definition.model_validate(E5M2_OUT), [Workload(name="n100", axes={"n": 100})])
    assert _evaluate(task, E5M2_KERNEL).status is Status.PASSED
    assert _evaluate(task, E5M2_KERNEL.replace("y[i] = ", "y[i] = 1 + ")).status is Status.INCORRECT_NUMERICAL


def test_flashinfer_bench_tolerance_rule_and_matched_ratio():
    from ksearch.eval.compare import compare
    from ksearch.tasks.flashinfer import fib_tolerance

    want = np.array([1000.0, 0.0, 1.0, 1.0])
    either = Tolerance(atol=1e-2, rtol=1e-2, rule="either")
    assert compare(want + [9.0, 0.01, 0.0, 0.0], want, either)[0] is Status.PASSED  # 9 <= 1% of 1000
    assert compare(want + [0.0, 0.02, 0.0, 0.0], want, either)[0] is Status.INCORRECT_NUMERICAL
    ratio = Tolerance(atol=1e-2, rtol=1e-2, rule="either", matched_ratio=0.75)
    assert compare(want + [0.0, 0.5, 0.0, 0.0], want, ratio, errors=False)[0] is Status.PASSED
    status, _, _, msg = compare(want + [0.0, 0.5, 0.5, 0.0], want, ratio)
    assert status is Status.INCORRECT_NUMERICAL and "0.25 share allowed" in msg
    assert compare(want + [0.0, np.nan, 0.0, 0.0], want, ratio)[0] is Status.INCORRECT_NUMERICAL  # NaN never
    assert fib_tolerance(Definition.model_validate(FP8)).matched_ratio == 0.95  # op_type moe


# -- import ------------------------------------------------------------------------------------------

def test_tasks_import_writes_a_folder_that_loads_back_with_its_blobs(tmp_path):
    from ksearch.tasks.importers import write_task_dir

    task = load_task(f"{ROOT}/{GQA}")
    out = write_task_dir(task, tmp_path / "gqa")
    back = load_task(out)
    assert back.definition.model_dump() == task.definition.model_dump()
    assert [w.name for w in back.workloads] == [w.name for w in task.workloads]
    blob = back.workloads[1].inputs["kv_indptr"]
    assert Path(blob.path).parent == (out / "blob").resolve()
    a, b = make_inputs(task.definition, task.workloads[1], 4), make_inputs(back.definition, back.workloads[1], 4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(TaskError, match="is not empty"):
        write_task_dir(task, out)


def test_cli_tasks_show_import_and_run_without_a_pack(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ksearch.cli import app

    runner = CliRunner()
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"axes": {"batch_size": 9}, "uuid": "x"}) + "\n")
    r = runner.invoke(app, ["tasks", "show", f"{ROOT}/rmsnorm_h4096", "--workloads-file", str(wl), "--json"])
    assert r.exit_code == 0, r.output
    assert [w["axes"] for w in json.loads(r.output)["workloads"]] == [{"batch_size": 9}]
    folder = tmp_path / "my task"  # the command it suggests quotes the path for the shell
    r = runner.invoke(app, ["tasks", "import", f"{ROOT}/rmsnorm_h4096", "-o", str(folder)])
    assert r.exit_code == 0, r.output
    (folder / "naive.cpu.c").write_text(K.RMSNORM)
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    r = runner.invoke(app, ["run", str(folder), "--budget", "1"])
    assert r.exit_code == 2 and "--model MODEL" in r.output and "no knowledge pack" in r.output, r.output
    assert f"ksearch run '{folder}' --target" in r.output, r.output


def test_safetensors_bfloat16_and_float8_tensors_come_back_as_their_bits(tmp_path):
    torch = pytest.importorskip("torch", reason="torch writes the bfloat16 and float8 tensors")
    from safetensors.torch import save_file

    from ksearch.tasks.safetensors_io import read_tensor

    a = torch.randn(3, 5).to(torch.bfloat16)
    b = torch.randn(7).to(torch.float8_e4m3fn)
    save_file({"a": a, "b": b}, str(tmp_path / "t.safetensors"))
    got = read_tensor(str(tmp_path / "t.safetensors"), "a", "bfloat16", (3, 5), "a")
    assert got.dtype == np.uint16 and (got == a.view(torch.int16).numpy().view(np.uint16)).all()
    got = read_tensor(str(tmp_path / "t.safetensors"), "b", "float8_e4m3fn", (7,), "b")
    assert (got == b.view(torch.uint8).numpy()).all()
    with pytest.raises(TaskError, match=r"has shape \[7\], the workload's axes give \[8\]"):
        read_tensor(str(tmp_path / "t.safetensors"), "b", "float8_e4m3fn", (8,), "b")


def test_workloads_option_takes_a_file_or_names(tmp_path):
    from ksearch.cli.options import workloads_args

    f = tmp_path / "w.jsonl"
    f.write_text("")
    assert workloads_args(str(f), "") == (None, str(f))
    assert workloads_args("M=1, M=2", "") == (["M=1", "M=2"], None)
    assert workloads_args("M=1", "x.jsonl") == (["M=1"], "x.jsonl")


def test_an_unknown_source_kind_or_path_is_a_clear_error(tmp_path):
    from ksearch.tasks.importers import import_task

    with pytest.raises(TaskError, match="unknown task source kind 'nope'; known: .*flashinfer-bench"):
        import_task(ROOT, kind="nope")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(TaskError, match="not a task ksearch can import; it reads: .*flashinfer-bench"):
        import_task(tmp_path / "x.txt")


@pytest.mark.slow
def test_a_run_keeps_its_workloads_file_absolute_for_resume(tmp_path, monkeypatch):
    from ksearch.llm.settings import LLMSettings
    from ksearch.run.controller import RunConfig, run_config
    from ksearch.run.session import Session

    (tmp_path / "w.jsonl").write_text(json.dumps({"axes": {"batch_size": 3}, "uuid": "zz"}) + "\n")
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig(task=f"{ROOT}/rmsnorm_h4096", target="null", proposer="llm", workloads_file="w.jsonl",
                    llm=LLMSettings(backend="queue", queue_dir=str(tmp_path / "q")), budget=1)
    with Session.create(cfg) as s:  # nothing is asked of the model before the search runs
        assert [w.name for w in s.task.workloads] == ["batch_size=3"]
        assert run_config(s.store).workloads_file == str(tmp_path / "w.jsonl")


#: a definition as FlashInfer's own trace dumper writes one (ksearch's look-alike, not a copy): the reference named
#: `_<op>_reference`, an index array set at plan() time with dtype "unknown" and "optional", and an `init` that builds
#: FlashInfer's API arguments (here it would stop the process: it must never run)
TRACE_DUMP = {
    "name": "segment_sum_h8", "op_type": "segment_sum", "tags": ["fi_api:flashinfer.example.segment_sum"],
    "axes": {"batch_size": {"type": "var"}, "len_indptr": {"type": "var"}, "total": {"type": "var"},
             "hidden": {"type": "const", "value": 8}},
    "constraints": ["len_indptr == batch_size + 1", "total == indptr[-1].item()"],
    "inputs": {"x": {"shape": ["total", "hidden"], "dtype": "float32"},
               "indptr": {"shape": ["len_indptr"], "dtype": "unknown", "optional": True,
                          "description": "Set during plan(), not run()."}},
    "outputs": {"out": {"shape": ["batch_size", "hidden"], "dtype": "float32"}},
    "reference": "import torch\n\n@torch.no_grad()\ndef _segment_sum_reference(x, indptr):\n"
                 "    return torch.stack([x[indptr[b]:indptr[b + 1]].sum(0) for b in range(len(indptr) - 1)])\n",
    "init": "import sys\n\ndef _segment_sum_init(*, batch_size, device='cuda', seed=0):\n    sys.exit(9)\n",
}


def test_flashinfer_trace_dumps_load_with_each_field_read_for_what_it_means(tmp_path):
    pytest.importorskip("torch", reason="the dumper's references are PyTorch")
    from ksearch.tasks.reference import run_reference

    path = tmp_path / "segment_sum_h8.json"
    path.write_text(json.dumps(TRACE_DUMP))
    (tmp_path / "segment_sum_h8.jsonl").write_text('{"axes": {"batch_size": 3, "len_indptr": 4, "total": 9}}\n')
    task = load_task(path)
    d = task.definition
    assert d.inputs["indptr"].dtype == "int32"  # the dtype FlashInfer's plan() takes index arrays in
    assert d.model_extra["init"] == TRACE_DUMP["init"] and d.inputs["indptr"].model_extra == {"optional": True}
    inputs = make_inputs(d, task.workloads[0], 5)  # drawn from the shapes, the indptr consistent; `init` never runs
    ind = inputs["indptr"]
    assert ind[0] == 0 and ind[-1] == 9 and (np.diff(ind) >= 0).all()
    want = np.stack([inputs["x"][ind[b]:ind[b + 1]].sum(0) for b in range(3)])
    np.testing.assert_allclose(run_reference(d, inputs)["out"], want, rtol=1e-6)
    bad = json.loads(json.dumps(TRACE_DUMP))
    bad["inputs"]["x"]["dtype"] = "unknown"
    path.write_text(json.dumps(bad))
    with pytest.raises(TaskError, match=r"input 'x' has dtype \"unknown\" \(FlashInfer's trace dumper .*give its dtype"):
        load_task(path)
    inplace = json.loads(json.dumps(TRACE_DUMP))
    inplace["outputs"]["x"] = inplace["inputs"]["x"]
    path.write_text(json.dumps(inplace))
    with pytest.raises(TaskError, match=r"both an input and an output: \['x'\] \(an in-place update"):
        load_task(path)
