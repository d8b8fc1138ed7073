"""Every CUDA kernel ksearch ships compiles under NVRTC, the compiler the GPU worker uses (through CuPy), for
sm_90 with the cuda target's options: each task's naive kernel and each cuda pack family's default path. nvcc
(tests/knowledge/test_*_cuda*.py) includes the CUDA math headers implicitly and NVRTC does not, so a kernel that
nvcc compiles can still fail on the GPU machine (``INFINITY`` did: every attention kernel failed its first GPU
contact). Skipped without the nvidia-cuda-nvrtc wheel (test extras) or CUDA headers."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from ksearch.knowledge import load_pack
from ksearch.targets import cuda_launch
from ksearch.targets.cuda import BASE_OPTIONS, combined_source
from ksearch.targets.cuda_checks import module_state
from ksearch.tasks import load_task
from ksearch.tasks.loader import builtin_names

from ..nvrtc import nvrtc_compile, nvrtc_status

pytestmark = pytest.mark.skipif(nvrtc_status() is not None, reason=str(nvrtc_status()))


def _kernels():
    out = []
    for name in builtin_names():
        t = load_task(name)
        if "cuda" in t.naive_sources:
            plan = cuda_launch.parse_plan(t.naive_launch["cuda"], t.definition)
            out.append((f"{name}: naive", t.naive_sources["cuda"], list(BASE_OPTIONS), plan.kernel_names()))
            try:
                pack = load_pack(name, "cuda")
            except Exception:
                continue
            for fam in pack.families:
                k = pack.render(t.definition, {"family": fam.id}, {})
                c = k.candidate()
                plan = cuda_launch.parse_plan(k.launch, t.definition)
                out.append((f"{name}: {fam.id}", combined_source(c), [*BASE_OPTIONS, *k.compile_flags],
                            plan.kernel_names()))
    # one compile per distinct (source, options, names): a causal / non-causal pair shares its naive kernels
    unique = {}
    for label, src, opts, names in out:
        unique.setdefault((src, tuple(opts), tuple(names)), (label, src, opts, names))
    return list(unique.values())


def test_shipped_cuda_kernels_compile_under_nvrtc():
    kernels = _kernels()
    assert len(kernels) >= 8
    # tests/knowledge/test_attention_{cuda,decode_cuda}_pack.py rely on these roots' compiles (all kernel names)
    assert {"attention-prefill-bf16: naive-rows", "attention-prefill-bf16: flash", "attention-decode: naive-heads",
            "attention-decode: split-kv", "attention-decode: mma-split"} <= {k[0] for k in kernels}
    images = [[] for _ in kernels]
    with ThreadPoolExecutor(2) as pool:  # ctypes releases the GIL during the compile
        results = list(pool.map(lambda ki: nvrtc_compile(ki[0][1], ki[0][2], names=ki[0][3], cubin=ki[1]),
                                zip(kernels, images)))
    failed = {label: log[:1500] for (label, *_), (ok, log) in zip(kernels, results) if not ok}
    assert not failed, failed
    # the judge rejects a module with state that persists between calls (cuda_checks.module_state): so would the
    # GPU machine's worker (a file-scope constexpr float became a .nv.global object under NVRTC there)
    stateful = {label: module_state(img[0]) for (label, *_), img in zip(kernels, images) if module_state(img[0])}
    assert not stateful, stateful


def test_the_judges_own_module_compiles_under_nvrtc():
    """The worker's poisoning/summary/spin kernels (cuda_judge_kernels): a compile error there would fail every
    cuda evaluation on the GPU machine, not one candidate."""
    from ksearch.targets.cuda_judge_kernels import _SOURCE

    ok, log = nvrtc_compile(_SOURCE, ("-std=c++17",))
    assert ok, log


def test_module_state_is_seen_in_an_nvrtc_cubin():
    images = []
    ok, log = nvrtc_compile('constexpr float UNIT = 1.5f;\n__device__ float g;\nextern "C" __global__ void f(float *x) '
                            '{ g += x[0]; x[0] = g * UNIT; }', cubin=images)
    assert ok, log
    assert "g" in module_state(images[0])


def test_check_module_rejects_state_in_any_of_the_programs():
    # the worker compiles one NVRTC program per kernel of the plan (cuda_runtime.compile_module): the state check
    # must look at every image, not the first
    from ksearch.errors import KernelRejected
    from ksearch.targets.cuda_checks import check_module

    images = []
    for src in ('extern "C" __global__ void clean(float *x) { x[0] += 1.0f; }',
                '__device__ float hidden;\nextern "C" __global__ void keeps(float *x) { hidden += x[0]; x[0] = hidden; }'):
        ok, log = nvrtc_compile(src, cubin=images)
        assert ok, log
    check_module(images[:1])
    with pytest.raises(KernelRejected, match="hidden"):
        check_module(images)
    with pytest.raises(KernelRejected, match="hidden"):
        check_module(images[::-1])


def test_nvrtc_rejects_what_nvcc_would_accept():
    ok, log = nvrtc_compile('extern "C" __global__ void f(float *x) { x[0] = -INFINITY; }')
    assert not ok and "INFINITY" in log
