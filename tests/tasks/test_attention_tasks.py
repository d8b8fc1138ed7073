"""The attention tasks (attention-prefill, attention-prefill-noncausal, their bfloat16 twins attention-prefill-bf16
and attention-prefill-noncausal-bf16, attention-decode): definitions and workloads load; the float64 references
match an independent softmax(QK^T)V with the kv heads repeated; the cost models match hand counts; the cpu naive
kernels pass the judge; every naive kernel passes its target's static checks and the CUDA ones compile with nvcc;
the large-logits workload catches a softmax without the max; the bfloat16 tolerance passes a FlashAttention-style
kernel (P rounded to bf16) with margin and fails wrong ones."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest

from ksearch.eval import static_checks
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.targets import mlx as mlxt
from ksearch.tasks.definition import Workload
from ksearch.tasks.inputs import make_inputs, to_float64
from ksearch.tasks.loader import builtin_names, load_task
from ksearch.tasks.reference import run_reference

PREFILL = ("attention-prefill", "attention-prefill-noncausal")
#: the bfloat16 twins of PREFILL, in the same order
BF16 = ("attention-prefill-bf16", "attention-prefill-noncausal-bf16")
TASKS = PREFILL + ("attention-decode",) + BF16
TARGETS = ("cpu", "cuda", "triton", "mlx-cuda", "mlx-metal")
#: targets with a naive kernel: no MLX for bfloat16 (the MLX runner refuses it: NumPy has no bfloat16 to hand MLX)
NAIVE_TARGETS = {**{t: TARGETS for t in PREFILL + ("attention-decode",)},
                 **{t: ("cpu", "cuda", "triton") for t in BF16}}
FILE = {"cpu": "kernel.c", "cuda": "kernel.cu", "triton": "kernel.py", "mlx-cuda": "kernel.cu",
        "mlx-metal": "kernel.metal"}


def naive(task, target: str, source: str | None = None) -> Candidate:
    return Candidate(target=target, sources={FILE[target]: source or task.naive_sources[target]},
                     launch=task.naive_launch.get(target) or {})


def attention(q, k, v, causal: bool) -> np.ndarray:
    """softmax(q k^T / sqrt(D) [+ causal mask]) v with k, v repeated over the GQA group; q (B, Hq, Lq, D)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.tril(np.ones((lq, lk), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


# -- definitions and workloads ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_tasks_load_with_check_and_bench_workloads_and_a_naive_kernel_per_target(name):
    task = load_task(name)
    assert name in builtin_names()
    assert set(task.naive_sources) == set(NAIVE_TARGETS[name])
    assert set(task.naive_launch) == {"cuda", "mlx-cuda", "mlx-metal"} & set(NAIVE_TARGETS[name])
    checks = [w for w in task.workloads if w.purpose == "check"]
    bench = [w for w in task.workloads if w.purpose == "bench"]
    assert len(checks) >= 6 and len(bench) >= 6
    axes = [task.definition.axis_values(w) for w in checks]
    assert any(a["q_heads"] == a["kv_heads"] for a in axes) and any(a["q_heads"] > a["kv_heads"] for a in axes)
    assert {64, 128} <= {a["head_dim"] for a in axes} and any(a["batch"] > 1 for a in axes)
    assert any(w.distributions for w in checks)
    shapes = {(a["q_heads"], a["kv_heads"], a["head_dim"]) for a in map(task.definition.axis_values, bench)}
    assert {(32, 8, 128), (16, 8, 128)} <= shapes  # Llama-3-8B, Qwen3-0.6B


def test_the_mask_is_a_const_axis_and_the_two_prefill_tasks_differ_only_by_it():
    causal, free = (load_task(n) for n in PREFILL)
    assert causal.definition.axes["causal"].value == 1 and free.definition.axes["causal"].value == 0
    assert "CAUSAL = True" in causal.definition.reference and "CAUSAL = False" in free.definition.reference
    for target in ("cpu", "cuda", "mlx-cuda", "mlx-metal"):  # these receive the axis: one file serves both
        assert causal.naive_sources[target] == free.naive_sources[target]
    assert [w.model_dump(exclude={"uuid"}) for w in causal.workloads] == \
        [w.model_dump(exclude={"uuid"}) for w in free.workloads]


@pytest.mark.parametrize("fp16, bf16", list(zip(PREFILL, BF16)))
def test_the_bf16_tasks_are_the_fp16_ones_with_bfloat16_tensors(fp16, bf16):
    """Same axes, workloads, reference and cost; bfloat16 q, k, v, o, its own tolerance, bf16 tensor-core peak; the
    cpu and cuda naive kernels shared by the pair (the const axis `causal`), the triton one the fp16 task's."""
    a, b = load_task(fp16), load_task(bf16)
    da, db = a.definition, b.definition
    assert {n: x.model_dump(exclude={"description"}) for n, x in da.axes.items()} == \
        {n: x.model_dump(exclude={"description"}) for n, x in db.axes.items()}
    assert da.reference == db.reference and da.constraints == db.constraints
    assert {n: s.dtype for n, s in {**db.inputs, **db.outputs}.items()} == dict.fromkeys("qkvo", "bfloat16")
    assert [s.shape for s in da.inputs.values()] == [s.shape for s in db.inputs.values()]
    assert [w.model_dump(exclude={"uuid"}) for w in a.workloads] == \
        [w.model_dump(exclude={"uuid"}) for w in b.workloads]
    assert da.cost.model_dump(exclude={"flops_on"}) == db.cost.model_dump(exclude={"flops_on"})
    assert (da.cost.flops_on, db.cost.flops_on) == ("tensor_float16", "tensor_bfloat16")
    assert set(db.tolerance) == {"bfloat16"} and db.tolerance_for("bfloat16").rtol <= 0.016
    assert b.naive_sources["triton"] == a.naive_sources["triton"]
    first, second = (load_task(n) for n in BF16)
    for target in ("cpu", "cuda"):
        assert first.naive_sources[target] == second.naive_sources[target]
    assert "uint16_t *q" in b.naive_sources["cpu"] and "__nv_bfloat16 *q" in b.naive_sources["cuda"]


def test_a_workload_that_breaks_gqa_is_refused():
    from ksearch.errors import TaskError

    d = load_task("attention-decode").definition
    with pytest.raises(TaskError, match="q_heads % kv_heads"):
        d.axis_values(Workload(axes={"batch": 1, "q_heads": 6, "kv_heads": 4, "kv_len": 8, "head_dim": 64}))


@pytest.mark.parametrize("name", TASKS)
def test_hidden_workloads_can_be_drawn(name):
    from ksearch.eval.hidden import draw_hidden_workloads

    task = load_task(name)
    for seed in range(5):
        for w in draw_hidden_workloads(task.definition, seed, 4, task.workloads):
            task.definition.check_workload(w)


# -- references ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PREFILL + BF16)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 16), (2, 4, 2, 9, 16), (1, 6, 3, 33, 32), (2, 3, 3, 17, 16)])
def test_prefill_reference_matches_an_independent_attention(name, shape, monkeypatch):
    b, hq, hkv, seqlen, d = shape
    task = load_task(name)
    w = Workload(axes={"batch": b, "q_heads": hq, "kv_heads": hkv, "seqlen": seqlen, "head_dim": d})
    inputs = make_inputs(task.definition, w, seed=7)
    dtype = task.definition.inputs["q"].dtype
    q, k, v = (to_float64(inputs[n], dtype) for n in "qkv")
    if dtype == "bfloat16":  # the judge's inputs are bfloat16 values: float32 with the low 16 bits zero
        assert all(inputs[n].dtype == np.uint16 for n in "qkv")
        assert not (q.astype(np.float32).view(np.uint32) & 0xFFFF).any() and np.abs(q).max() > 1
    want = attention(q, k, v, causal=name in ("attention-prefill", "attention-prefill-bf16"))
    np.testing.assert_allclose(run_reference(task.definition, inputs)["o"], want, rtol=1e-12, atol=1e-12)


def test_prefill_reference_chunks_give_the_same_answer():
    """Chunks of one row (a tiny SCORES_AT_ONCE) and the whole sequence at once agree, causal and not."""
    from ksearch.tasks import reference as ref

    for name in PREFILL + BF16[:1]:
        d = load_task(name).definition
        w = Workload(axes={"batch": 2, "q_heads": 4, "kv_heads": 2, "seqlen": 37, "head_dim": 16})
        inputs = make_inputs(d, w, seed=3)
        whole = run_reference(d, inputs)["o"]
        small = d.model_copy(update={"reference": d.reference.replace("SCORES_AT_ONCE = 1 << 23", "SCORES_AT_ONCE = 5")})
        ref._COMPILED.pop(small.reference, None)
        np.testing.assert_allclose(run_reference(small, inputs)["o"], whole, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 16), (3, 8, 2, 50, 16), (2, 4, 4, 7, 32)])
