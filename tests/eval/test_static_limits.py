"""Porting rules of the static checks: CUDA-only primitives in Metal, Metal-only names in CUDA, shared /
threadgroup memory and threads per group over the target's limits (computed from the declarations, with
#define / constexpr / template values substituted), a hard-coded warp width other than 32."""

import pytest

from ksearch.eval import static_checks as sc
from ksearch.records import Candidate
from ksearch.eval.static_limits import constants, declarations, evaluate, type_bytes
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from ..knowledge.paths import random_paths


def run(target: str, src: str, name: str | None = None, launch: dict | None = None) -> list[sc.Finding]:
    name = name or {"cuda": "kernel.cu", "metal": "kernel.metal"}[target]
    return sc.check(Candidate(target=target, sources={name: src}, launch=launch or {}), sc.rules_for(target))


def hit(target: str, src: str, **kw) -> set[str]:
    return {f.rule for f in run(target, src, **kw)}


def test_limits_tables_have_sources_and_every_limit_rule_resolves():
    for target, keys in (("metal", {"threadgroup_memory_bytes": 32768, "max_threads_per_threadgroup": 1024,
                                    "simd_width": 32}),
                         ("cuda", {"static_shared_bytes": 49152, "max_shared_bytes_optin": 232448,
                                   "max_threads_per_block": 1024, "warp_size": 32})):
        limits = sc.limits_for(target)
        assert {k: v.value for k, v in limits.items()} == keys
        assert all(v.source for v in limits.values())
        for r in sc.rules_for(target):
            if r.measure:
                assert r.limit in limits and r.limit_value == limits[r.limit].value and r.limit_source


def test_a_rule_needs_a_pattern_or_a_measure():
    with pytest.raises(ValueError):
        sc.Rule(id="x", why="y")
    with pytest.raises(ValueError):
        sc.Rule(id="x", why="y", measure="group-memory", limit="l")  # no keyword


# -- each rule fires on a snippet that breaks it and stays quiet on one that does not ---------------------

METAL_GOOD = """
#include <metal_stdlib>
using namespace metal;
#define BM 64
#define BK 32
kernel void k(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
              uint tid [[thread_position_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
              uint gid [[threadgroup_position_in_grid]]) {
    threadgroup float tile[BM][BK + 1];
    threadgroup float* p = &tile[0][0];
    tile[tid % BM][tid % BK] = x[gid * 1024 + tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float v = p[tid];
    v += simd_shuffle_xor(v, 16);
    v = simd_sum(v);
    constexpr int SIMD_WIDTH = 32;
    if (lane == 0) y[gid] = v / SIMD_WIDTH;
}
"""

METAL_BAD = [
    ("cuda-barrier", "void f() { __syncthreads(); }"),
    ("cuda-barrier", "void f() { __syncwarp(); }"),
    ("cuda-warp-intrinsic", "float f(float v) { return v + __shfl_xor_sync(0xffffffff, v, 16); }"),
    ("cuda-warp-intrinsic", "float f(float v) { return __shfl_down_sync(0xffffffff, v, 1); }"),
    ("cuda-memory-space", "void f() { __shared__ float s[32]; }"),
    ("cuda-memory-space", "__global__ void f(float* x) {}"),
    ("cuda-async-copy", 'void f() { asm volatile("cp.async.ca.shared.global [%0], [%1], 16;"); }'),
    ("cuda-async-copy", "void f() { __pipeline_commit(); }"),
    ("cuda-atomic", "void f(device float* x) { atomicAdd(x, 1.0f); }"),
    ("cuda-builtin-index", "void f(device float* x) { x[blockIdx.x * blockDim.x + threadIdx.x] = 0; }"),
    ("cuda-builtin-index", "int f() { return warpSize; }"),
    ("cuda-intrinsic", "float f(float x) { return __expf(x); }"),
    ("cuda-include", "#include <cuda_fp16.h>\nvoid f() {}"),
    ("simd-width", "#define WARP_SIZE 64\nvoid f() {}"),
    ("simd-width", "constexpr int kWavefrontSize = 64;"),
    ("simd-width", "float f(float v) { return simd_shuffle_xor(v, 32); }"),
    ("threadgroup-memory", "#define N 9000\nthreadgroup float big[N];"),
    ("threads-per-threadgroup", "[[kernel, max_total_threads_per_threadgroup(2048)]] void f() {}"),
]


