"""The selective-scan mlx-metal pack: every path the offline proposer can reach renders a kernel body and an MLX
launch (docs/mlx-target.md) that pass the mlx-metal static rules and limits; broken variants fail them with a
readable message; the launches cover every row of every workload with whole threadgroups of at most 1024 threads.

No Metal compiler or Apple GPU runs here, so the Metal code itself is not compiled. What is checked of the
arithmetic is the *algorithm* the simd-chunks and simd-lanes templates encode, emulated in NumPy on arrays with an
explicit 32-lane axis (lane-sequential compose, simd_shuffle_up scan with the carry in front, replay; broadcast
and reduce-scatter by simd_shuffle / simd_shuffle_xor; the threadgroup tile staging loop), with the constants
read from the rendered kernel and its launch, against the task's float64 reference.
"""

import itertools
import math
import re

import numpy as np
import pytest

from ksearch.eval import static_checks as sc
from ksearch.eval import static_limits as sl
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.tasks import Workload, load_task
from ksearch.tasks.definition import eval_expr
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference

TASKS = ["selective-scan", "selective-scan-fp16"]
TARGET = "mlx-metal"
LOG2E = 1.4426950408889634


@pytest.fixture(scope="module", params=TASKS)
def packtask(request):
    return load_pack(request.param, TARGET), load_task(request.param)


def all_paths(pack):
    """Every full path the offline proposer can reach: each family x every choice of each of its decisions x
    every value of each knob of the chosen choices."""
    out = []
    for fam in pack.families:
        decisions = pack.decisions_for(fam.id)
        for combo in itertools.product(*[d.choices for d in decisions]):
            choices = {"family": fam.id, **{d.id: c.id for d, c in zip(decisions, combo)}}
            knobs = [(k, kn.values) for c in combo for k, kn in c.knobs.items()]
            for values in itertools.product(*[v for _, v in knobs]):
                out.append((choices, dict(zip([k for k, _ in knobs], values))))
    return out


def candidate(k) -> Candidate:
    return Candidate(target=TARGET, sources=dict(k.sources), entry_point=k.entry_point, launch=dict(k.launch))


def findings(cand: Candidate) -> list:
    return sc.check(cand, sc.rules_for(TARGET))


# -- rendering and static checks ------------------------------------------------------------------------------

def test_every_reachable_path_renders_a_body_and_a_launch(packtask):
    pack, task = packtask
    assert [f.id for f in pack.families] == ["naive", "simd-chunks", "simd-lanes"]
    paths = all_paths(pack)
    assert len(paths) == 2 * (4 * 2 + 3 * 4 * 2 * 2 + 3 * 4 * 2)   # transcendentals x (naive, simd-chunks, simd-lanes)
    hashes = set()
    for choices, knobs in paths:
        k = pack.render(task.definition, choices, knobs)
        assert list(k.sources) == ["kernel.metal"] and k.target == TARGET
        body = k.sources["kernel.metal"]
        assert set(k.launch) <= {"grid", "threadgroup", "template"} and len(k.launch["grid"]) == 3
        assert len(k.launch["threadgroup"]) == 3
        # the body is a body: no signature, no redeclared inputs, every template constant it uses is launched
        assert "kernel void" not in body and "[[kernel]]" not in body
        tmpl = k.launch.get("template", {})
        used = {n for n in ("NI", "NSG", "LPR") if re.search(rf"\b{n}\b", body)}
        assert used == set(tmpl), (choices, knobs, used, tmpl)
        assert not set(tmpl) & ({*task.definition.inputs, *task.definition.outputs, *task.definition.axes})
        assert all(isinstance(v, int) for v in tmpl.values())
        # state in fp32 whatever the input dtype; the decay is the one the path chose
        assert re.search(r"\bhalf\s+(h|carry|A2)\b", body) is None
        want = "metal::fast::exp2(" if k.choices["exp"] == "exp2" else "metal::exp(dt"
        assert want in body
        fast = k.choices["transcendentals"] == "fast"
        assert ("metal::fast::log(1.0f + metal::fast::exp(" in body) == fast
        assert ("metal::log(1.0f + metal::exp(" in body) == (not fast)
        if task.definition.outputs["out"].dtype == "float16":
            assert "static_cast<float16_t>" in body
        hashes.add(k.content_hash)
    assert len(hashes) == len(paths)                               # every path is a different candidate


