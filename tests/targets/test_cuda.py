"""The cuda target: launch plans, the controller's side, static rules and nvcc compile checks (no GPU needed);
GPU tests are marked ``cuda`` and skipped with the reason where CuPy or a device is missing."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ksearch.errors import PlanError
from ksearch.eval import static_checks
from ksearch.records import Candidate, Status
from ksearch.targets import get_target, target_names
from ksearch.targets.cuda import CudaTarget, cupy_status
from ksearch.targets.cuda_launch import parse_plan, refused_flag, resolve, temporary_shape
from ksearch.tasks.loader import load_task

TASKS = ("selective-scan", "selective-scan-fp16")
AXES = {"batch": 2, "dim": 300, "dstate": 16, "seqlen": 512}


@pytest.fixture(scope="module")
def task():
    return load_task("selective-scan-fp16")


def test_cuda_is_a_known_target():
    assert "cuda" in target_names()
    assert isinstance(get_target("cuda"), CudaTarget)


def test_availability_says_why_not():
    reason = CudaTarget().available()
    assert reason == cupy_status()
    if reason is not None:
        assert reason.startswith(("cupy not installed", "no CUDA device", "cupy does not import"))


@pytest.mark.parametrize("name", TASKS)
def test_naive_kernel_and_plan_ship_with_the_task(name):
    t = load_task(name)
    assert "naive_scan" in t.naive_sources["cuda"]
    plan = parse_plan(t.naive_launch["cuda"], t.definition)
    (launch,) = resolve(plan, t.definition, AXES)
    assert launch.grid == (5, 1, 1) and launch.block == (128, 1, 1) and launch.shared_bytes == 0
    assert launch.args == tuple(t.definition.inputs) + tuple(t.definition.outputs) + tuple(t.definition.axes)


def test_plan_expressions_when_and_temporaries(task):
    plan = parse_plan({
        "temporaries": {"carry": {"dtype": "float32", "shape": ["batch*dim*dstate", "ceil(seqlen/256)"], "init": "zero"}},
        "launches": [
            {"kernel": "chunks<16>", "grid": ["ceil(seqlen/256)", "dim", "batch"], "block": [128],
             "shared_bytes": "4*dstate*128", "when": "dstate == 16",
             "args": ["u", "delta", "A", "B", "C", "carry", "seqlen"]},
            {"kernel": "generic", "grid": [1], "block": [32, 4], "when": "dstate != 16"},
        ]}, task.definition)
    assert plan.kernel_names() == ["chunks<16>", "generic"]
    (first,) = resolve(plan, task.definition, AXES)
    assert first.kernel == "chunks<16>" and first.grid == (2, 300, 2) and first.shared_bytes == 8192
    (second,) = resolve(plan, task.definition, {**AXES, "dstate": 8})
    assert second.block == (32, 4, 1)
    assert temporary_shape(plan.temporaries["carry"], "carry", AXES) == (9600, 2)


@pytest.mark.parametrize("plan, field", [
    ({}, "needs a launch plan"),
    ({"launches": []}, "launches"),
    ({"launches": [{"kernel": "k", "grid": ["import os"], "block": [1]}]}, "launches.0.grid.0"),
    ({"launches": [{"kernel": "k", "grid": [1, 1, 1, 1], "block": [1]}]}, "launches.0.grid"),
    ({"launches": [{"kernel": "k", "grid": [1], "block": [1], "args": ["nope"]}]}, "unknown name 'nope'"),
    ({"launches": [{"kernel": "k", "grid": [1], "block": [1], "stream": 2}]}, "launches.0.stream"),
    ({"launches": [{"kernel": "k", "grid": [1], "block": [1]}], "temporaries": {"u": {"dtype": "float32", "shape": [1]}}},
     "reuse the names"),
    ({"launches": [{"kernel": "k", "grid": [1], "block": [1]}], "temporaries": {"t": {"dtype": "float7", "shape": [1]}}},
     "temporaries.t.dtype"),
])
def test_bad_plans_name_the_field(task, plan, field):
    with pytest.raises(PlanError, match=field.replace("(", r"\(").replace(".", r"\.")):
        parse_plan(plan, task.definition)


@pytest.mark.parametrize("grid, block, msg", [
    (["dim - 300"], [1], "expected an integer >= 1"),
    (["dim / 7"], [1], "expected an integer"),
    ([1], [2048], "over the device's 1024"),
    (["unknown_axis"], [1], "unknown_axis"),
])
def test_plans_that_do_not_resolve(task, grid, block, msg):
    plan = parse_plan({"launches": [{"kernel": "k", "grid": grid, "block": block}]}, task.definition)
    with pytest.raises(PlanError, match=msg):
        resolve(plan, task.definition, AXES)


def test_nvrtc_options_allowlist():
    assert refused_flag(["--use_fast_math", "-DCHUNK=256", "--maxrregcount=64", "-std=c++20"]) is None
    for bad in ("-I/etc", "--include-path=/x", "-arch=sm_80", "--pre-include=x.h", "-G"):
        assert bad in (refused_flag([bad]) or "")


def test_compile_in_the_controller_checks_the_plan_and_writes_the_artifact(task):
    target = CudaTarget()
    good = Candidate(target="cuda", sources={"kernel.cu": task.naive_sources["cuda"]}, launch=task.naive_launch["cuda"])
    built = target.compile(good, task.definition)
    assert built.ok and built.artifact.is_file()
    assert target.compile(good, task.definition).cached
    no_plan = good.model_copy(update={"launch": {}})
    assert "launch plan" in target.compile(no_plan, task.definition).log
    bad_name = good.model_copy(update={"sources": {"../k.cu": "x"}})
    assert not target.compile(bad_name, task.definition).ok
    bad_flag = good.model_copy(update={"compile_flags": ["-I/usr/include"]})
    assert "not allowed" in target.compile(bad_flag, task.definition).log


def test_bad_plan_is_a_compile_error_before_any_worker(task):
    from ksearch.eval.evaluator import EvalConfig, Evaluator

    ev = Evaluator(task, "cuda", None, EvalConfig(seeds=[1]))
    try:
        cand = Candidate(target="cuda", sources={"kernel.cu": task.naive_sources["cuda"]},
                         launch={"launches": [{"kernel": "naive_scan", "grid": ["oops("], "block": [128]}]})
        result = ev.evaluate(cand, ["tiny"])
    finally:
        ev.close()
    assert result.status is Status.COMPILE_ERROR and "launches.0.grid.0" in result.message


@pytest.mark.parametrize("name", TASKS)
def test_naive_kernels_pass_the_static_rules(name):
    cand = Candidate(target="cuda", sources={"kernel.cu": load_task(name).naive_sources["cuda"]})
    assert static_checks.check(cand, static_checks.rules_for("cuda")) == []


@pytest.mark.parametrize("rule, src", [
    ("timer", "__global__ void k(long long *o) { o[0] = clock64(); }"),
    ("timer-ptx", 'extern "C" __global__ void k(unsigned long long *o) { unsigned long long t;\n'
                  '  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); o[0] = t; }'),
    ("host-include", "#include <stdio.h>\n__global__ void k() {}"),
    ("host-include", '#include "/etc/passwd"\n'),
    ("replaced-library", "#include <torch/extension.h>\n"),
    ("device-launch", "__global__ void c() {}\n__global__ void k() { c<<<1, 1>>>(); }"),
    ("device-state", "__device__ float cache[1 << 20];\n__global__ void k() {}"),
    ("device-printf", '__global__ void k() { printf("%d", 1); }'),
])
def test_static_rules_reject(rule, src):
    findings = static_checks.check(Candidate(target="cuda", sources={"k.cu": src}), static_checks.rules_for("cuda"))
    assert rule in [f.rule for f in findings]


def test_static_rules_let_device_idioms_through():
    src = ("#include <cuda_fp16.h>\n#include <cub/block/block_scan.cuh>\n#include <cooperative_groups.h>\n"
           "__device__ __forceinline__ float f(float x) { return x; }\n__device__ float g(float x);\n"
           'static __device__ inline float h(float x) { float y; asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));'
           " return y; }\n")
    assert static_checks.check(Candidate(target="cuda", sources={"k.cu": src}), static_checks.rules_for("cuda")) == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", TASKS)
def test_naive_kernels_compile_with_nvcc_for_sm90(name, tmp_path):
    """Device code only (-cubin), as NVRTC compiles it: a host pass (-c) would double nvcc's time for nothing."""
    src = tmp_path / "k.cu"
    src.write_text(load_task(name).naive_sources["cuda"])
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


