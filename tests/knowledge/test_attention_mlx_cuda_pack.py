"""The attention mlx-cuda packs (prefill, causal and non-causal; decode): the cuda packs' kernels as MLX custom CUDA
kernel bodies. Without a GPU or MLX: every single move from a family's root renders, passes the mlx-cuda static
rules, and its MLX launch resolves on every workload (and on head_dims and GQA groups of hidden workloads) to the
same head_dim / group bucket and shared memory as the cuda pack's launch plan picks by `when` for the same move;
the device function in the header is the cuda pack's kernel with only its qualifiers changed; the translation unit
MLX would build (`mlx_cuda_translation_unit`) for each family's root and each bucket the workloads reach compiles
with NVRTC (pip's CUDA headers, sm_90) and with nvcc -arch=sm_90 (skipped where either is missing). Nothing here
has run on a GPU, and MLX's own build has not seen these bodies."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from ksearch.eval import static_checks
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import cuda_launch
from ksearch.targets import mlx as mlxt
from ksearch.targets.mlx import BODY_MARKER
from ksearch.tasks import load_task

from ..nvrtc import nvrtc_compile, nvrtc_status
from .paths import path_id, single_moves

PREFILL = ["attention-prefill", "attention-prefill-noncausal"]
DECODE = "attention-decode"
#: MLX's default header defines `inf` as a macro (mlx/backend/cuda/custom_kernel.cpp): a kernel naming `inf` breaks
INF_MACRO = "#define inf __int_as_float(0x7f800000)\n"
#: NVRTC with pip's CUDA headers: cooperative_groups needs CCCL's <nv/target>, which MLX ships and the wheel does
#: not, so an empty namespace stands in for it (the bodies here do not use cg::)
NVRTC_PRELUDE = ("#include <cuda_fp16.h>\nnamespace cooperative_groups {}\n"
                 "struct Shape { int d[10]; __host__ __device__ int operator[](int i) const { return d[i]; } };\n")
PREFILL_MOVES = single_moves(load_pack(PREFILL[0], "mlx-cuda"))
DECODE_MOVES = single_moves(load_pack(DECODE, "mlx-cuda"))


@functools.lru_cache(maxsize=None)
def _task(name):
    return load_task(name)


@functools.lru_cache(maxsize=None)
def _pack(name, target):
    return load_pack(name, target)


def _axes(task) -> list[dict]:
    """Every workload's axes (with the const ones), and the first with other head_dims (the buckets 64/128/256 and
    their edges) and, for decode, other GQA groups (buckets 1/2/4/8 and over 8): shapes of hidden workloads."""
    consts = {a: s.value for a, s in task.definition.axes.items() if s.type == "const"}
    out = [{**w.axes, **consts} for w in task.workloads]
    first = out[0]
    out += [{**first, "head_dim": hd} for hd in (16, 64, 65, 80, 128, 129, 200, 256)]
    if "kv_len" in first:
        out += [{**first, "q_heads": first["kv_heads"] * g} for g in (1, 2, 3, 4, 5, 8, 16)]
    return out


def _cuda_choices(task, cuda_pack, choices, knobs):
    """For the cuda pack's render of the same move: axes -> (template arguments, shared bytes) of the launch its
    plan runs for them (the first, `when`-selected one)."""
    k = cuda_pack.render(task.definition, choices, knobs)
    plan = cuda_launch.parse_plan(k.launch, task.definition)

    def pick(axes):
        run = cuda_launch.resolve(plan, task.definition, axes, max_shared_bytes=232448)[0]
        args = re.findall(r"-?\d+", run.kernel.split("<", 1)[1]) if "<" in run.kernel else []
        return tuple(int(a) for a in args), run.shared_bytes
    return pick


def _render_checked(task, move):
    """(kernel, its kernel.cu, its MLX launch plan) for the mlx-cuda pack's render of ``move``, after asserting it
    passes the mlx-cuda static rules, is one MLX body (one marker, no __global__) and launches by shapes."""
    choices, knobs = move
    k = _pack(task.name, "mlx-cuda").render(task.definition, choices, knobs)
    findings = static_checks.check(k.candidate(), static_checks.rules_for("mlx-cuda"))
    assert findings == [], "; ".join(map(str, findings))
    src = k.sources["kernel.cu"]
    assert src.count(BODY_MARKER) == 1 and "__global__" not in src
    plan = mlxt.parse_launch(k.launch, task.definition, "mlx-cuda")
    assert plan.axes == "shapes"
    return k, src, plan


@pytest.mark.parametrize("task_name", [*PREFILL, DECODE])
def test_description_says_what_ran_on_a_gpu_and_float16_only(task_name):
    pack = load_pack(task_name, "mlx-cuda")
    assert "ON THE H200" in pack.description and "NOT RUN ON A GPU" in pack.description
    assert {d for ds in pack.signature.dtypes.values() for d in ds} == {"float16"}


def test_moves_cover_every_family_and_decision():
    assert {c["family"] for c, _ in PREFILL_MOVES} == {"naive-rows", "flash"}
    assert {d for c, _ in PREFILL_MOVES for d in c if d != "family"} == {"kv_pipeline", "q_tile", "exp", "masking",
                                                                         "schedule"}
    assert {c["family"] for c, _ in DECODE_MOVES} == {"naive-heads", "split-kv"}
    assert {d for c, _ in DECODE_MOVES for d in c if d != "family"} == {"loads", "cache_hint", "exp"}
    # one kernel a candidate: the only split is the one without scratch and combine kernel
    split = load_pack(DECODE, "mlx-cuda").decision("split")
    assert [c.id for c in split.choices] == ["no-split"]


@pytest.mark.parametrize("task_name", PREFILL)
@pytest.mark.parametrize("move", PREFILL_MOVES, ids=path_id)
def test_prefill_move_passes_static_rules_and_matches_the_cuda_buckets(task_name, move):
    task, cuda = _task(task_name), _pack(task_name, "cuda")
    choices, knobs = move
    k, src, plan = _render_checked(task, move)
    assert "<<<" not in src
    pick = _cuda_choices(task, cuda, choices, knobs) if k.family == "flash" else None
    for ax in _axes(task):
        r = mlxt.resolve_launch(plan, ax)
        if pick:
            args, shared = pick(ax)
            hdp, bm, _, w, _ = args
            assert dict(r.template) == {"HDP": hdp} and r.shared_memory == shared, (ax, args, r)
            assert r.threadgroup == (32 * w, 1, 1)
            assert r.grid == (-(-ax["seqlen"] // bm) * 32 * w, ax["batch"] * ax["q_heads"], 1)
            assert f"constexpr bool CAUSAL = {'true' if ax['causal'] else 'false'};" in src
        else:
            assert r.grid[0] == ax["batch"] * ax["q_heads"] * ax["seqlen"] and r.shared_memory == 0


@pytest.mark.parametrize("move", DECODE_MOVES, ids=path_id)
def test_decode_move_passes_static_rules_and_matches_the_cuda_buckets(move):
    task, cuda = _task(DECODE), _pack(DECODE, "cuda")
    choices, knobs = move
    k, src, plan = _render_checked(task, move)
    assert "decode_combine(" not in src
    pick = _cuda_choices(task, cuda, {**choices, "split": "no-split"}, knobs) if k.family == "split-kv" else None
    for ax in _axes(task):
        r = mlxt.resolve_launch(plan, ax)
        if pick:
            args, shared = pick(ax)
            hdp, gm, w = args[:3]
            assert dict(r.template) == {"HDP": hdp, "GM": gm} and r.shared_memory == shared, (ax, args, r)
            group = ax["q_heads"] // ax["kv_heads"]
            assert r.grid == (ax["batch"] * ax["kv_heads"] * -(-group // gm) * 32 * w, 1, 1)
            assert r.threadgroup == (32 * w, 1, 1)
        else:
            assert r.grid == (ax["batch"] * ax["q_heads"] * 32, 1, 1) and r.threadgroup == (32, 1, 1)


@pytest.mark.parametrize("task_name,family,cuda_kernel", [
    ("attention-prefill", "flash", "__global__ void __launch_bounds__(W * 32)\n"),
    ("attention-prefill-noncausal", "naive-rows", 'extern "C" __global__ void __launch_bounds__(128)\n'),
    (DECODE, "split-kv", "__global__ void __launch_bounds__(W * 32)\n"),
    (DECODE, "naive-heads", 'extern "C" __global__ void naive_decode('),
])
def test_the_device_function_is_the_cuda_kernel_with_other_qualifiers(task_name, family, cuda_kernel):
    """The header MLX gets is the cuda pack's render of the same move up to the kernel's qualifiers (and without
    the cuda-only parts after the kernel: explicit instantiations, decode_combine)."""
    d = load_task(task_name).definition
    mlx_pack = load_pack(task_name, "mlx-cuda")
    path, knobs = {"family": family}, {}
    if family == "split-kv":   # where the cuda pack's defaults differ from mlx-cuda's (which has neither a pipeline
        # decision nor a min_blocks knob): one chunk, no pipeline, no __launch_bounds__ block count
        path.update(split="no-split", pipeline="none")
        knobs["min_blocks"] = 0
    cuda_src = load_pack(task_name, "cuda").render(d, path, knobs).sources["kernel.cu"]
    header = mlx_pack.render(d, {"family": family}, {}).sources["kernel.cu"]
    header = header.split(BODY_MARKER)[0]
    device = "static __device__ __forceinline__ void  // the kernel, called from an MLX body\n"
    if family == "naive-heads":
        device = "static __device__ __forceinline__ void naive_decode(  // called from an MLX body\n"
    assert cuda_src.count(cuda_kernel) == 1
    expected = cuda_src.replace(cuda_kernel, device)
    header, expected = header.split("\n", 1)[1].rstrip(), expected.split("\n", 1)[1]   # line 1: the pack's name
    n = len(header)
    assert expected[:n] == header
    rest = expected[n:]   # cuda only: the explicit instantiations (flash), decode_combine (split-kv)
    assert ("__global__" in rest) == (family in ("flash", "split-kv")), rest


def _units() -> list[tuple[str, Candidate, object, dict, bool]]:
    """(label, candidate, definition, axes, first) for each family's root at the first workload of each task
    (``first``), and the other buckets of the causal flash kernel (HDP 64, 128, 256) and the corner buckets of
    split-kv ((HDP, GM) = (64, 1), (256, 8)): every instantiation kind MLX would compile, without compiling each
    one per task (a few seconds of NVRTC)."""
    out = []
    for task_name in [*PREFILL, DECODE]:
        task, pack = _task(task_name), _pack(task_name, "mlx-cuda")
        first = _axes(task)[0]
        for fam in pack.families:
            c = pack.render(task.definition, {"family": fam.id}, {}).candidate()
            plan = mlxt.parse_launch(c.launch, task.definition, "mlx-cuda")
            extra = []
            if (task_name, fam.id) == ("attention-prefill", "flash"):
                extra = [{**first, "head_dim": hd} for hd in (64, 128, 256)]
            elif fam.id == "split-kv":
                extra = [{**first, "head_dim": 64, "q_heads": first["kv_heads"]},
                         {**first, "head_dim": 256, "q_heads": 8 * first["kv_heads"]}]
            seen = {}
            for ax in [first, *extra]:
                seen.setdefault(mlxt.resolve_launch(plan, ax).template, ax)
            out += [(f"{task_name}:{fam.id}:{dict(t)}", c, task.definition, ax, ax is first)
                    for t, ax in seen.items()]
    return out


@pytest.fixture(scope="module")
def units():
    return _units()


@pytest.mark.skipif(nvrtc_status() is not None, reason=str(nvrtc_status()))
def test_what_mlx_compiles_compiles_under_nvrtc(units):
    """Each translation unit MLX would build, under NVRTC for sm_90 with pip's CUDA headers (MLX compiles with
    NVRTC too), with MLX's `inf` macro defined."""
    from ksearch.targets.cuda_checks import module_state

    labels = [lab for lab, *_ in units]
    assert {lab.split(":")[1] for lab in labels} == {"naive-rows", "flash", "naive-heads", "split-kv"}
    for bucket in ("{'HDP': 64}", "{'HDP': 128}", "{'HDP': 256}", "{'HDP': 64, 'GM': 1}", "{'HDP': 256, 'GM': 8}"):
        assert any(lab.endswith(bucket) for lab in labels), (bucket, labels)
    images = [[] for _ in units]

    def compile_one(i):
        _, c, d, ax, _ = units[i]
        return nvrtc_compile(mlxt.mlx_cuda_translation_unit(c, d, ax, prelude=NVRTC_PRELUDE + INF_MACRO),
                             ["-std=c++17"], cubin=images[i])

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(compile_one, range(len(units))))
    failed = {lab: log[:2000] for (lab, *_), (ok, log) in zip(units, results) if not ok}
    assert not failed, failed
    stateful = {lab: module_state(img[0]) for (lab, *_), img in zip(units, images) if module_state(img[0])}
    assert not stateful, stateful


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_what_mlx_compiles_compiles_with_nvcc(units, tmp_path):
    """The family roots' translation units at each task's first workload in one file (each in its own namespace,
    its macros undefined after it), compiled for sm_90 by nvcc with the prelude that stands in for MLX's device
    header (the other buckets: NVRTC above)."""
    parts = []
    for i, (_, c, d, ax, _) in enumerate(u for u in units if u[4]):
        tu = mlxt.mlx_cuda_translation_unit(c, d, ax, prelude="")
        undef = "".join(f"#undef {m}\n" for m in sorted(set(re.findall(r"^\s*#define\s+(\w+)", tu, re.M))))
        parts.append(f"namespace unit{i} {{\n{tu}}}\n{undef}")
    src = tmp_path / "all.cu"
    src.write_text(mlxt.NVCC_PRELUDE + INF_MACRO + "".join(parts))
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / "all.cubin")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