def test_honest_metal_passes():
    assert run("metal", METAL_GOOD) == []


@pytest.mark.parametrize("rule,src", METAL_BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(METAL_BAD)])
def test_metal_rules_fire(rule, src):
    assert rule in hit("metal", src)


def test_every_metal_rule_has_a_breaking_snippet():
    assert {r.id for r in sc.rules_for("metal")} == {r for r, _ in METAL_BAD}


CUDA_GOOD = """
#include <cuda_fp16.h>
typedef unsigned int uint;
#define WARP 32
constexpr int BM = 64, NW = 4;
extern "C" __global__ void __launch_bounds__(256) k(const float* __restrict__ x, float* y, long long n) {
    __shared__ float s[2][BM][33];
    __shared__ float2 w[NW];
    uint i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    s[0][threadIdx.x % BM][threadIdx.x % 33] = v;
    __syncthreads();
    const int device_count = 1;          // `device` as part of a name
    float threadgroup_size = 0.f;        // ... and `threadgroup`
    if (threadIdx.x % warpSize == 0) atomicAdd(y, v + threadgroup_size + device_count);
}
"""

CUDA_BAD = [
    ("metal-only-name", "__global__ void f(float* x) { float v = simd_shuffle_xor(x[0], 16); }"),
    ("metal-only-name", "__global__ void f(float* x) { x[0] = simd_sum(x[0]); }"),
    ("metal-only-name", "__global__ void f() { threadgroup_barrier(mem_flags::mem_threadgroup); }"),
    ("metal-only-name", "__global__ void f() { threadgroup float t[32]; }"),
    ("metal-only-name", "__global__ void f(device float* x) {}"),
    ("metal-only-name", "kernel void f(uint gid [[thread_position_in_grid]]) {}"),
    ("metal-uint", "__global__ void f(float* x) { uint i = threadIdx.x; x[i] = 0; }"),
    ("shared-memory-static", "__global__ void f() { __shared__ float s[2][64][97]; }"),
    ("shared-memory-total", "__global__ void f() { extern __shared__ float s[]; }"),
    ("threads-per-block", "__global__ void __launch_bounds__(2048) f() {}"),
    ("warp-width", "#define WARP_SIZE 64\n__global__ void f() {}"),
    ("warp-width", "__global__ void f(float v) { v += __shfl_xor_sync(0xffffffff, v, 32); }"),
]
CUDA_LAUNCH = {"shared-memory-total": {"launches": [{"kernel": "f", "grid": [1], "block": [128],
                                                     "shared_bytes": "200 * 1024 + 64 * 1024"}]}}


def test_honest_cuda_passes_the_new_rules():
    new = {"metal-only-name", "metal-uint", "shared-memory-static", "shared-memory-total", "threads-per-block", "warp-width"}
    assert not hit("cuda", CUDA_GOOD) & new


@pytest.mark.parametrize("rule,src", CUDA_BAD, ids=[f"{r}-{i}" for i, (r, _) in enumerate(CUDA_BAD)])
def test_cuda_porting_rules_fire(rule, src):
    assert rule in hit("cuda", src, launch=CUDA_LAUNCH.get(rule))


def test_uint_is_fine_in_cuda_when_typedefd():
    src = "typedef unsigned int uint;\n__global__ void f(float* x) { uint i = threadIdx.x; x[i] = 0; }"
    assert "metal-uint" not in hit("cuda", src)
    assert "metal-uint" not in hit("cuda", "using uint = unsigned;\n" + src.split("\n")[1])