def test_decode_reference_matches_an_independent_attention(shape):
    b, hq, hkv, kv_len, d = shape
    task = load_task("attention-decode")
    w = Workload(axes={"batch": b, "q_heads": hq, "kv_heads": hkv, "kv_len": kv_len, "head_dim": d})
    inputs = make_inputs(task.definition, w, seed=11)
    q, k, v = (to_float64(inputs[n], "float16") for n in "qkv")
    want = attention(q[:, :, None, :], k, v, causal=False)[:, :, 0, :]
    np.testing.assert_allclose(run_reference(task.definition, inputs)["o"], want, rtol=1e-12, atol=1e-12)


# -- cost models --------------------------------------------------------------------------------------------


def test_cost_models_by_hand():
    axes = {"batch": 2, "q_heads": 32, "kv_heads": 8, "seqlen": 1024, "head_dim": 128}
    causal = load_task("attention-prefill").definition.cost_of(Workload(axes=axes))
    free = load_task("attention-prefill-noncausal").definition.cost_of(Workload(axes=axes))
    # pairs per (b, h): 1024*1024 = 1,048,576 non-causal; 1024*1025/2 = 524,800 causal; 4*128 = 512 FLOP a pair
    assert free.flops == 2 * 32 * 1_048_576 * 512 == 34_359_738_368
    assert causal.flops == 2 * 32 * 524_800 * 512 == 17_196_646_400
    assert free.transcendentals == 2 * 32 * 1_048_576 and causal.transcendentals == 2 * 32 * 524_800
    # q and o: 2*32*1024*128 elements each; k and v: 2*8*1024*128 each; 2 bytes an element
    assert free.bytes == causal.bytes == 2 * (2 * 8_388_608 + 2 * 2_097_152) == 41_943_040
    dec = load_task("attention-decode").definition.cost_of(
        Workload(axes={"batch": 8, "q_heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128}))
    assert dec.flops == 8 * 32 * 4096 * 4 * 128 == 536_870_912 and dec.transcendentals == 8 * 32 * 4096
    # k and v: 8*8*4096*128 = 33,554,432 elements each; q and o: 8*32*128 = 32,768 each
    assert dec.bytes == 2 * (2 * 33_554_432 + 2 * 32_768) == 134_348_800
    for fp16, bf16 in zip(PREFILL, BF16):  # bfloat16 is 2 bytes too: the same counts
        cb, cf = (load_task(n).definition.cost_of(Workload(axes=axes)) for n in (bf16, fp16))
        assert (cb.flops, cb.bytes, cb.transcendentals) == (cf.flops, cf.bytes, cf.transcendentals)


# -- naive kernels: static checks, nvcc ----------------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_every_naive_kernel_passes_its_targets_static_checks(name):
    task = load_task(name)
    for target in NAIVE_TARGETS[name]:
        assert static_checks.check(naive(task, target), static_checks.rules_for(target)) == [], target


@pytest.mark.parametrize("name", TASKS)
def test_the_triton_naive_kernel_compiles_as_python(name):
    from ksearch.targets.triton import TritonTarget

    task = load_task(name)
    built = TritonTarget().compile(naive(task, "triton"), task.definition)
    assert built.ok, built.log


AXES = {"attention-prefill": {"batch": 1, "q_heads": 32, "kv_heads": 8, "seqlen": 4096, "head_dim": 128, "causal": 1},
        "attention-prefill-noncausal": {"batch": 1, "q_heads": 32, "kv_heads": 8, "seqlen": 4096, "head_dim": 128,
                                        "causal": 0},
        "attention-decode": {"batch": 8, "q_heads": 32, "kv_heads": 8, "kv_len": 4096, "head_dim": 128},
        "attention-prefill-bf16": {"batch": 1, "q_heads": 32, "kv_heads": 8, "seqlen": 4096, "head_dim": 128,
                                   "causal": 1}}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["attention-prefill", "attention-decode", "attention-prefill-bf16"])
def test_cuda_and_mlx_cuda_naive_kernels_compile_with_nvcc_for_sm90(name, tmp_path):
    task = load_task(name)
    sources = [task.naive_sources["cuda"]]
    if "mlx-cuda" in task.naive_sources:
        sources.append(mlxt.mlx_cuda_translation_unit(naive(task, "mlx-cuda"), task.definition, AXES[name]))
    for i, src in enumerate(sources):
        path = tmp_path / f"k{i}.cu"
        path.write_text(src)
        proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(path), "-o", str(tmp_path / f"k{i}.cubin")],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]