def test_every_reachable_path_passes_the_mlx_metal_static_rules(packtask):
    pack, task = packtask
    rules = sc.rules_for(TARGET)
    assert {r.id for r in rules} >= {"threadgroup-memory", "threads-per-threadgroup", "cuda-barrier",
                                     "cuda-warp-intrinsic", "cuda-memory-space", "simd-width", "mlx-kernel-signature"}
    for choices, knobs in all_paths(pack):
        k = pack.render(task.definition, choices, knobs)
        assert findings(candidate(k)) == [], (choices, knobs)


def _threadgroup_arrays(k):
    """The threadgroup arrays the static limit measures in a rendered body (element type, bytes)."""
    cand = candidate(k)
    code = "\n".join(t for _, t in sc.views(cand).code["kernel.metal"])
    consts, aliases = sl.constants(code, "metal", dict(k.launch.get("template", {})))
    decls, _ = sl.declarations(code, "threadgroup", "metal", consts, aliases)
    return decls


def test_staged_tiles_are_measured_and_fit_half_the_threadgroup_memory(packtask):
    """The tile the static limit measures is the tile the template sizes (it is counted, not skipped as
    unresolvable), and it stays within 16 KB of Apple's 32 KB."""
    pack, task = packtask
    es = 2 if task.definition.inputs["B"].dtype == "float16" else 4
    seen = set()
    for choices, knobs in all_paths(pack):
        k = pack.render(task.definition, choices, knobs)
        decls = _threadgroup_arrays(k)
        if choices.get("bc_tiles") != "threadgroup":
            assert decls == [], (choices, knobs)
            continue
        (tile,) = decls
        sgmax = int(re.search(r"constexpr int SGMAX = (\d+);", k.sources["kernel.metal"]).group(1))
        chunk = 32 * knobs["items_per_lane"]
        assert tile.type == ("half" if es == 2 else "float")
        assert tile.bytes == 2 * sgmax * chunk * es <= 16384, (knobs, tile.describe())
        assert sgmax == min(16, 16384 // (2 * chunk * es))
        seen.add(tile.bytes)
    assert seen


def _staged(pack, task, ni=16):
    return pack.render(task.definition, {"family": "simd-chunks", "bc_tiles": "threadgroup"},
                       {"items_per_lane": ni, "simdgroups": 4})


def test_a_tile_over_32_kb_is_rejected_with_the_limit_and_the_line(packtask):
    pack, task = packtask
    k = _staged(pack, task)
    body = re.sub(r"constexpr int SGMAX = \d+;", "constexpr int SGMAX = 64;", k.sources["kernel.metal"])
    cand = candidate(k).model_copy(update={"sources": {"kernel.metal": body}})
    (f,) = [x for x in findings(cand) if x.rule == "threadgroup-memory"]
    es = 2 if task.definition.inputs["B"].dtype == "float16" else 4
    msg = str(f)
    assert f"{2 * 64 * 512 * es} B" in msg and "32768" in msg and "bc_tile" in msg
    assert "threadgroup" in f.text and f.line == body.split("\n").index(f.text) + 1


@pytest.mark.parametrize("rule, edit", [
    ("cuda-barrier", lambda s: s.replace("threadgroup_barrier(mem_flags::mem_threadgroup);", "__syncthreads();", 1)),
    ("cuda-warp-intrinsic", lambda s: s.replace("metal::simd_shuffle_up(ta, off)",
                                                "__shfl_up_sync(0xffffffffu, ta, off)")),
    ("cuda-memory-space", lambda s: s.replace("threadgroup half bc_tile", "__shared__ half bc_tile")
                                     .replace("threadgroup float bc_tile", "__shared__ float bc_tile")),
    ("cuda-builtin-index", lambda s: s.replace("int(thread_index_in_simdgroup)", "int(threadIdx.x % 32)")),
    ("cuda-intrinsic", lambda s: s.replace("metal::exp(dt[i] * A2)", "__expf(dt[i] * A2)")),
    ("simd-width", lambda s: "constexpr int SIMD_WIDTH = 64;\n" + s),
    ("mlx-kernel-signature", lambda s: "[[kernel]] void ss(device float* out [[buffer(8)]]) {\n" + s + "}\n"),
])
def test_cuda_leftovers_in_a_body_are_rejected_with_the_metal_fix(packtask, rule, edit):
    pack, task = packtask
    k = _staged(pack, task, ni=8)
    body = edit(k.sources["kernel.metal"])
    assert body != k.sources["kernel.metal"]
    hits = findings(candidate(k).model_copy(update={"sources": {"kernel.metal": body}}))
    assert [f.rule for f in hits] == [rule], [str(f) for f in hits]
    if rule == "cuda-barrier":
        assert "threadgroup_barrier(mem_flags::mem_threadgroup)" in str(hits[0]) and "__syncthreads" in hits[0].text


def test_a_threadgroup_over_1024_threads_is_rejected(packtask):
    pack, task = packtask
    k = _staged(pack, task)
    cand = candidate(k)
    cand = cand.model_copy(update={"launch": {**cand.launch, "threadgroup": ["NSG * 512", 1, 1]}})
    (f,) = findings(cand)
    assert f.rule == "threads-per-threadgroup" and "2048 threads per group" in str(f) and "1024" in str(f)


def test_mlx_metal_rules_keep_every_metal_rule_and_limit():
    """mlx-metal.yaml includes metal.yaml: every Metal rule and limit applies to MLX bodies, plus the MLX one."""
    metal, mlx = sc.rules_for("metal"), sc.rules_for(TARGET)
    assert mlx[:len(metal)] == metal and [r.id for r in mlx[len(metal):]] == ["mlx-kernel-signature"]
    assert sc.limits_for(TARGET) == sc.limits_for("metal")
    assert sc.limits_for(TARGET)["threadgroup_memory_bytes"].value == 32768


# -- launches ---------------------------------------------------------------------------------------------------

def _resolve(launch, axes):
    grid = [eval_expr(x, axes) if isinstance(x, str) else x for x in launch["grid"]]
    group = [eval_expr(x, axes) if isinstance(x, str) else x for x in launch["threadgroup"]]
    return grid, group


def test_launches_cover_every_row_of_every_workload_with_whole_threadgroups(packtask):
    pack, task = packtask
    for choices, knobs in all_paths(pack):
        k = pack.render(task.definition, choices, knobs)
        tmpl = k.launch.get("template", {})
        for w in task.workloads:
            ax = w.axes
            grid, group = _resolve(k.launch, ax)
            assert all(isinstance(v, int) and v >= 1 for v in grid + group), (grid, group)
            assert math.prod(group) <= 1024 and group[1:] == [1, 1]
            if k.family == "naive":                    # a thread per row; MLX dispatches exactly grid threads
                assert grid == [ax["batch"] * ax["dim"], 1, 1]
                continue
            # SIMD-group families: whole threadgroups of NSG SIMD-groups (every thread reaches every barrier and
            # every shuffle has 32 lanes), one batch row per grid row, channel blocks covering dim
            assert group[0] == 32 * tmpl["NSG"] and grid[0] % group[0] == 0 and grid[1:] == [ax["batch"], 1]
            rows_per_group = tmpl["NSG"] if k.family == "simd-chunks" else tmpl["NSG"] * 32 // tmpl["LPR"]
            blocks = grid[0] // group[0]
            assert blocks * rows_per_group >= ax["dim"] > (blocks - 1) * rows_per_group, (k.family, knobs, ax)


def test_launches_validate_against_the_mlx_target(packtask):
    mlx = pytest.importorskip("ksearch.targets.mlx", reason="the mlx target is not built yet")
    if not hasattr(mlx, "parse_launch") or not hasattr(mlx, "resolve_launch"):
        pytest.skip("ksearch.targets.mlx has no parse_launch/resolve_launch")
    pack, task = packtask
    for choices, knobs in all_paths(pack):
        k = pack.render(task.definition, choices, knobs)
        plan = mlx.parse_launch(k.launch, task.definition, TARGET)
        for w in task.workloads:
            r = mlx.resolve_launch(plan, w.axes)
            assert dict(r.template)["dstate"] == w.axes["dstate"]


# -- the algorithms, emulated with an explicit 32-lane axis ------------------------------------------------------

LANE = np.arange(32)


def shuffle_up(x, off):
    """simd_shuffle_up(x, off): lane l reads lane l - off; the lowest `off` lanes read NaN here (the kernel must
    not use them), so a scan that did would poison the result."""
    out = np.full_like(x, np.nan)
    out[off:] = x[:-off]
    return out


def shuffle(x, src):
    """simd_shuffle(x, src): lane l reads lane src[l] (src a scalar or a per-lane array)."""
    return x[np.broadcast_to(np.asarray(src), x.shape)]


def shuffle_xor(x, m):
    return x[LANE ^ m]


def _softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _silu(z):
    return z / (1.0 + np.exp(-z))


def _decay(x, exp2):
    return np.exp2(x) if exp2 else np.exp(x)


def emulate_simd_chunks(inp, ax, ni, nsg, sgmax, staged, exp2, ft=np.float64, mutate=None):
    """out, last_state as the simd-chunks body computes them, threadgroup by threadgroup and SIMD-group by
    SIMD-group, in floating type ``ft``. ``sgmax``: the states per staged tile, read from the rendered body.
    ``mutate`` (to show the checks can fail): "no-carry" (the previous chunk's state not put in front),
    "no-guard" (the scan combines lanes below `off` too), "short-staging" (the last thread of the threadgroup stages nothing)."""
    batch, dim, N, L = ax["batch"], ax["dim"], ax["dstate"], ax["seqlen"]
    u, delta, A, B, C, D, z, bias = (np.asarray(inp[k], ft) for k in ("u", "delta", "A", "B", "C", "D", "z",
                                                                        "delta_bias"))
    scale = ft(LOG2E if exp2 else 1.0)
    chunk, nth = 32 * ni, 32 * nsg
    sg_states = min(sgmax, N) if staged else N
    out = np.full((batch, dim, L), np.nan)
    last = np.full((batch, dim, N), np.nan)
    for b, blk in itertools.product(range(batch), range((dim + nsg - 1) // nsg)):
        groups = []
        for s_idx in range(nsg):                              # SIMD-groups of this threadgroup
            d_sg = blk * nsg + s_idx
            groups.append({"live": d_sg < dim, "d": min(d_sg, dim - 1), "carry": np.zeros(N, ft)})
        for c0 in range(0, L, chunk):
            t = c0 + LANE[:, None] * ni + np.arange(ni)[None, :]          # (lane, item)
            inb = t < L
            tc = np.minimum(t, L - 1)
            for g in groups:
                d = g["d"]
                g["uv"] = np.where(inb, u[b, d, tc], 0).astype(ft)
                g["dt"] = np.where(inb, _softplus(delta[b, d, tc] + bias[d]), 0).astype(ft)
                g["dtu"] = g["dt"] * g["uv"]
                g["y"] = np.zeros((32, ni), ft)
            for g0 in range(0, N, sg_states):
                if staged:                                    # the staging loop, thread by thread
                    tile = np.full((2, sgmax, chunk), np.nan, ft)
                    for tid in range(nth - (mutate == "short-staging")):
                        for e in range(tid, sg_states * chunk, nth):
                            s, j = divmod(e, chunk)
                            ok = g0 + s < N and c0 + j < L
                            tile[0, s, j] = B[b, g0 + s, c0 + j] if ok else 0.0
                            tile[1, s, j] = C[b, g0 + s, c0 + j] if ok else 0.0
                for g in groups:
                    for n in range(g0, min(g0 + sg_states, N)):
                        A2 = A[g["d"], n] * scale
                        if staged:
                            bv = tile[0, n - g0][LANE[:, None] * ni + np.arange(ni)[None, :]]
                            cv = tile[1, n - g0][LANE[:, None] * ni + np.arange(ni)[None, :]]
                        else:
                            bv = np.where(inb, B[b, n, tc], 0).astype(ft)
                            cv = np.where(inb, C[b, n, tc], 0).astype(ft)
                        a = _decay(g["dt"] * A2, exp2).astype(ft)
                        bb = bv * g["dtu"]
                        ta, tb = np.ones(32, ft), np.zeros(32, ft)
                        for i in range(ni):                   # lane-sequential compose
                            tb = a[:, i] * tb + bb[:, i]
                            ta = ta * a[:, i]
                        h0 = g["carry"][n]
                        if mutate != "no-carry":
                            tb[0] = ta[0] * h0 + tb[0]         # the carry in front of lane 0
                        off = 1
                        while off < 32:                       # inclusive scan, simd_shuffle_up
                            pa, pb = shuffle_up(ta, off), shuffle_up(tb, off)
                            m = LANE >= off if mutate != "no-guard" else np.ones(32, bool)
                            tb, ta = np.where(m, ta * pb + tb, tb), np.where(m, pa * ta, ta)
                            off *= 2
                        h = shuffle_up(tb, 1)
                        h[0] = h0 if mutate != "no-carry" else 0.0
                        for i in range(ni):                   # replay
                            h = a[:, i] * h + bb[:, i]
                            g["y"][:, i] += cv[:, i] * h
                        g["carry"] = g["carry"].copy()
                        g["carry"][n] = shuffle(tb, 31)[0]
            for g in groups:
                if g["live"]:
                    d = g["d"]
                    val = (g["y"] + D[d] * g["uv"]) * _silu(z[b, d, tc])
                    out[b, d, t[inb]] = val[inb]
        for g in groups:
            if g["live"]:
                last[b, g["d"]] = g["carry"]
    return out, last


def emulate_simd_lanes(inp, ax, lpr, nsg, exp2, ft=np.float64):
    """out, last_state as the simd-lanes body computes them, SIMD-group by SIMD-group (32 lanes, 32 / lpr rows)."""
    batch, dim, N, L = ax["batch"], ax["dim"], ax["dstate"], ax["seqlen"]
    u, delta, A, B, C, D, z, bias = (np.asarray(inp[k], ft) for k in ("u", "delta", "A", "B", "C", "D", "z",
                                                                        "delta_bias"))
    scale = ft(LOG2E if exp2 else 1.0)
    rpt, S = nsg * 32 // lpr, (N + lpr - 1) // lpr
    out = np.full((batch, dim, L), np.nan)
    last = np.full((batch, dim, N), np.nan)
    r, base = LANE % lpr, LANE - LANE % lpr
    for b, blk, sgi in itertools.product(range(batch), range((dim + rpt - 1) // rpt), range(nsg)):
        d_g = blk * rpt + (sgi * 32 + LANE) // lpr
        live = d_g < dim
        d = np.minimum(d_g, dim - 1)
        h = np.zeros((32, S), ft)
        n_of = r[:, None] + np.arange(S)[None, :] * lpr                     # (lane, s)
        A2 = np.where(n_of < N, A[d[:, None], np.minimum(n_of, N - 1)] * scale, 0).astype(ft)
        for t0 in range(0, L, lpr):
            valid = t0 + r < L
            tt = np.minimum(t0 + r, L - 1)
            uv = np.where(valid, u[b, d, tt], 0).astype(ft)
            dtm = np.where(valid, _softplus(delta[b, d, tt] + bias[d]), 0).astype(ft)
            dtum = dtm * uv
            dts = np.stack([shuffle(dtm, base + j) for j in range(lpr)], axis=1)   # (lane, j)
            dtus = np.stack([shuffle(dtum, base + j) for j in range(lpr)], axis=1)
            p = np.zeros((32, lpr), ft)
            for s in range(S):
                n = n_of[:, s]
                hs = h[:, s].copy()
                for j in range(lpr):
                    ok = (n < N) & (t0 + j < L)
                    bv = np.where(ok, B[b, np.minimum(n, N - 1), min(t0 + j, L - 1)], 0).astype(ft)
                    cv = np.where(ok, C[b, np.minimum(n, N - 1), min(t0 + j, L - 1)], 0).astype(ft)
                    hs = _decay(dts[:, j] * A2[:, s], exp2).astype(ft) * hs + dtus[:, j] * bv
                    p[:, j] += cv * hs
                h[:, s] = hs
            m = lpr // 2
            while m >= 1:                                     # reduce-scatter, simd_shuffle_xor
                hi = (r & m) != 0
                newp = p.copy()
                for i in range(m):
                    send = np.where(hi, p[:, i], p[:, i + m])
                    keep = np.where(hi, p[:, i + m], p[:, i])
                    newp[:, i] = keep + shuffle_xor(send, m)
                p = newp
                m //= 2
            st = live & valid
            zz = z[b, d, tt]
            out[b, d[st], (t0 + r)[st]] = ((p[:, 0] + D[d] * uv) * _silu(zz))[st]
        for s in range(S):
            st = live & (n_of[:, s] < N)
            last[b, d[st], n_of[st, s]] = h[st, s]
    return out, last


SHAPES = [  # (batch, dim, dstate, seqlen): seqlen 1, dstate 1, seqlen not a multiple of any chunk, dim past NSG
    {"batch": 1, "dim": 3, "dstate": 1, "seqlen": 1},
    {"batch": 1, "dim": 2, "dstate": 16, "seqlen": 1},
    {"batch": 2, "dim": 5, "dstate": 16, "seqlen": 333},
    {"batch": 1, "dim": 4, "dstate": 5, "seqlen": 70},
    {"batch": 1, "dim": 1, "dstate": 1, "seqlen": 600},
]


def _case(task_name, axes, seed=0):
    definition = load_task(task_name).definition
    inp = make_inputs(definition, Workload(axes=axes, inputs={}), seed)
    ref = run_reference(definition, inp)
    return definition, inp, ref


def _check_against_reference(out, last, ref, rtol, atol):
    assert not np.isnan(out).any() and not np.isnan(last).any()      # every output written
    np.testing.assert_allclose(out, ref["out"], rtol=rtol, atol=atol)
    np.testing.assert_allclose(last, ref["last_state"], rtol=rtol, atol=atol)


@pytest.mark.parametrize("axes", SHAPES, ids=lambda a: "b{batch}d{dim}n{dstate}L{seqlen}".format(**a))
@pytest.mark.parametrize("ni, nsg, staged, exp2", [(4, 4, True, True), (8, 1, False, False), (16, 2, True, False),
                                                   (4, 8, False, True), (16, 4, False, True)])
def test_simd_chunks_algorithm_matches_the_float64_reference(axes, ni, nsg, staged, exp2):
    """The algorithm the simd-chunks template encodes (not the Metal code: no Apple GPU here), in float64, equals
    the task's float64 reference up to rounding. The tile's state count comes from the rendered body."""
    pack = load_pack("selective-scan", TARGET)
    definition, inp, ref = _case("selective-scan", axes)
    k = pack.render(definition, {"family": "simd-chunks", "bc_tiles": "threadgroup" if staged else "device",
                                 "exp": "exp2" if exp2 else "exp"}, {"items_per_lane": ni, "simdgroups": nsg})
    assert k.launch["template"] == {"NI": ni, "NSG": nsg}
    m = re.search(r"constexpr int SGMAX = (\d+);", k.sources["kernel.metal"])
    assert (m is not None) == staged
    sgmax = int(m.group(1)) if m else 0
    out, last = emulate_simd_chunks(inp, axes, ni, nsg, sgmax, staged, exp2)
    _check_against_reference(out, last, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("task_name", TASKS)
def test_simd_chunks_in_fp32_meets_the_task_tolerance(task_name):
    """The same emulation with fp32 state and arithmetic (the kernel's), fp16 inputs where the task has them."""
    axes = {"batch": 1, "dim": 5, "dstate": 16, "seqlen": 1100}
    definition, inp, ref = _case(task_name, axes, seed=3)
    tol = definition.tolerance_for(definition.outputs["out"].dtype)
    rtol, atol = tol.rtol, tol.atol
    out, last = emulate_simd_chunks(inp, axes, 16, 4, 4, True, True, ft=np.float32)
    if task_name.endswith("fp16"):
        out = out.astype(np.float16).astype(np.float64)          # the store's rounding
    _check_against_reference(out, last, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mutate", ["no-carry", "no-guard", "short-staging"])
def test_the_emulation_fails_for_a_broken_scan(mutate):
    """The reference check above can fail: a dropped carry is wrong past the first chunk, a scan that reads the
    lanes below `off` reads undefined values (NaN here), a tile with holes reads NaN."""
    axes = {"batch": 1, "dim": 2, "dstate": 4, "seqlen": 300}
    _, inp, ref = _case("selective-scan", axes)
    out, _ = emulate_simd_chunks(inp, axes, 4, 1, 16, True, False)
    np.testing.assert_allclose(out, ref["out"], rtol=1e-9, atol=1e-9)
    broken, _ = emulate_simd_chunks(inp, axes, 4, 1, 16, True, False, mutate=mutate)
    assert not np.allclose(broken, ref["out"], rtol=1e-3, atol=1e-3, equal_nan=False)
    if mutate == "no-carry":                                  # the first chunk (128 tokens) has no carry to drop
        np.testing.assert_allclose(broken[..., :128], ref["out"][..., :128], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("axes", SHAPES[:4], ids=lambda a: "b{batch}d{dim}n{dstate}L{seqlen}".format(**a))
@pytest.mark.parametrize("lpr, nsg, exp2", [(8, 1, True), (16, 4, False), (32, 2, True)])
def test_simd_lanes_algorithm_matches_the_float64_reference(axes, lpr, nsg, exp2):
    """The algorithm the simd-lanes template encodes (broadcast by simd_shuffle, reduce-scatter by
    simd_shuffle_xor, padded states and tokens as identities), in float64, against the float64 reference."""
    pack = load_pack("selective-scan", TARGET)
    definition, inp, ref = _case("selective-scan", axes)
    k = pack.render(definition, {"family": "simd-lanes", "exp": "exp2" if exp2 else "exp"},
                    {"lanes": lpr, "simdgroups": nsg})
    assert k.launch["template"] == {"LPR": lpr, "NSG": nsg}
    out, last = emulate_simd_lanes(inp, axes, lpr, nsg, exp2)
    _check_against_reference(out, last, ref, rtol=1e-9, atol=1e-9)


# -- the bodies as C++, with Metal declared by stubs ------------------------------------------------------------

#: Thread attributes MLX adds to the signature when their name occurs in the body (mlx/backend/metal/
#: custom_kernel.cpp's metal_attributes, in its order), with their types.
MLX_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"), ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"), ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"), ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"), ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"), ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"), ("threads_per_grid", "uint3"), ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]

#: Declarations of the Metal names the bodies use, with the Metal Shading Language Specification's signatures;
#: `device`, `constant` and `threadgroup` (address spaces) vanish, `half` is a float-backed stand-in.
METAL_STUBS = """
#define device
#define constant
#define threadgroup
typedef unsigned int uint;
typedef unsigned short ushort;
struct uint3 { uint x, y, z; };
struct half { float v; half() = default; half(float f) : v(f) {} operator float() const { return v; } };
typedef half float16_t;
enum class mem_flags { mem_none, mem_device, mem_threadgroup };
void threadgroup_barrier(mem_flags);
namespace metal {
float exp(float); float log(float); float exp2(float);
namespace fast { float exp(float); float log(float); float exp2(float); }
template <typename T> T simd_shuffle(T, ushort);
template <typename T> T simd_shuffle_up(T, ushort);
template <typename T> T simd_shuffle_xor(T, ushort);
}
"""


def cpp_syntax(src, strict: bool = True):
    """g++ -fsyntax-only on the C++ file ``src`` (with ``strict``: C++14 pedantic, warnings as errors, unused
    variables allowed): the completed process."""
    import subprocess

    flags = ["-pedantic-errors", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]
    return subprocess.run(["g++", "-std=c++14", "-fsyntax-only", *(flags if strict else []), str(src)],
                          capture_output=True, text=True, timeout=300)


def as_cpp(k, definition, fn: str, axes: dict) -> str:
    """The function MLX would generate around the body (inputs `const device T*`, outputs `device T*`, the named
    thread attributes, the axes and the launch's template constants as int template parameters), instantiated
    for ``axes``."""
    ctype = {"float32": "float", "float16": "float16_t"}
    body = k.sources["kernel.metal"]
    params = [f"const device {ctype[s.dtype]}* {n}" for n, s in definition.inputs.items()]
    params += [f"device {ctype[s.dtype]}* {n}" for n, s in definition.outputs.items()]
    params += [f"{t} {a}" for a, t in MLX_ATTRIBUTES if a in body]
    tmpl = {**axes, **k.launch.get("template", {})}
    head = f"template <{', '.join(f'int {n}' for n in tmpl)}>\nvoid {fn}({', '.join(params)}) {{\n"
    inst = f"template void {fn}<{', '.join(str(v) for v in tmpl.values())}>({', '.join(params)});\n"
    return head + body + "}\n" + inst


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ not installed")
def test_every_body_type_checks_as_cpp_against_metal_declarations(packtask, tmp_path):
    """A proxy for the Metal compiler (not one: Metal's own rules, e.g. no recursion, are not checked): every
    reachable body, wrapped as MLX wraps it and instantiated for a workload, has no undeclared name, no type
    error and no variable-length array (g++ -pedantic-errors)."""
    pack, task = packtask
    axes = task.workload("odd").axes
    units = [METAL_STUBS]
    for i, (choices, knobs) in enumerate(all_paths(pack)):
        units.append(f"// {choices} {knobs}\n" + as_cpp(pack.render(task.definition, choices, knobs),
                                                          task.definition, f"k{i}", axes))
    src = tmp_path / "bodies.cpp"
    src.write_text("\n".join(units))
    r = cpp_syntax(src)
    assert r.returncode == 0, r.stderr[-4000:]
    # the check can fail: an undeclared name in one body is an error
    bad = src.read_text().replace("metal::simd_shuffle_up(ta, off)", "simd_shuffle_upp(ta, off)", 1)
    src.write_text(bad)
    r = cpp_syntax(src, strict=False)
    assert r.returncode != 0 and "simd_shuffle_upp" in r.stderr
