"""The attention cuda pack (prefill, causal and non-causal). Without a GPU: every family's default path and every
single move from a family's root renders, passes the cuda static rules and limits, its launch plan parses and
resolves for every workload of both tasks (exactly one launch runs on each), and the distinct sources compile with
nvcc -arch=sm_90 without spills over 64 bytes (skipped without nvcc). The templates are ready for the bfloat16
tasks: those renders pass the static rules (their NVRTC compile without module state is
tests/targets/test_nvrtc.py's, same sources, options and kernel names). The flash kernel's tile loop is emulated in
NumPy lane by lane through models of the PTX instructions it uses (mma.m16n8k16 fragments and ldmatrix, as the PTX
ISA defines them) against the tasks' float64 references, in float16 and bfloat16, and deliberate layout bugs are
shown to fail: this checks the fragment indexing the kernel spells out, not the CUDA code's execution. Nothing here
has run on a GPU."""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from ksearch.eval import static_checks
from ksearch.knowledge import load_pack
from ksearch.targets import cuda_launch
from ksearch.tasks import inputs, load_task

from .paths import single_moves

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
#: not in the pack's tasks yet: its templates are ready for them (the element type follows the task's dtype)
BF16_TASKS = ["attention-prefill-bf16", "attention-prefill-noncausal-bf16"]


@pytest.fixture(scope="module")
def pack():
    return load_pack("attention-prefill", "cuda")


MOVES = single_moves(load_pack("attention-prefill", "cuda"))


def test_moves_cover_both_families_and_every_decision():
    assert {c["family"] for c, _ in MOVES} == {"naive-rows", "flash"}
    assert {d for c, _ in MOVES for d in c if d != "family"} == {"kv_pipeline", "q_tile", "exp", "masking", "schedule"}


def test_description_says_what_ran_on_a_gpu_and_what_did_not(pack):
    assert "RAN ON THE H200" in pack.description and "NOT RUN ON A GPU" in pack.description


@pytest.mark.parametrize("task", TASKS)
def test_every_move_renders_passes_static_rules_and_resolves_on_every_workload(pack, task):
    t = load_task(task)
    d = t.definition
    rules = static_checks.rules_for("cuda")
    for choices, knobs in MOVES:
        k = pack.render(d, choices, knobs)
        src = k.sources["kernel.cu"]
        assert src == pack.render(d, choices, knobs).sources["kernel.cu"]
        findings = static_checks.check(k.candidate(), rules)
        assert findings == [], f"{k.choices} {k.knobs}: " + "; ".join(map(str, findings))
        if k.family == "flash":
            assert f"constexpr bool CAUSAL = {'true' if task == 'attention-prefill' else 'false'};" in src
        plan = cuda_launch.parse_plan(k.launch, d)
        for launch in plan.launches:
            assert launch.kernel in src
        for w in t.workloads:
            axes = {**w.axes, "causal": 1 if task == "attention-prefill" else 0}
            for hd in sorted({axes["head_dim"], 16, 80, 200, 256}):   # also head_dims of hidden workloads
                ax = {**axes, "head_dim": hd}
                runs = cuda_launch.resolve(plan, d, ax, max_shared_bytes=232448)
                assert len(runs) == 1, (k.choices, k.knobs, ax)


@pytest.fixture(scope="module")
def bf16_pack(pack):
    """The pack with the bfloat16 tasks added to its `tasks` (its signature already takes bfloat16)."""
    return pack.model_copy(update={"tasks": [*pack.tasks, *BF16_TASKS]})


def _flash_bf16_source(bf16_pack):
    return bf16_pack.render(load_task(BF16_TASKS[0]).definition, {"family": "flash"}, {})