def test_threads_from_the_launch_plan():
    plan = {"launches": [{"kernel": "f", "grid": [1], "block": [64, 32]}]}
    f = [x for x in run("cuda", "__global__ void f() {}", launch=plan) if x.rule == "threads-per-block"]
    assert f and "2048 threads" in f[0].why and "1024" in f[0].why
    ok = {"launches": [{"kernel": "f", "grid": [1], "block": [32, 32]}]}
    assert "threads-per-block" not in hit("cuda", "__global__ void f() {}", launch=ok)
    axis = {"launches": [{"kernel": "f", "grid": [1], "block": ["dim"]}]}  # depends on the workload
    assert "threads-per-block" not in hit("cuda", "__global__ void f() {}", launch=axis)
    mlx = {"threadgroup": [32, 64, 1]}
    assert "threads-per-threadgroup" in hit("metal", "float x = 1;", launch=mlx)


# -- the memory computation on realistic kernels -------------------------------------------------------------

CUDA_ATTENTION = """\
// FlashAttention-style forward tile, as written for an H100 (BM 64 queries, BN 64 keys, head dim 64)
#include <cuda_fp16.h>
#define BM 64
#define BN 64
constexpr int D = 64;
template <int STAGES = 2>
__global__ void attn_fwd(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
                         float* __restrict__ O, int L) {
    __shared__ float Qs[BM][D];            // 16 KB
    __shared__ float Kt[D][BN];            // 16 KB, K transposed for QK^T
    __shared__ float Vs[BN][D];            // 16 KB
    const int tid = threadIdx.x;
    float m = -INFINITY, l = 0.f;
    for (int kv = 0; kv < L; kv += BN) {
        __syncthreads();
    }
}
"""


def metal_port(src: str) -> str:
    """The naive port: the same tiles in threadgroup memory, CUDA's barrier spelt the Metal way."""
    return (src.replace("__shared__", "threadgroup").replace("__syncthreads()",
            "threadgroup_barrier(mem_flags::mem_threadgroup)").replace("__global__ void", "kernel void")
            .replace("const float* __restrict__", "device const float*").replace("float* __restrict__", "device float*")
            .replace("threadIdx.x", "tid_").replace("#include <cuda_fp16.h>", "#include <metal_stdlib>"))


def test_a_48kb_cuda_attention_tile_fits_cuda_and_is_caught_on_metal():
    assert hit("cuda", CUDA_ATTENTION) & {"shared-memory-static", "shared-memory-total"} == set()
    ported = metal_port(CUDA_ATTENTION)
    findings = run("metal", ported)
    assert [f.rule for f in findings] == ["threadgroup-memory"]
    f = findings[0]
    assert "49152 B" in f.why and "32768 B" in f.why and "threadgroup_memory_bytes" in f.why
    assert "Qs[BM][D] = 16384 B (line 9)" in f.why and "Apple" in f.why
    assert f.file == "kernel.metal" and f.line == 9 and "Qs" in f.text
    assert str(f).startswith("static check 'threadgroup-memory': kernel.metal:9:")


def test_padding_and_macros_in_a_metal_tile():
    src = "#define BM 128\n#define BK 64\nkernel void k() {\n  threadgroup float tile[BM][BK+1];\n}\n"
    f = run("metal", src)
    assert [x.rule for x in f] == ["threadgroup-memory"] and f[0].line == 4 and "33280 B" in f[0].why
    assert run("metal", src.replace("128", "64")) == []  # 16640 B


def test_mlx_template_values_from_the_launch():
    body = "threadgroup float tile[BM][BK + 1];\nthreadgroup_barrier(mem_flags::mem_threadgroup);"
    assert run("metal", body) == []  # BM, BK unknown: not counted
    f = run("metal", body, launch={"template": [["BM", 128], ["BK", 64]]})
    assert [x.rule for x in f] == ["threadgroup-memory"] and "33280 B" in f[0].why


def test_metal_kernel_with_a_cuda_shuffle_is_caught():
    src = METAL_GOOD.replace("simd_shuffle_xor(v, 16)", "__shfl_xor_sync(0xffffffff, v, 16)")
    f = run("metal", src)
    assert [x.rule for x in f] == ["cuda-warp-intrinsic"]
    assert f[0].line == src.split("\n").index("    v += __shfl_xor_sync(0xffffffff, v, 16);") + 1
    assert "simd_shuffle_xor" in f[0].why