# -- the judge on the cpu naive kernels ----------------------------------------------------------------------


def _evaluate(task, source: str, workloads: list[str], seeds=(1,)):
    from ksearch.eval.evaluator import EvalConfig, Evaluator

    ev = Evaluator(task, "cpu", None, EvalConfig(seeds=list(seeds), stop_on_failure=False))
    try:
        return ev.evaluate(Candidate(target="cpu", sources={"kernel.c": source}),
                           [task.workload(n) for n in workloads], timing=False)
    finally:
        ev.data.close()


FAST = {"attention-prefill": ["tiny-L1", "mha-odd", "gqa-d128", "gqa-b3", "d80", "large-logits"],
        "attention-prefill-noncausal": ["tiny-L1", "mha-odd", "gqa-b3", "d80", "large-logits"],
        "attention-decode": ["tiny-L1", "mha", "gqa-d128", "odd-b7", "d80", "large-logits"],
        "attention-prefill-bf16": ["tiny-L1", "mha-odd", "gqa-d128", "gqa-b3", "d80", "large-logits"],
        "attention-prefill-noncausal-bf16": ["tiny-L1", "mha-odd", "gqa-b3", "d80", "large-logits"]}


@pytest.mark.parametrize("name", TASKS)
def test_the_cpu_naive_kernel_passes_the_judge(name):
    task = load_task(name)
    ev = _evaluate(task, task.naive_sources["cpu"], FAST[name])
    assert [r.status for r in ev.workloads] == [Status.PASSED] * len(FAST[name]), [r.message for r in ev.workloads]