@pytest.mark.parametrize("task", BF16_TASKS)
def test_bf16_renders_take_the_element_type_from_the_task(bf16_pack, task):
    rules = static_checks.rules_for("cuda")
    for fam in ("naive-rows", "flash"):
        k = bf16_pack.render(load_task(task).definition, {"family": fam}, {})
        src = k.sources["kernel.cu"]
        assert static_checks.check(k.candidate(), rules) == []
        assert "__half" not in src and "typedef __nv_bfloat16 elem_t;" in src and "__nv_bfloat16 *__restrict__ o" in src
        if fam == "flash":
            assert ".f32.bf16.bf16.f32" in src and ".f16" not in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_sources_compile_for_sm90_without_spills(pack, bf16_pack, tmp_path):
    """The CUDA C++ NVRTC gets, compiled by nvcc as a proxy (errors, registers, spills): every single move of the
    causal task, the non-causal and the bfloat16 flash defaults; sources that differ only in their first line (the
    path comment: block_m 64 and warps 4 render the same kernel) compile once."""
    from concurrent.futures import ThreadPoolExecutor

    jobs, seen = [], set()
    for task, c, kn in [(TASKS[0], c, kn) for c, kn in MOVES] + [(TASKS[1], {"family": "flash"}, {})]:
        k = pack.render(load_task(task).definition, c, kn)
        body = k.sources["kernel.cu"].split("\n", 1)[1]
        if body not in seen:
            seen.add(body)
            jobs.append((f"{task} {c} {kn}", k))
    jobs.append((f"{BF16_TASKS[0]} flash", _flash_bf16_source(bf16_pack)))

    def compile_one(i, label, k):
        src = tmp_path / f"k{i}.cu"
        src.write_text(k.sources["kernel.cu"])
        r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / f"k{i}.cubin"),
                            "-Xptxas", "-v"], capture_output=True, text=True, timeout=300)
        return label, k, r

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda a: compile_one(*a), [(i, *j) for i, j in enumerate(jobs)]))
    for label, k, r in results:
        assert r.returncode == 0, f"{label}:\n{r.stderr[-3000:]}"
        if k.family != "naive-rows":   # the naive kernel's row arrays are local memory by design
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", r.stderr)]
            assert len(spills) == 3 and max(spills) <= 64, f"{label} spills:\n{r.stderr[-2000:]}"


# -- PTX fragment semantics, lane by lane ---------------------------------------------------------------------------
# Every register a lane holds is modelled as a pair of values (the low and the high 16 bits of a .b32 holding two
# 16-bit elements; C fragments hold single floats). G = lane / 4 ("groupID"), T = lane % 4 ("threadID_in_group").

LANE = np.arange(32)
G, T = LANE // 4, LANE % 4
_P = np.arange(2)                     # the element of a pair (low half first)


