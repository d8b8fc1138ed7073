"""The selective-scan cuda pack: every family renders with a launch plan (docs/cuda-target.md), the sources
compile with nvcc for sm_90 (skipped without nvcc; correctness is checked on the GPU), and the scan algebra the
kernels use is checked in NumPy: the block-scan family's chunked combine (per-thread sequential scan, warp
scan by shuffles-up, cross-warp combine, carry between chunks) and the warp-lanes family's reduce-scatter."""

import itertools
import os
import random
import re
import shutil
import subprocess

import numpy as np
import pytest

from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

TASKS = ["selective-scan", "selective-scan-fp16"]
ABI = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0", "out", "last_state", "batch", "dim", "dstate",
       "seqlen"]
FAST = {"exp": "ex2-approx", "transcendentals": "intrinsics", "loads": "vector"}


@pytest.fixture(scope="module", params=TASKS)
def packdef(request):
    return load_pack(request.param, "cuda"), load_task(request.param).definition


def _paths(pack, n_sampled=6, seed=0):
    """Every family's default path and fast path, plus a seeded sample of full knob combinations."""
    out = []
    for fam in pack.families:
        out.append(({"family": fam.id}, {}))
        fast = {k: v for k, v in FAST.items() if any(d.id == k for d in pack.decisions_for(fam.id))}
        out.append(({"family": fam.id, **fast, "compile_flags": "fast-math"}, {}))
        path = pack.resolve({"family": fam.id, **fast})
        space = [[(k, v) for v in pack.decision(d).choice(c).knobs[k].values]
                 for d, c in path.choices.items() for k in pack.decision(d).choice(c).knobs]
        combos = list(itertools.product(*space))
        for combo in random.Random(seed).sample(combos, min(n_sampled, len(combos))):
            out.append(({"family": fam.id, **fast}, dict(combo)))
    return out


def test_families_render_with_launch_plans(packdef):
    pack, definition = packdef
    assert [f.id for f in pack.families] == ["naive", "block-scan", "warp-lanes", "warp-chunks"]
    for choices, knobs in _paths(pack):
        k = pack.render(definition, choices, knobs)
        assert list(k.sources) == ["kernel.cu"]
        src = k.sources["kernel.cu"]
        assert "#include <cuda_fp16.h>" in src and "<stdio.h>" not in src
        (launch,) = k.launch["launches"]
        assert 'extern "C" __global__' in src and launch["kernel"] in src
        assert launch["args"] == ABI
        assert re.search(r"\bh0\[", src), f"{choices} {knobs}: the initial state h0 is never read"
        assert 1 <= len(launch["grid"]) <= 3 and 1 <= len(launch["block"]) <= 3
        assert k.content_hash != pack.render(definition, {"family": "naive"}).content_hash or choices == {"family": "naive"}


def test_launch_plans_validate_against_the_cuda_target(packdef):
    """Every plan parses against the task's names and resolves to launches for a mamba-370m shape."""
    from ksearch.targets.cuda_launch import parse_plan, resolve

    pack, definition = packdef
    axes = {"batch": 1, "dim": 2048, "dstate": 16, "seqlen": 4096}
    for choices, knobs in _paths(pack, n_sampled=2):
        plan = parse_plan(pack.render(definition, choices, knobs).launch, definition)
        assert resolve(plan, definition, axes), (choices, knobs)


def test_launch_block_sizes_match_launch_bounds(packdef):
    pack, definition = packdef
    for choices, knobs in _paths(pack):
        k = pack.render(definition, choices, knobs)
        block = k.launch["launches"][0]["block"][0]
        assert isinstance(block, int) and block % 32 == 0 and block <= 1024
        assert f"__launch_bounds__({block})" in k.sources["kernel.cu"] or f"#define NT {block}" in k.sources["kernel.cu"] \
            or f"#define NTH {block}" in k.sources["kernel.cu"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_sources_compile_for_sm90(packdef, tmp_path):
    """The same CUDA C++ NVRTC gets (no host headers), compiled by nvcc as a proxy: errors and spills."""
    from concurrent.futures import ThreadPoolExecutor

    pack, definition = packdef

    def compile_one(i, choices, knobs):
        k = pack.render(definition, choices, knobs)
        src = tmp_path / f"k{i}.cu"
        src.write_text(k.sources["kernel.cu"])
        flags = [f for f in k.compile_flags if f == "--use_fast_math"]
        r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / f"k{i}.cubin"),
                            "-Xptxas", "-v", *flags], capture_output=True, text=True, timeout=180)
        return choices, knobs, k, r

    paths, seen = [], set()
    # three sampled knob combinations a family (the renders of all six are checked above), one for the fp16 task
    # (the same templates with another element type: its dtype-specific lines are in every render); a source that
    # differs only in its first line (the path comment: a knob the family does not read) compiles once
    for choices, knobs in _paths(pack, n_sampled=3 if definition.inputs["u"].dtype == "float32" else 1):
        k = pack.render(definition, choices, knobs)
        key = (k.sources["kernel.cu"].split("\n", 1)[1], tuple(k.compile_flags))
        if key not in seen:
            seen.add(key)
            paths.append((choices, knobs))
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:  # nvcc runs are independent
        results = list(pool.map(lambda a: compile_one(*a), [(i, c, kn) for i, (c, kn) in enumerate(paths)]))
    for choices, knobs, k, r in results:
        assert r.returncode == 0, f"{choices} {knobs}:\n{r.stderr[-3000:]}"
        if k.family != "naive":   # the naive kernel's state array is local memory by design
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", r.stderr)]
            assert spills and max(spills) <= 64, f"{choices} {knobs} spills:\n{r.stderr[-1500:]}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("task", TASKS)