# -- on a GPU -------------------------------------------------------------------------------------------


def _evaluate(task, candidate, workloads, namespaces="auto"):
    from ksearch.eval.evaluator import EvalConfig, Evaluator
    from ksearch.jail.sandbox import Policy

    ev = Evaluator(task, "cuda", None, EvalConfig(seeds=[1, 2], sandbox=Policy(namespaces=namespaces)))
    try:
        return ev.evaluate(candidate, workloads)
    finally:
        ev.close()


@pytest.mark.cuda
@pytest.mark.parametrize("name", TASKS)
def test_naive_kernel_passes_on_the_gpu(name):
    t = load_task(name)
    cand = Candidate(target="cuda", sources={"kernel.cu": t.naive_sources["cuda"]}, launch=t.naive_launch["cuda"])
    result = _evaluate(t, cand, ["tiny"])
    assert result.status is Status.PASSED, result.message
    assert result.workloads[0].median_ms > 0


@pytest.mark.cuda
def test_nvrtc_error_is_a_compile_error_with_the_log(task):
    cand = Candidate(target="cuda", sources={"kernel.cu": 'extern "C" __global__ void naive_scan() { oops; }'},
                     launch=task.naive_launch["cuda"])
    result = _evaluate(task, cand, ["tiny"])
    assert result.status is Status.COMPILE_ERROR and "oops" in result.message