def _mma_maps():
    """(rows, cols) of each fragment element, PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
    type" (.f16 / .bf16 A and B, .f32 C and D): A (16x16, .row) a_i, i = 0..7 (register i // 2): row G for
    i in {0, 1, 4, 5}, else G + 8; column 2 T + (i & 1), + 8 for i >= 4. B (16x8, .col) b_i, i = 0..3 (register
    i // 2): row 2 T + (i & 1), + 8 for i >= 2; column G. C/D (16x8) c_i, i = 0..3: row G, + 8 for i >= 2;
    column 2 T + (i & 1). Shapes: A (32, 4, 2), B (32, 2, 2), C (32, 4)."""
    i = np.arange(8)[None, :]
    a = (G[:, None] + 8 * ((i // 2) % 2), 2 * T[:, None] + (i & 1) + 8 * (i >= 4))
    i = np.arange(4)[None, :]
    b = (2 * T[:, None] + (i & 1) + 8 * (i >= 2), np.broadcast_to(G[:, None], (32, 4)))
    c = (G[:, None] + 8 * (i >= 2), 2 * T[:, None] + (i & 1))
    return ([x.reshape(32, 4, 2) for x in a], [x.reshape(32, 2, 2) for x in b], c)


(A_R, A_C), (B_R, B_C), (C_R, C_C) = _mma_maps()


def mma_m16n8k16(a, b, c):
    """mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d = A B + C with the fragments of the warp's lanes
    gathered into matrices by the PTX maps, the product in float64 (fp32 on the device). a: (32, 4, 2), b: (32, 2,
    2), c: (32, 4); returns d (32, 4)."""
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    A[A_R, A_C], B[B_R, B_C], C[C_R, C_C] = a, b, c
    return (A @ B + C)[C_R, C_C]


def ldmatrix_x4(tile, rows, cols, trans=False):
    """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load instruction:
    ldmatrix"): lanes 8i .. 8i + 7 give the addresses of rows 0..7 of matrix i (8 consecutive elements each:
    here tile[rows[l], cols[l]:cols[l] + 8]); lane l receives in register i elements [G][2 T + {0, 1}] of matrix
    i, with .trans [2 T + {0, 1}][G]. tile: 2-D shared-memory array in elements; rows, cols: (32,) ints.
    Returns (32, 4, 2)."""
    m = tile[rows[:, None], cols[:, None] + np.arange(8)].reshape(4, 8, 8)
    x = m[:, 2 * T[:, None] + _P, G[:, None]] if trans else m[:, G[:, None], 2 * T[:, None] + _P]
    return x.transpose(1, 0, 2)


def test_fragment_maps_cover_each_element_once():
    """The A, B and C maps are bijections of the warp's registers onto the 16x16, 16x8 and 16x8 matrices, and
    ldmatrix.x4 (with .trans) returns each element of its four 8x8 matrices exactly once."""
    for (r, c), shape in (((A_R, A_C), (16, 16)), ((B_R, B_C), (16, 8)), ((C_R, C_C), (16, 8))):
        assert sorted(zip(r.ravel().tolist(), c.ravel().tolist())) == [(i, j) for i in range(shape[0])
                                                                       for j in range(shape[1])]
    tile = np.arange(16 * 16, dtype=float).reshape(16, 16)
    for trans in (False, True):
        got = ldmatrix_x4(tile, LANE & 15, (LANE >> 4) * 8, trans)
        assert sorted(got.ravel().tolist()) == tile.ravel().tolist()
    a = ldmatrix_x4(tile, LANE & 15, (LANE >> 4) * 8)   # the kernel's Q addressing is the A fragment of tile
    assert (a == tile[A_R, A_C]).all()


# -- the flash kernel's tile loop through those fragments -------------------------------------------------------------

def _round(x, dtype):
    """x rounded to the 16-bit element type (nearest even), as float64."""
    if dtype == "bfloat16":
        return inputs.to_float64(inputs.bf16_from_f32(np.asarray(x, np.float32)), "bfloat16")
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def _kernel_source():
    return load_pack("attention-prefill", "cuda").render(load_task(TASKS[0]).definition, {"family": "flash"},
                                                         {}).sources["kernel.cu"]


def _lane_addressing(src):
    """The kernel's ldmatrix lane addresses (a_off for Q and V, k_off for K in flash.cu.j2), read from the
    rendered source and evaluated for the 32 lanes (C's &, >>, * and + on small ints are Python's): (row, column)
    in the 16x16 block each lane points at, as ((a_row, a_col), (k_row, k_col))."""
    ldh = 1 << 12
    out = []
    for name in ("a_off", "k_off"):
        expr = re.search(rf"const unsigned {name} = 2u \* \((.+)\);", src).group(1)
        off = eval(expr, {"lane": LANE, "LDH": ldh})
        out.append(divmod(off, ldh))
    return out


def _p_registers(src):
    """The A fragment of P V as the kernel packs it: for each of its 4 registers, (n-tile offset from 2 kk, the
    two C elements), read from the rendered source's pack2(sacc[..][..], sacc[..][..]) list."""
    calls = re.findall(r"pack2\(sacc\[2 \* kk( \+ 1)?\]\[(\d)\], sacc\[2 \* kk( \+ 1)?\]\[(\d)\]\)", src)
    assert len(calls) == 4 and all(a == b for a, _, b, _ in calls), calls
    return [(1 if a else 0, int(e0), int(e1)) for a, e0, _, e1 in calls]


SRC = _kernel_source()
(A_ROW, A_COL), (K_ROW, K_COL) = _lane_addressing(SRC)
P_REGS = _p_registers(SRC)


def test_the_emulated_addressing_is_the_kernels():
    """The emulation below runs the lane addresses and the P packing read from the rendered kernel; they are the
    ones the ldmatrix and mma fragment maps call for (Q and V: matrices (rows 0-7, cols 0-7), (8-15, 0-7),
    (0-7, 8-15), (8-15, 8-15); K: (keys 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)); the kernel
    loads Q and K without .trans, V with it, through the PTX named, and spells the per-step offsets, the mma calls
    and the mask as _flash_fragments mirrors them."""
    assert (A_ROW == LANE % 16).all() and (A_COL == LANE // 16 * 8).all()
    assert (K_ROW == LANE % 8 + LANE // 16 * 8).all() and (K_COL == LANE // 8 % 2 * 8).all()
    assert P_REGS == [(0, 0, 1), (0, 2, 3), (1, 0, 1), (1, 2, 3)]
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in SRC
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in SRC
    assert "ldsm_x4(qa, " in SRC and "ldsm_x4(kb, " in SRC and "ldsm_x4_trans(vb, " in SRC
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in SRC
    for call in ("mma16816(sacc[2 * jj], qa, kb[0], kb[1])", "mma16816(sacc[2 * jj + 1], qa, kb[2], kb[3])",
                 "mma16816(oacc[2 * dp], pa, vb[0], vb[1])", "mma16816(oacc[2 * dp + 1], pa, vb[2], vb[3])",
                 "q_sa + 32u * kd", "k_sa + 2u * (jj * 16 * LDH + kd * 16)", "v_sa + 2u * (kk * 16 * LDH + dp * 16)",
                 "const int c = 8 * j + 2 * tq + (e & 1), rr = g + 8 * (e >> 1);",
                 "if (c >= kvalid || (CAUSAL && c - rr > diag)) x = neg_inf();"):
        assert call in SRC, call


def _flash_fragments(q, k, v, causal, BM, BN, dtype="float16", masking="diagonal-only", exp2=True,
                     heavy_first=True, wrong=None):
    """o as flash.cu.j2 computes it, lane by lane: blocks of BM = 16 W query rows, a warp per 16 rows, key tiles
    of BN in zero-padded shared tiles of HDP columns, S = Q K^T and O += P V through ldmatrix_x4 and mma_m16n8k16
    with the kernel's lane addresses, the online softmax on the C fragments (row max over the 4 lanes of a row
    group by xor-1 and xor-2 shuffles, each lane's partial row sum reduced at the end), P packed from two 8-key
    C fragments into the A fragment of a 16-key k-step, rounded to `dtype`, and o rounded to `dtype`.
    q: (batch, q_heads, L, D), k, v: (batch, kv_heads, L, D), values of `dtype`. `wrong`: a deliberate layout
    bug ('v-no-trans': V loaded without .trans; 'k-as-a': K with the A addressing; 'p-order': P's registers 1 and
    2 swapped) that the tests show the reference catches."""
    batch, hq, L, D = q.shape
    group = hq // k.shape[1]
    HDP = next(h for h in (64, 128, 256) if D <= h)
    NS, NO, W = BN // 8, HDP // 8, BM // 16
    ex = np.exp2 if exp2 else np.exp
    scale = (np.log2(np.e) if exp2 else 1.0) / np.sqrt(D)
    k_row, k_col = (A_ROW, A_COL) if wrong == "k-as-a" else (K_ROW, K_COL)
    c_of = 8 * np.arange(NS)[None, :, None] + 2 * T[:, None, None] + (np.arange(4) & 1)   # (32, NS, 4) tile key
    r_of = np.broadcast_to(G[:, None, None] + 8 * (np.arange(4) >> 1), c_of.shape)        # and warp row
    half = np.array([0, 0, 1, 1])             # C element e -> the lane's row (g, g + 8)

    def tile(x, r0, rows):
        out = np.zeros((rows, HDP))
        n = max(0, min(rows, L - r0))
        out[:n, :D] = x[r0:r0 + n]
        return out

    o = np.full(q.shape, np.nan)
    mblocks = -(-L // BM)
    for bh in range(batch * hq):
        b, h = divmod(bh, hq)
        kh, vh = k[b, h // group], v[b, h // group]
        for x in range(mblocks):
            m0 = (mblocks - 1 - x if (causal and heavy_first) else x) * BM
            Qs = tile(q[b, h], m0, BM)
            ntiles = -(-(min(L, m0 + BM) if causal else L) // BN)
            for warp in range(W):
                r0 = m0 + 16 * warp
                oacc, lrow = np.zeros((32, NO, 4)), np.zeros((32, 2))
                mrow = np.full((32, 2), -np.inf)
                for t in range(ntiles):
                    n0 = t * BN
                    if r0 >= L or (causal and n0 > r0 + 15):
                        continue
                    Ks, Vs = tile(kh, n0, BN), tile(vh, n0, BN)
                    s = np.zeros((32, NS, 4))
                    for kd in range(HDP // 16):
                        qa = ldmatrix_x4(Qs, 16 * warp + A_ROW, 16 * kd + A_COL)
                        for jj in range(NS // 2):
                            kb = ldmatrix_x4(Ks, 16 * jj + k_row, 16 * kd + k_col)
                            s[:, 2 * jj] = mma_m16n8k16(qa, kb[:, :2], s[:, 2 * jj])
                            s[:, 2 * jj + 1] = mma_m16n8k16(qa, kb[:, 2:], s[:, 2 * jj + 1])
                    s = s * scale
                    if masking == "every-tile" or n0 + BN > L or (causal and n0 + BN - 1 > r0):
                        kvalid, diag = min(L - n0, BN), min(r0 - n0, BN)
                        s[(c_of >= kvalid) | ((c_of - r_of > diag) if causal else False)] = -np.inf
                    mx = np.stack([s[:, :, :2].max(axis=(1, 2)), s[:, :, 2:].max(axis=(1, 2))], axis=1)
                    mx = np.maximum(mx, mx[LANE ^ 1])
                    mx = np.maximum(mx, mx[LANE ^ 2])
                    mnew = np.maximum(mrow, mx)
                    mu = np.where(mnew == -np.inf, 0.0, mnew)
                    alpha = ex(mrow - mu)
                    mrow = mnew
                    p = ex(s - mu[:, None, half])
                    lrow = lrow * alpha + np.stack([p[:, :, :2].sum(axis=(1, 2)), p[:, :, 2:].sum(axis=(1, 2))], 1)
                    oacc *= alpha[:, None, half]
                    for kk in range(NS // 2):
                        regs = [p[:, 2 * kk + n, [e0, e1]] for n, e0, e1 in P_REGS]
                        if wrong == "p-order":
                            regs[1], regs[2] = regs[2], regs[1]
                        pa = _round(np.stack(regs, axis=1), dtype)
                        for dp in range(HDP // 16):
                            vb = ldmatrix_x4(Vs, 16 * kk + A_ROW, 16 * dp + A_COL, trans=wrong != "v-no-trans")
                            oacc[:, 2 * dp] = mma_m16n8k16(pa, vb[:, :2], oacc[:, 2 * dp])
                            oacc[:, 2 * dp + 1] = mma_m16n8k16(pa, vb[:, 2:], oacc[:, 2 * dp + 1])
                l = lrow + lrow[LANE ^ 1]
                l = l + l[LANE ^ 2]
                inv = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)
                for i in range(2):
                    qi = r0 + G + 8 * i
                    for dn in range(NO):
                        for j in range(2):
                            d = 8 * dn + 2 * T + j
                            ok = (qi < L) & (d < D)
                            o[b, h, qi[ok], d[ok]] = _round(oacc[ok, dn, 2 * i + j] * inv[ok, i], dtype)
    return o


def _case(task, shape, seed):
    """(q, k, v) of the task's dtype as float64 values, and the task's reference output and tolerance."""
    batch, hq, hkv, L, D = shape
    rng = np.random.default_rng(seed)
    definition = load_task(task).definition
    dtype = definition.inputs["q"].dtype
    q, k, v = (_round(rng.normal(size=(batch, h, L, D)), dtype) for h in (hq, hkv, hkv))
    ns = {}
    exec(definition.reference, ns)
    return (q, k, v), ns["run"](q, k, v), definition.tolerance[dtype], dtype


#: (batch, q_heads, kv_heads, L, D), (BM, BN): GQA, odd L, D padded in the 64, 128 and 256 buckets, L = 1
SHAPES = [((1, 4, 2, 77, 80), (64, 32)), ((2, 2, 2, 33, 64), (128, 64)), ((1, 3, 1, 1, 16), (64, 64)),
          ((1, 2, 1, 130, 37), (64, 64)), ((1, 2, 1, 40, 200), (64, 32))]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("shape, tiles", SHAPES)
def test_flash_fragments_match_the_reference(task, shape, tiles):
    (q, k, v), ref, tol, dtype = _case(task, shape, seed=shape[3] * 7 + shape[4])
    causal = task == "attention-prefill"
    for masking in ("diagonal-only", "every-tile"):
        got = _flash_fragments(q, k, v, causal, *tiles, dtype=dtype, masking=masking)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("task", BF16_TASKS)
def test_flash_fragments_in_bfloat16_match_the_reference(task):
    """The bf16 render's arithmetic (P and o rounded to bfloat16) within the bf16 tasks' tolerance."""
    (q, k, v), ref, tol, dtype = _case(task, (1, 4, 2, 77, 80), seed=5)
    assert dtype == "bfloat16"
    got = _flash_fragments(q, k, v, task == "attention-prefill-bf16", 64, 32, dtype=dtype)
    np.testing.assert_allclose(got, ref, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("wrong", ["v-no-trans", "k-as-a", "p-order", "no-causal-mask"])
def test_flash_fragments_with_a_wrong_layout_fail(wrong):
    """The emulation is sensitive to the layouts: each deliberate bug misses the reference by far."""
    (q, k, v), ref, tol, dtype = _case("attention-prefill", (1, 2, 1, 50, 64), seed=3)
    if wrong == "no-causal-mask":
        got = _flash_fragments(q, k, v, False, 64, 32)
    else:
        got = _flash_fragments(q, k, v, True, 64, 32, wrong=wrong)
    assert np.abs(got - ref).max() > 10 * (tol.atol + tol.rtol)