@pytest.mark.slow
@pytest.mark.parametrize("name", TASKS)
def test_the_cpu_naive_kernel_passes_every_check_workload_on_three_seeds(name):
    task = load_task(name)
    checks = [w.name for w in task.workloads if w.purpose == "check"]
    ev = _evaluate(task, task.naive_sources["cpu"], checks, seeds=(1, 2, 3))
    assert all(r.status is Status.PASSED for r in ev.workloads), [r.message for r in ev.workloads]


@pytest.mark.parametrize("name", ["attention-prefill", "attention-decode", "attention-prefill-bf16"])
def test_a_softmax_without_the_max_fails_only_on_the_large_logits_workload(name):
    """exp(s) without subtracting the row max overflows fp32 once logits pass ~88: q, k ~ normal(0, 8) give
    logits of std 64. The ordinary workloads (logits of std 1) let such a kernel pass."""
    task = load_task(name)
    src = task.naive_sources["cpu"].replace("expf(s[j] - m)", "expf(s[j])")
    assert src != task.naive_sources["cpu"]
    ordinary = [n for n in FAST[name] if n != "large-logits"][:3]
    ev = _evaluate(task, src, ordinary + ["large-logits"])
    assert [r.status for r in ev.workloads] == [Status.PASSED] * 3 + [Status.INCORRECT_NUMERICAL], \
        [r.message for r in ev.workloads]


# -- the bfloat16 tolerance ----------------------------------------------------------------------------------


def _bf16(x) -> np.ndarray:
    """Round to bfloat16 (nearest even) and back to float64."""
    from ksearch.tasks.inputs import bf16_from_f32

    return to_float64(bf16_from_f32(np.asarray(x, np.float32)), "bfloat16")