@pytest.mark.cuda
def test_kernel_that_skips_outputs_fails(task):
    src = ('extern "C" __global__ void naive_scan(const void*, const void*, const void*, const void*, const void*,'
           " const void*, const void*, const void*, void*, void*, long long, long long, long long, long long) {}")
    cand = Candidate(target="cuda", sources={"kernel.cu": src}, launch=task.naive_launch["cuda"])
    assert _evaluate(task, cand, ["tiny"]).status is Status.INCORRECT_NUMERICAL


@pytest.mark.cuda
def test_gpu_spec_is_measured():
    from ksearch.hardware.gpu import measure_gpu_spec

    spec = measure_gpu_spec(repeats=3)
    assert spec.kind == "gpu" and spec.simd_width == 32 and spec.memory_bandwidth_gbs > 100
    assert spec.exp_rate_per_s > 1e10 and spec.peak_flops["float32"] > 1e12


@pytest.mark.cuda
def test_compile_module_programs_in_parallel_load_the_right_kernels():
    import cupy as cp
    import numpy as np

    from ksearch.targets.cuda_runtime import compile_module

    src = ("template <int SCALE> __global__ void scale(float *x) { x[threadIdx.x] = x[threadIdx.x] * SCALE + SCALE; }\n"
           'extern "C" __global__ void half_it(float *x) { x[threadIdx.x] *= 0.5f; }')
    names = ["scale<2>", "scale<3>", "half_it"]
    images, fns = compile_module(cp, src, ["-std=c++17"], names, threads=2)
    assert len(images) == 2 and all(img[:4] == b"\x7fELF" for img in images)  # two programs: cubins
    assert sorted(fns) == sorted(names)
    x = cp.ones(32, dtype=cp.float32)
    fns["scale<2>"]((1,), (32,), (x,))
    fns["scale<3>"]((1,), (32,), (x,))
    assert float(x[0]) == (1 * 2 + 2) * 3 + 3  # 15; swapped instances would give (1*3+3)*2+2 = 14
    d = cp.asarray(np.full(32, 1e-38, dtype=np.float32))  # a float32 subnormal, copied (no CuPy kernel)
    assert float(d[0]) > 0.0
    fns["half_it"]((1,), (32,), (d,))
    assert float(d[0]) == 0.0  # -ftz=true, as CuPy's RawModule compiles (5e-39 without it)
    with pytest.raises(cp.cuda.compiler.CompileException, match="oops"):
        compile_module(cp, src + "\nvoid broken() { oops; }", [], names, threads=2)
    with pytest.raises(cp.cuda.compiler.CompileException):  # a name that is not a kernel of the source
        compile_module(cp, src, [], ["scale<2>", "missing<1>"], threads=2)


