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
        # the naive kernel's state array is local memory by design; a reg_cap under 128 is a move that trades
        # spills for resident warps (the split sequence's), bounded in test_seq_split_compiles_without_spills
        if k.family != "naive" and knobs.get("reg_cap", 0) not in (64, 80):
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


# -- the split sequence (seq_split=segments): two launches, the segments' maps, the fold --------------------------

SEG = {"family": "warp-chunks", **FAST, "bc_tiles": "smem-f32", "lane_decay": "sum", "seq_split": "segments"}


@pytest.mark.parametrize("batch, seqlen, want_segments", [(1, 4096, 4), (1, 512, 2), (1, 100, 1), (8, 4096, 1)])
def test_seq_split_plan_splits_only_where_the_rows_leave_the_machine_idle(packdef, batch, seqlen, want_segments):
    """max_segments 4, seg_waves 8, 8 warps a block: batch 1 of d_inner 2048 is 256 blocks, and 132 x 8 // 256 =
    4 segments where the sequence has 4 chunks; batch 8's 2048 blocks already fill the machine: no split."""
    from ksearch.targets.cuda_launch import parse_plan, resolve

    pack, definition = packdef
    k = pack.render(definition, SEG, {"items_per_thread": 8, "warps": 8, "max_segments": 4, "seg_waves": 8})
    assert [l["kernel"] for l in k.launch["launches"]] == ["ss_segment_reduce", "ss_warp_chunks"]
    assert k.launch["launches"][1]["args"] == ABI + ["seg_a", "seg_b"]
    assert set(k.launch["temporaries"]) == {"seg_a", "seg_b"}
    axes = {"batch": batch, "dim": 2048, "dstate": 16, "seqlen": seqlen}
    assert want_segments == max(1, min(4, -(-seqlen // 256), 132 * 8 // (batch * 2048 // 8)))
    launches = resolve(parse_plan(k.launch, definition), definition, axes)
    grids = {l.kernel: l.grid for l in launches}
    assert grids["ss_warp_chunks"] == (256, batch, want_segments)
    if want_segments > 1:
        assert grids["ss_segment_reduce"] == (256, batch, want_segments - 1)
    else:
        assert "ss_segment_reduce" not in grids      # `when` false: one launch, as without the split
    src = k.sources["kernel.cu"]
    assert "ss_segment_reduce(" in src and "seg_a[o] * h + seg_b[o]" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_seq_split_compiles_without_spills(tmp_path):
    """Both kernels of the split for sm_90 at the 80-register cap with 4 items a lane (3 blocks of 8 warps an SM
    where the uncapped kernel holds 2): no spills (ptxas -v)."""
    pack, definition = load_pack("selective-scan-fp16", "cuda"), load_task("selective-scan-fp16").definition
    k = pack.render(definition, {**SEG, "compile_flags": "fast-math"},
                    {"items_per_thread": 4, "warps": 8, "state_unroll": 2, "reg_cap": 80})
    (tmp_path / "k.cu").write_text(k.sources["kernel.cu"])
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.cubin"), "-Xptxas", "-v", "--use_fast_math"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ss_segment_reduce" in r.stderr and "ss_warp_chunks" in r.stderr
    assert [int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)] and \
        max(int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)) <= 80
    assert set(re.findall(r"(\d+) bytes spill stores", r.stderr)) == {"0"}, r.stderr[-1500:]


def _seq_split_emulated(dt, bu, A, h0, items, nseg):
    """h_t per state of h_t = exp(dt_t A) h_{t-1} + bu_t from h0, as the two kernels compute it: chunks of 32 x items
    tokens, segments of whole chunks (seg_chunks), pass 1's per-lane terms scaled by the dt after them (a suffix sum
    over the lanes as the shfl_down scan builds it, chunks walked backwards), pass 2's fold of h0 through the maps of
    the segments before, then each segment from its own start. dt: (L,), bu: (L,) = dt B u, A: (N,), h0: (N,)."""
    L, chunk = len(dt), 32 * items
    nch = -(-L // chunk)
    cps = -(-nch // nseg)
    segs = [(s * cps, min(s * cps + cps, nch)) for s in range(nseg)]
    pad = np.zeros(nch * chunk * 2 + chunk)
    dtp, bup = pad.copy(), pad.copy()
    dtp[:L], bup[:L] = dt, bu                    # padded tokens: dt 0, b 0 (the identity pair)
    maps = []
    for s in range(nseg - 1):                    # pass 1
        ch0, ch1 = segs[s]
        e, after = np.zeros(len(A)), 0.0
        for ch in range(ch1 - 1, ch0 - 1, -1):
            t0 = [ch * chunk + lane * items for lane in range(32)]
            ls = [dtp[t:t + items].sum() for t in t0]
            sfx = list(ls)
            off = 1
            while off < 32:                      # __shfl_down_sync, inclusive suffix
                sfx = [sfx[l] + (sfx[l + off] if l + off < 32 else 0.0) for l in range(32)]
                off *= 2
            for lane in range(32):
                lane_after = after + sfx[lane] - ls[lane]
                tb = np.zeros(len(A))
                for i in range(items):
                    t = t0[lane] + i
                    tb = np.exp(dtp[t] * A) * tb + bup[t]
                e += np.exp(lane_after * A) * tb
            after += sfx[0]
        maps.append((np.exp(after * A), e))
    h_all, last = np.zeros((L, len(A))), None
    for s in range(nseg):                        # pass 2
        ch0, ch1 = segs[s]
        if ch0 >= ch1:
            continue
        h = h0.copy()
        for P, E in maps[:s]:
            h = P * h + E
        for t in range(ch0 * chunk, min(ch1 * chunk, L)):
            h = np.exp(dt[t] * A) * h + bu[t]
            h_all[t] = h
        if ch1 * chunk >= L:
            last = h
    return h_all, last


@pytest.mark.parametrize("L, items, nseg", [(4096, 8, 4), (1000, 4, 3), (300, 8, 2), (9 * 128, 4, 8), (700, 16, 4),
                                            (64, 4, 1)])
def test_seq_split_segments_match_the_recurrence(L, items, nseg):
    """Including segments that end up empty (9 chunks over 8 segments: 2 a segment, the last three empty) and a
    last chunk cut short by L."""
    rng = np.random.default_rng(L + nseg)
    N = 16
    dt = np.log1p(np.exp(rng.normal(-2.0, 1.0, L)))          # softplus, as the kernels' dt
    bu = dt * rng.normal(size=L)
    A = -np.exp(rng.uniform(-1.0, 2.0, N))
    h0 = rng.normal(size=N)
    h, want = np.zeros((L, N)), h0.copy()
    for t in range(L):
        want = np.exp(dt[t] * A) * want + bu[t]
        h[t] = want
    got, last = _seq_split_emulated(dt, bu, A, h0, items, nseg)
    np.testing.assert_allclose(got, h, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(last, want, rtol=1e-9, atol=1e-9)
