"""The mlx targets without an MLX GPU: file sets, launches, the controller's compile step, target resolution,
static checks of the naive kernels and of the mlx-cuda pack, and nvcc compiling what MLX would compile.

What needs MLX's CUDA backend (the runner) is in test_mlx_gpu.py, marked ``mlx_gpu``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from ksearch.errors import TargetError
from ksearch.eval import static_checks
from ksearch.records import Candidate
from ksearch.knowledge.pack import load_pack
from ksearch.targets import base, get_target, resolve_target
from ksearch.targets import mlx as mlxt
from ksearch.tasks import load_task

FP16 = load_task("selective-scan-fp16")
AXES = {"batch": 2, "dim": 2048, "dstate": 16, "seqlen": 4096}


def naive(target: str, task=FP16) -> Candidate:
    name = mlxt.BODY_FILE[target]
    return Candidate(target=target, sources={name: task.naive_sources[target]}, launch=task.naive_launch[target])


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- sources and launches -------------------------------------------------------------------------------------


def test_split_sources_takes_the_header_file_and_the_part_above_the_marker():
    c = Candidate(target="mlx-cuda", sources={
        "header.cuh": "#define K 3\n",
        "kernel.cu": f"__device__ int f() {{ return K; }}\n{mlxt.BODY_MARKER}\nout[0] = f();\n"})
    header, body = mlxt.split_sources(c, "mlx-cuda")
    assert header == "#define K 3\n__device__ int f() { return K; }\n"
    assert body == "out[0] = f();\n"


@pytest.mark.parametrize("sources, why", [
    ({"kernel.c": "x"}, "one kernel body file"),
    ({"kernel.cu": "x", "other.cu": "y"}, "one kernel body file"),
    ({"kernel.cu": "x", "notes.txt": "y"}, "one kernel body file"),
    ({"kernel.cu": f"int x;\n{mlxt.BODY_MARKER}\n   \n"}, "the kernel body is empty"),
])
def test_split_sources_refuses_other_file_sets(sources, why):
    with pytest.raises(mlxt.PlanError, match=why):
        mlxt.split_sources(Candidate(target="mlx-cuda", sources=sources), "mlx-cuda")


def test_launch_resolves_axes_first_then_template_constants():
    plan = mlxt.parse_launch({"grid": ["ceil(dim/4)*128", "batch"], "threadgroup": [128],
                              "template": {"NI": "min(8, seqlen)"}, "shared_memory": "4*dstate"},
                             FP16.definition, "mlx-cuda")
    r = mlxt.resolve_launch(plan, AXES)
    assert r.grid == (512 * 128, 2, 1) and r.threadgroup == (128, 1, 1)
    assert r.template == (("batch", 2), ("dim", 2048), ("dstate", 16), ("seqlen", 4096), ("NI", 8))
    assert r.shared_memory == 64


@pytest.mark.parametrize("launch, why", [
    ({}, "needs a launch"),
    ({"grid": [1]}, "threadgroup"),
    ({"grid": [1], "threadgroup": [32], "blocks": 3}, "blocks"),
    ({"grid": ["import os"], "threadgroup": [32]}, "grid.0"),
    ({"grid": [1], "threadgroup": [32], "template": {"dim": 4}}, "reuses the name"),
    ({"grid": [1], "threadgroup": [32], "template": {"not-c": 4}}, "not a C identifier"),
])
def test_bad_launches_name_the_field(launch, why):
    with pytest.raises(mlxt.PlanError, match=why):
        mlxt.parse_launch(launch, FP16.definition, "mlx-cuda")


def test_shared_memory_is_refused_for_metal_and_threadgroups_are_bounded():
    with pytest.raises(mlxt.PlanError, match="shared_memory is for mlx-cuda"):
        mlxt.parse_launch({"grid": [1], "threadgroup": [32], "shared_memory": 128}, FP16.definition, "mlx-metal")
    plan = mlxt.parse_launch({"grid": ["batch*dim"], "threadgroup": [32, 64]}, FP16.definition, "mlx-metal")
    with pytest.raises(mlxt.PlanError, match="2048 threads, over the 1024"):
        mlxt.resolve_launch(plan, AXES)
    plan = mlxt.parse_launch({"grid": ["seqlen - 4096"], "threadgroup": [32]}, FP16.definition, "mlx-metal")
    with pytest.raises(mlxt.PlanError, match="expected an integer >= 1"):
        mlxt.resolve_launch(plan, AXES)


# -- the controller's compile step ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["mlx-cuda", "mlx-metal"])
def test_compile_writes_the_artifact_the_worker_loads(home, target):
    c = naive(target)
    res = get_target(target).compile(c, FP16.definition)
    assert res.ok, res.log
    payload = json.loads(res.artifact.read_text())
    assert payload["target"] == target and payload["launch"] == c.launch
    assert payload["body"] == c.sources[mlxt.BODY_FILE[target]] and payload["header"] == ""
    assert res.artifact.parent == home / "cache" / target
    again = get_target(target).compile(c, FP16.definition)
    assert again.ok and again.cached


def test_compile_refuses_flags_bad_files_and_bad_launches(home):
    t = get_target("mlx-cuda")
    c = naive("mlx-cuda")
    res = t.compile(c.model_copy(update={"compile_flags": ["--use_fast_math"]}), FP16.definition)
    assert not res.ok and "takes no compile flags" in res.log
    res = t.compile(c.model_copy(update={"sources": {"kernel.metal": "x"}}), FP16.definition)
    assert not res.ok and "one kernel body file" in res.log
    res = t.compile(c.model_copy(update={"launch": {"grid": [1]}}), FP16.definition)
    assert not res.ok and "threadgroup" in res.log
    assert not (home / "cache" / "mlx-cuda").exists() or not list((home / "cache" / "mlx-cuda").iterdir())


# -- which target --------------------------------------------------------------------------------------------


def test_mlx_resolves_to_the_backend_this_machine_has(monkeypatch):
    status = {"mlx-metal": "no Metal here", "mlx-cuda": None}
    monkeypatch.setattr(mlxt, "mlx_status", lambda t: status[t])
    assert resolve_target("mlx") == "mlx-cuda"
    status.update({"mlx-metal": None})
    assert resolve_target("mlx") == "mlx-metal"
    assert resolve_target("cuda") == "cuda"


def test_mlx_without_a_backend_says_which_targets_this_machine_has(monkeypatch):
    monkeypatch.setattr(mlxt, "mlx_status", lambda t: f"{t}: not here")
    monkeypatch.setattr(base, "available_targets", lambda: ["cpu"])
    with pytest.raises(TargetError) as e:
        resolve_target("mlx")
    msg = str(e.value)
    assert "mlx-metal: not here" in msg and "mlx-cuda: not here" in msg and "available on this machine: cpu" in msg


def test_unknown_target_lists_the_mlx_ones():
    with pytest.raises(TargetError, match="mlx-metal, mlx-cuda"):
        get_target("mlx-vulkan")


# -- static checks and what MLX compiles ------------------------------------------------------------------------


def pack_kernels(task_name: str):
    """(path, knobs, rendered kernel) for every family of the mlx-cuda pack with each choice of each decision
    that applies to it (defaults for the rest), each with its default knobs and with each other knob value."""
    task = load_task(task_name)
    pack = load_pack(task_name, "mlx-cuda")
    seen = {}
    for fam in pack.families:
        paths = [{"family": fam.id}]
        for dec in pack.decisions:
            if dec.applies_to(fam.id):
                paths += [{"family": fam.id, dec.id: ch.id} for ch in dec.choices if ch.applies_to(fam.id)]
        for path in paths:
            resolved = pack.resolve(path)
            values = {k: knob.values for d, c in resolved.choices.items()
                      for k, knob in pack.decision(d).choice(c).knobs.items()}
            for knobs in [{}] + [{k: v} for k, vals in values.items() for v in vals]:
                full = pack.resolve(path, knobs)
                key = json.dumps([full.family, full.choices, full.knobs], sort_keys=True)
                if key not in seen:
                    seen[key] = (path, knobs, pack.render(task.definition, path, knobs))
    return task, list(seen.values())


@pytest.mark.parametrize("task_name", ["selective-scan-fp16", "selective-scan"])
def test_naive_kernels_and_every_mlx_cuda_pack_kernel_pass_the_static_checks(task_name):
    task, kernels = pack_kernels(task_name)
    assert len(kernels) > 20
    for target in ("mlx-cuda", "mlx-metal"):
        assert static_checks.check(naive(target, task), static_checks.rules_for(target)) == []
    for path, knobs, k in kernels:
        c = Candidate(target="mlx-cuda", sources=k.sources, launch=k.launch)
        assert static_checks.check(c, static_checks.rules_for("mlx-cuda")) == [], (path, knobs)
        mlxt.resolve_launch(mlxt.parse_launch(k.launch, task.definition, "mlx-cuda"), AXES)


def test_an_mlx_cuda_tile_over_the_shared_memory_limit_is_caught():
    body = "__shared__ float tile[128][128];\ntile[threadIdx.x][0] = u[0];\nout[0] = tile[0][0];\n"
    c = Candidate(target="mlx-cuda", sources={"kernel.cu": body}, launch={"grid": [128], "threadgroup": [128]})
    findings = static_checks.check(c, static_checks.rules_for("mlx-cuda"))
    assert findings and "65536" in str(findings[0]) and "49152" in str(findings[0])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_what_mlx_compiles_compiles_with_nvcc(tmp_path):
    """The translation units MLX 0.32 builds (mlx_cuda_translation_unit) for the naive kernel and one kernel
    per family of the pack (fp16 task), each in its own namespace of one file, compiled for sm_90 with nvcc
    (device code only, -cubin, as MLX's NVRTC compiles it: no GPU here, and a host pass would double the time); a
    body with an undefined name does not compile."""
    task, kernels = pack_kernels("selective-scan-fp16")
    firsts = {}
    for path, _knobs, k in kernels:
        firsts.setdefault(path["family"], k)
    cands = [naive("mlx-cuda", task)] + [Candidate(target="mlx-cuda", sources=k.sources, launch=k.launch)
                                         for k in firsts.values()]
    prelude = mlxt.NVCC_PRELUDE
    units = []
    for i, c in enumerate(cands):
        tu = mlxt.mlx_cuda_translation_unit(c, task.definition, AXES, prelude="")
        undef = "".join(f"#undef {m}\n" for m in sorted(set(re.findall(r"^\s*#define\s+(\w+)", tu, re.M))))
        units.append(f"namespace cand{i} {{\n{tu}}}\n{undef}")  # macros of one unit do not leak into the next
    src = tmp_path / "all.cu"
    src.write_text(prelude + "".join(units))
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / "all.cubin")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    bad = Candidate(target="mlx-cuda", sources={"kernel.cu": "out[0] = undefined_name;"},
                    launch={"grid": [1], "threadgroup": [1]})
    (tmp_path / "bad.cu").write_text(mlxt.mlx_cuda_translation_unit(bad, task.definition, AXES))
    r = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", str(tmp_path / "bad.cu"), "-o", str(tmp_path / "bad.cubin")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "undefined_name" in r.stderr


def test_shapes_mode_passes_no_axis_constants_and_mlx_adds_the_shapes_the_body_names():
    task = FP16
    k = load_pack(task.definition.name, "mlx-cuda").render(task.definition, {"family": "warp-chunks"})
    plan = mlxt.parse_launch(k.launch, task.definition, "mlx-cuda")
    assert plan.axes == "shapes" and mlxt.resolve_launch(plan, AXES).template == ()
    tu = mlxt.mlx_cuda_translation_unit(Candidate(target="mlx-cuda", sources=k.sources, launch=k.launch),
                                        task.definition, AXES)
    assert "const __grid_constant__ Shape u_shape" in tu and "const __grid_constant__ Shape A_shape" in tu
    assert "Shape B_shape" not in tu and "constexpr int batch" not in tu
    assert "constexpr int batch = 2;" in mlxt.mlx_cuda_translation_unit(naive("mlx-cuda"), task.definition, AXES)