def flash_bf16(q, k, v, causal: bool, mask_shift: int = 0, kv_head_mod: bool = False, scale=None,
               round_scores: bool = False) -> np.ndarray:
    """A FlashAttention-style bf16 kernel emulated in NumPy: fp32 scores, P = exp(s - max) rounded to bfloat16
    (nearest even) for the PV product, the exp sum l from the unrounded P, o rounded to bfloat16. The keyword
    arguments make it wrong: the causal mask shifted (None: no mask), query head h reading kv head h % kv_heads,
    another scale, scores rounded to bfloat16 before the softmax."""
    hq, hkv, seqlen, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    idx = np.arange(hq) % hkv if kv_head_mod else np.arange(hq) // (hq // hkv)
    k, v = k[:, idx], v[:, idx]
    s = (q.astype(np.float32) @ k.astype(np.float32).transpose(0, 1, 3, 2)).astype(np.float64)
    s *= scale or 1.0 / np.sqrt(d)
    if round_scores:
        s = _bf16(s)
    if causal and mask_shift is not None:
        s = np.where(np.tril(np.ones((seqlen, seqlen), bool), mask_shift), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return _bf16((_bf16(p) @ v) / p.sum(axis=-1, keepdims=True))


def _bf16_case(name: str, workload: str, seed: int):
    task = load_task(name)
    inputs = make_inputs(task.definition, task.workload(workload), seed)
    q, k, v = (to_float64(inputs[n], "bfloat16") for n in "qkv")
    return task, (q, k, v), run_reference(task.definition, inputs)["o"]


@pytest.mark.parametrize("name", BF16)
def test_bf16_tolerance_passes_a_kernel_that_rounds_p_to_bf16_with_margin(name):
    """On every check workload, seeds 1 and 2: the emulated FlashAttention kernel stays within half the tolerance's
    rtol and 60% of its atol (its worst absolute excess over rtol|ref|, 0.0038, is at the few-key rows of mqa-d128)."""
    from ksearch.eval.compare import compare
    from ksearch.tasks.definition import Tolerance

    tol = load_task(name).definition.tolerance_for("bfloat16")
    tight = Tolerance(rtol=tol.rtol / 2, atol=0.6 * tol.atol)
    for w in [w.name for w in load_task(name).workloads if w.purpose == "check"]:
        for seed in (1, 2):
            _, (q, k, v), ref = _bf16_case(name, w, seed)
            status, max_abs, _, msg = compare(flash_bf16(q, k, v, causal=name == BF16[0]), ref, tight)
            assert status is Status.PASSED, (w, seed, max_abs, msg)


@pytest.mark.parametrize("wrong, workload", [
    ({"mask_shift": None}, "mha-odd"), ({"mask_shift": 1}, "gqa-d128"), ({"kv_head_mod": True}, "gqa-d128"),
    ({"scale": 1.0 / 128}, "mqa-d128"), ({"round_scores": True}, "large-logits")], ids=str)
def test_bf16_tolerance_fails_wrong_kernels(wrong, workload):
    """No causal mask, the mask off by one key, the wrong kv head, scale 1/head_dim, scores rounded to bfloat16
    before the softmax (caught on large-logits only: logits of std 64 lose ~0.25 to the rounding)."""
    from ksearch.eval.compare import compare

    task, (q, k, v), ref = _bf16_case(BF16[0], workload, 1)
    status, max_abs, _, _ = compare(flash_bf16(q, k, v, causal=True, **wrong), ref,
                                    task.definition.tolerance_for("bfloat16"))
    assert status is Status.INCORRECT_NUMERICAL and max_abs > 0.1, max_abs


@pytest.mark.parametrize("broken", [("causal ? i + 1 : seqlen", "seqlen"), ("h / group", "h % kv_heads")],
                         ids=["no-causal-mask", "wrong-kv-head"])
def test_the_judge_fails_a_wrong_bf16_cpu_kernel(broken):
    task = load_task("attention-prefill-bf16")
    src = task.naive_sources["cpu"].replace(*broken)
    assert src != task.naive_sources["cpu"]
    ev = _evaluate(task, src, ["gqa-d128"])
    assert ev.workloads[0].status is Status.INCORRECT_NUMERICAL, ev.workloads[0].message


@pytest.mark.parametrize("name, workload", [("attention-prefill", "mha-odd"), ("attention-prefill-noncausal", "mha-odd"),
                                            ("attention-prefill-bf16", "gqa-b3"), ("attention-decode", "odd-b7")])
def test_torch_sdpa_baseline_passes_its_check_and_follows_the_causal_axis(name, workload):
    pytest.importorskip("torch", reason="torch not installed")
    _passes_and_follows_the_causal_axis("torch-sdpa", name, workload, "cpu", "cpu")


def _passes_and_follows_the_causal_axis(baseline: str, name: str, workload: str, target: str, flipped_target: str):
    """The baseline passes the task's check, and the same file with the other mask (the const axis flipped)
    fails it."""
    from ksearch.eval.baselines import time_baseline
    from ksearch.records import Status

    task = load_task(name)
    once = TimingPlan(min_repeats=1, max_repeats=1, min_time_s=0)
    assert time_baseline(task, baseline, workload, seed=5, plan=once, target=target).status is Status.PASSED
    if "causal" in task.definition.axes:
        axes = dict(task.definition.axes)
        axes["causal"] = axes["causal"].model_copy(update={"value": 1 - axes["causal"].value})
        flipped = dataclasses.replace(task, definition=task.definition.model_copy(update={"axes": axes}))
        r = time_baseline(flipped, baseline, workload, seed=5, plan=once, target=flipped_target)
        assert r.status is Status.INCORRECT_NUMERICAL


def test_torch_sdpa_baseline_without_torch_is_unavailable_and_a_run_goes_on(monkeypatch):
    import sys

    from ksearch.errors import BaselineUnavailable
    from ksearch.eval.baselines import time_baseline

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setitem(sys.modules, "torch.nn.functional", None)
    with pytest.raises(BaselineUnavailable, match="torch is not installed"):
        time_baseline(load_task("attention-decode"), "torch-sdpa", "tiny-L1")


def test_torch_sdpa_baseline_runs_where_the_run_targets():
    torch = pytest.importorskip("torch", reason="torch not installed")
    from ksearch.errors import BaselineUnavailable
    from ksearch.eval.baselines import load_baseline_module

    task = load_task("attention-decode")
    assert load_baseline_module(task, "torch-sdpa", "cpu")["_device"]() == "cpu"  # a cpu run: CPU SDPA, GPU or not
    gpu = load_baseline_module(task, "torch-sdpa", "triton")["_device"]
    if torch.cuda.is_available():
        assert gpu() == "cuda"
    else:
        with pytest.raises(BaselineUnavailable, match="no CUDA device"):
            gpu()


@pytest.mark.parametrize("name, workload", [("attention-prefill", "mha-odd"), ("attention-prefill-noncausal", "mha-odd"),
                                            ("attention-decode", "odd-b7")])
def test_mlx_sdpa_baseline_passes_its_check_and_follows_the_causal_axis(name, workload):
    """mx.fast.scaled_dot_product_attention in an MLX run (here MLX's CPU device where mlx is installed)."""
    pytest.importorskip("mlx.core", reason="mlx not installed")
    _passes_and_follows_the_causal_axis("mlx-sdpa", name, workload, "mlx-metal", "mlx-cuda")


def test_mlx_sdpa_baseline_is_for_mlx_runs_and_needs_mlx(monkeypatch):
    """Other runs fall through to torch-sdpa (the first baseline that can run is timed); without mlx it is
    unavailable, with the reason."""
    import sys

    from ksearch.errors import BaselineUnavailable
    from ksearch.eval.baselines import time_baseline

    task = load_task("attention-decode")
    assert list(task.baseline_sources) == ["mlx-sdpa", "torch-sdpa"]
    with pytest.raises(BaselineUnavailable, match="only in runs on an MLX target"):
        time_baseline(task, "mlx-sdpa", "tiny-L1", target="cuda")
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    with pytest.raises(BaselineUnavailable, match="mlx is not installed"):
        time_baseline(task, "mlx-sdpa", "tiny-L1", target="mlx-metal")