def test_compile_module_deals_names_into_programs(monkeypatch):
    # without CuPy: stand-ins for the two CuPy modules compile_module uses, recording each NVRTC program
    import sys
    import threading
    import types

    from ksearch.targets import cuda_runtime

    programs, loaded = [], {}
    lock = threading.Lock()

    def compile_using_nvrtc(source, options, arch=None, cache_in_memory=False, name_expressions=None):
        assert options[-1] == "-ftz=true" and "-std=c++17" in options and arch == "90" and cache_in_memory
        if "broken" in source:
            raise RuntimeError("NVRTC says no")
        with lock:
            programs.append(list(name_expressions or []))
        return b"\x7fELF" + "|".join(name_expressions or []).encode(), {n: f"_Z{n}" for n in name_expressions or []}

    class RawModule:
        def __init__(self, path):
            with open(path, "rb") as f:
                self.image = f.read()

        def get_function(self, lowered):
            loaded[lowered] = self.image
            return lowered

    compiler = types.SimpleNamespace(compile_using_nvrtc=compile_using_nvrtc, _get_arch=lambda: "90")
    core = types.SimpleNamespace(assemble_cupy_compiler_options=lambda opts: opts + ("-I/cupy",))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cupy._core", types.SimpleNamespace(core=core))
    monkeypatch.setitem(sys.modules, "cupy._core.core", core)
    monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(compiler=compiler))
    monkeypatch.setitem(sys.modules, "cupy.cuda.compiler", compiler)
    cp = types.SimpleNamespace(RawModule=RawModule)
    names = [f"k<{i}>" for i in range(5)] + ["k<0>"]  # a repeated name is compiled once

    images, fns = cuda_runtime.compile_module(cp, "src", ["-std=c++17"], names, threads=2)
    assert sorted(map(sorted, programs)) == [["k<0>", "k<2>", "k<4>"], ["k<1>", "k<3>"]]
    assert len(images) == 2 and fns == {f"k<{i}>": f"_Zk<{i}>" for i in range(5)}
    assert all(name.encode() in loaded[f"_Z{name}"] for name in fns)  # each kernel from its own program's image

    programs.clear()
    monkeypatch.setattr(cuda_runtime, "_usable_cpus", lambda: 1)
    images, fns = cuda_runtime.compile_module(cp, "src", ["-std=c++17"], names)  # one CPU: one program
    assert programs == [[f"k<{i}>" for i in range(5)]] and len(images) == 1 and len(fns) == 5
    with pytest.raises(RuntimeError, match="NVRTC says no"):
        cuda_runtime.compile_module(cp, "broken", ["-std=c++17"], names, threads=3)


def test_check_module_refuses_what_it_cannot_read():
    from ksearch.errors import TargetError
    from ksearch.targets.cuda_checks import check_module

    with pytest.raises(TargetError, match="not a cubin"):  # PTX would pass module_state unread
        check_module([b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n"])


class _Fn:
    """A stand-in for a CuPy Function: its static shared memory and its dynamic-shared-memory attribute."""

    def __init__(self, static: int):
        self.shared_size_bytes, self.max_dynamic_shared_size_bytes = static, 0


@pytest.mark.parametrize("static, dynamic, opted", [
    (0, 32 * 1024, 0),                 # under 48 KB in all: the default suffices
    (0, 64 * 1024, 64 * 1024),         # dynamic alone past 48 KB
    (34 * 1024, 32 * 1024, 32 * 1024),  # each under 48 KB, together past it (the transpose path's launch failure)
    (48 * 1024, 0, 0),                 # static only: the compiler holds it to 48 KB, nothing to opt in
])
def test_dynamic_shared_memory_is_opted_in_where_static_plus_dynamic_pass_48_kb(static, dynamic, opted):
    from ksearch.targets.cuda_runtime import opt_in_dynamic_shared

    fn = _Fn(static)
    opt_in_dynamic_shared(fn, dynamic)
    assert fn.max_dynamic_shared_size_bytes == opted
    opt_in_dynamic_shared(fn, dynamic // 2)  # never lowered by a smaller launch
    assert fn.max_dynamic_shared_size_bytes == opted