def test_naive_task_kernel_compiles_for_sm90(task, tmp_path):
    """The task's own naive.cuda.cu (the baseline every GPU speedup is measured against) takes h0 and compiles."""
    t = load_task(task)
    src = t.naive_sources["cuda"]
    assert "const float *h0" in src and re.search(r"\bh0\[", src)
    assert t.naive_launch["cuda"]["launches"][0].get("args", ABI) == ABI
    (tmp_path / "k.cu").write_text(src)
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]


# -- the scan algebra, emulated ---------------------------------------------------------------------------------

def _compose(p, q):
    """(a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2): p first, then q."""
    return p[0] * q[0], q[0] * p[1] + q[1]


def _block_scan_emulated(a, b, threads, items):
    """h_t of h_t = a_t h_{t-1} + b_t, h_{-1} = 0, computed as the block-scan kernel does (one state)."""
    L, chunk, nw = len(a), threads * items, max(1, threads // 32)
    h_out, carry = np.zeros(L), 0.0
    for c0 in range(0, L, chunk):
        pairs = []
        for tid in range(threads):
            idx = [c0 + tid * items + i for i in range(items)]
            it = [(a[t], b[t]) if t < L else (1.0, 0.0) for t in idx]   # padded tokens: the identity
            agg = (1.0, 0.0)
            for p in it:
                agg = _compose(agg, p)
            pairs.append((idx, it, agg))
        incl = [p[2] for p in pairs]
        for w in range(nw):                                # Hillis-Steele scan with __shfl_up_sync
            lanes = incl[w * 32:(w + 1) * 32]
            off = 1
            while off < 32:
                lanes = [lanes[i] if i < off else _compose(lanes[i - off], lanes[i]) for i in range(len(lanes))]
                off *= 2
            incl[w * 32:(w + 1) * 32] = lanes
        wtot = [incl[w * 32 + min(31, threads - 1 - w * 32)] for w in range(nw)]
        total = (1.0, 0.0)
        for wt in wtot:
            total = _compose(total, wt)
        for tid, (idx, it, _) in enumerate(pairs):
            w, lane = divmod(tid, 32)
            pre = (1.0, 0.0)
            for wt in wtot[:w]:
                pre = _compose(pre, wt)
            ex = (1.0, 0.0) if lane == 0 else incl[tid - 1]
            h = pre[0] * carry + pre[1]
            h = ex[0] * h + ex[1]
            for t, (ai, bi) in zip(idx, it):
                h = ai * h + bi
                if t < L:
                    h_out[t] = h
        carry = total[0] * carry + total[1]
    return h_out, carry


@pytest.mark.parametrize("L, threads, items", [(333, 32, 4), (333, 64, 8), (1000, 128, 4), (5, 32, 16), (4096, 64, 16)])
def test_block_scan_chunked_combine_matches_the_recurrence(L, threads, items):
    rng = np.random.default_rng(L + threads)
    a = np.exp(-rng.uniform(0.0, 0.5, L))
    b = rng.normal(size=L)
    h, want = np.zeros(L), 0.0
    for t in range(L):
        want = a[t] * want + b[t]
        h[t] = want
    got, carry = _block_scan_emulated(a, b, threads, items)
    np.testing.assert_allclose(got, h, rtol=1e-12, atol=1e-12)
    assert carry == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("lanes", [4, 8, 16, 32])
def test_warp_lanes_reduce_scatter_leaves_token_r_in_lane_r(lanes):
    rng = np.random.default_rng(lanes)
    p = [list(rng.normal(size=lanes)) for _ in range(lanes)]        # p[lane][token]
    want = np.sum(np.array(p), axis=0)
    m = lanes // 2
    while m >= 1:                                                   # as the kernel: shfl_xor by m
        send = [[(p[r][i] if r & m else p[r][i + m]) for i in range(m)] for r in range(lanes)]
        p = [[(p[r][i + m] if r & m else p[r][i]) + send[r ^ m][i] for i in range(m)] + p[r][m:] for r in range(lanes)]
        m //= 2
    np.testing.assert_allclose([p[r][0] for r in range(lanes)], want, rtol=1e-12)


def test_gpu_bench_kernels_file_matches_the_packs():
    """bench/gpu/selective_scan_kernels.json (used on the device when ksearch cannot be imported there) is the
    packs' current rendering: refresh with `python bench/gpu/selective_scan_h200.py --render`."""
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench" / "gpu"
    sys.path.insert(0, str(bench))
    try:
        import selective_scan_h200 as b
    finally:
        sys.path.remove(str(bench))
    assert json.loads(b.KERNELS_FILE.read_text()) == json.loads(json.dumps(b.render_all()))