def test_cuda_kernel_with_a_metal_shuffle_is_caught():
    src = CUDA_GOOD.replace("__shfl_xor_sync(0xffffffff, v, o)", "simd_shuffle_xor(v, o)")
    f = [x for x in run("cuda", src) if x.rule == "metal-only-name"]
    assert len(f) == 1 and "simd_shuffle_xor" in f[0].text and "__shfl_xor_sync" in f[0].why


def test_cuda_shared_memory_sums_per_kernel_and_adds_dynamic_bytes():
    two = ("__global__ void a() { __shared__ float s[2][64][33]; }\n"     # 16896 B
           "__global__ void b() { __shared__ float t[8192]; }\n")          # 32768 B: apart, both fit
    assert hit("cuda", two) & {"shared-memory-static", "shared-memory-total"} == set()
    one = "__global__ void a() {\n __shared__ float s[2][64][33];\n __shared__ float t[8192];\n}\n"
    f = [x for x in run("cuda", one) if x.rule == "shared-memory-static"]
    assert f and "49664 B" in f[0].why and "49152 B" in f[0].why and f[0].line == 3
    dyn = {"launches": [{"kernel": "a", "grid": [1], "block": [128], "shared_bytes": 230 * 1024}]}
    f = [x for x in run("cuda", "__global__ void a() {\n extern __shared__ float s[];\n __shared__ float t[1024];\n}",
                        launch=dyn) if x.rule == "shared-memory-total"]
    assert f and "+ 235520 B dynamic" in f[0].why and "232448" in f[0].why


def test_constant_evaluation():
    consts, aliases = constants("#define A 4\n#define B (A * 2 + 1)\nconstexpr int C = B << 2;\n"
                                "static const unsigned D = sizeof(float4) / 4u;\ntemplate <int E = 7, typename T>\n"
                                "typedef half act_t;\n", "metal")
    assert consts == {"A": 4, "B": 9, "C": 36, "D": 4, "E": 7} and aliases == {"act_t": "half"}
    assert evaluate("N * 2", {}) is None and evaluate("1 / 0", {}) is None and evaluate("7/2", {}) == 3
    assert type_bytes("float3", "metal") == 16 and type_bytes("float3", "cuda") == 12
    assert type_bytes("T", "cuda") is None and type_bytes("__half2", "cuda") == 4
    decls, _ = declarations("__shared__ __align__(16) float a[4], b[8];\nextern __shared__ char dyn[];\n"
                            "__shared__ T t[64];\n", "__shared__", "cuda", {}, {})
    assert [(d.name, d.bytes, d.dynamic) for d in decls] == [("a", 16, False), ("b", 32, False),
                                                             ("dyn", 0, True), ("t", None, False)]


# -- the knowledge packs' kernels stay clean under the extended cuda rules ---------------------------------


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
def test_pack_and_naive_cuda_kernels_pass_every_cuda_rule(task):
    t = load_task(task)
    assert run("cuda", t.naive_sources["cuda"], launch=t.naive_launch["cuda"]) == []
    pack = load_pack("selective-scan", "cuda")
    paths = [({"family": f.id}, {}) for f in pack.families] + random_paths(pack, 24, seed=11)
    for choices, knobs in paths:
        k = pack.render(t.definition, choices, knobs)
        cand = Candidate(target="cuda", sources=k.sources, launch=k.launch)
        assert sc.check(cand, sc.rules_for("cuda")) == [], (choices, knobs)


def test_limits_come_from_the_hardware_catalog():
    from ksearch.hardware import catalog

    metal, cuda = sc.limits_for("metal"), sc.limits_for("cuda")
    m1, h200 = catalog.limits("m1-max"), catalog.limits("h200")
    assert metal["threadgroup_memory_bytes"].value == m1.shared_memory_per_block_bytes
    assert cuda["max_shared_bytes_optin"].value == h200.shared_memory_per_block_optin_bytes
    assert metal["threadgroup_memory_bytes"].source.startswith("hardware catalog m1-max")
    fallback = sc.Limit(value=1, source="table", catalog="no-such-device", figure="simd_width").resolved()
    assert (fallback.value, fallback.source) == (1, "table")
