"""The attention-decode mlx-metal pack. No Metal compiler or Apple GPU runs here, so, as for the prefill pack
(test_attention_mlx_metal_pack.py, whose helpers this reuses): every single move and a seeded sample of full
paths passes the static pass (compile step, mlx-metal rules and limits, every workload's launch); the split-kv
threadgroup memory is sized by template constants and the definition's head_dim maximum, so the static pass itself
measures it (and rejects a split over 32 KB); the patterns proposer's candidates pass; the split over SIMD-groups,
the per-key online softmax and the in-kernel combine are emulated in NumPy with an explicit 32-lane axis against
the float64 reference; the bodies type-check as C++ against Metal stubs."""

import shutil

import numpy as np
import pytest

from ksearch.eval import static_checks as sc
from ksearch.eval import static_limits as sl
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.search.static_pass import check_candidates
from ksearch.tasks import Workload, load_task
from ksearch.tasks.definition import eval_expr
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference

from .paths import path_id, random_paths, single_moves
from .test_attention_mlx_metal_pack import (ATTENTION_STUBS, LANE, LIMIT, TARGET, proposer_candidates,
                                            static_problem)
from .test_selective_scan_mlx_metal import METAL_STUBS, as_cpp, cpp_syntax

TASK = load_task("attention-decode")
PACK = load_pack("attention-decode", TARGET)
PATHS = single_moves(PACK) + random_paths(PACK, 12, seed=2026)


def test_description_says_nothing_was_compiled_or_run_and_where_the_combine_is():
    assert "NOTHING HERE HAS BEEN COMPILED BY METAL OR RUN ON AN APPLE GPU" in PACK.description
    assert "combine" in PACK.description and "same kernel" in PACK.description
    assert [f.id for f in PACK.families] == ["naive", "split-kv"]


def _static_tg_bytes(cand: Candidate) -> list:
    """The threadgroup declarations as the static pass measures them (launch template constants only)."""
    code = "\n".join(t for _, t in sc.views(cand).code["kernel.metal"])
    consts, aliases = sl.constants(code, "metal", dict(cand.launch.get("template", {})))
    return sl.declarations(code, "threadgroup", "metal", consts, aliases)[0]


@pytest.mark.parametrize("path", PATHS, ids=[path_id(p) for p in PATHS])
def test_every_move_and_sampled_path_passes_the_static_pass(path):
    choices, knobs = path
    k = PACK.render(TASK.definition, choices, knobs)
    assert list(k.sources) == ["kernel.metal"]
    cand = k.candidate()
    assert static_problem(TASK, cand) is None, static_problem(TASK, cand)
    if k.family == "split-kv":
        decls = _static_tg_bytes(cand)
        assert [d.name for d in decls] == ["part", "ms", "ls"] and all(d.bytes for d in decls)
        nsg, hg = k.launch["template"]["NSG"], k.launch["template"]["HG"]
        assert sum(d.bytes for d in decls) == nsg * 256 * 4 + 2 * nsg * hg * 4 <= LIMIT
        # whole threadgroups, one per (batch, kv head, head block) of every workload
        for w in TASK.workloads:
            ax = w.axes
            grid = [eval_expr(x, ax) if isinstance(x, str) else x for x in k.launch["grid"]]
            gq = ax["q_heads"] // ax["kv_heads"]
            assert grid == [32 * nsg, ax["batch"] * ax["kv_heads"] * -(-gq // min(hg, gq)), 1]


def test_a_split_over_32_kb_is_rejected_by_the_static_pass():
    k = PACK.render(TASK.definition, {"family": "split-kv"}, {"simdgroups": 16, "heads_per_group": 8})
    cand = k.candidate()
    big = cand.model_copy(update={"launch": {**cand.launch, "threadgroup": [1024, 1, 1],
                                             "template": {"NSG": 32, "HG": 8}}})
    (f,) = sc.check(big, sc.rules_for(TARGET))
    assert f.rule == "threadgroup-memory" and f"{32 * 256 * 4 + 2 * 32 * 8 * 4} B" in str(f) and "part" in f.text


def test_the_static_pass_and_the_offline_proposer_pass_every_candidate():
    checked = check_candidates(TASK, TARGET)
    assert [c.label for c in checked if c.problem] == [] and len(checked) >= 5
    emitted = proposer_candidates("attention-decode")
    assert {c.meta["family"] for _, c in emitted} == {"naive", "split-kv"} and len(emitted) >= 15
    for label, cand in emitted:
        assert static_problem(TASK, cand) is None, (label, static_problem(TASK, cand))


# -- the split-kv algorithm in NumPy, lanes explicit ---------------------------------------------------------------

def emulate_split_kv(q, k, v, nsg, hg, split, exp2, mutate=None):
    """o as the split-kv body computes it, threadgroup by threadgroup, SIMD-group by SIMD-group, lane l holding
    columns l, l + 32, ... (float32). ``mutate``: "no-combine-rescale" (the SIMD-groups' accumulators summed
    without e^(m - M)), "floor-chunks" (contiguous chunks of floor(kv_len / NSG) keys: the tail is lost)."""
    B, H, D = q.shape
    KVH, L = k.shape[1], k.shape[2]
    GQ = H // KVH
    HT = min(hg, GQ)
    NHB, DPL = -(-GQ // HT), -(-D // 32)
    scale = np.float32((1.4426950408889634 if exp2 else 1.0) / np.sqrt(D))
    ex = np.exp2 if exp2 else np.exp
    dl = LANE[:, None] + 32 * np.arange(DPL)[None, :]          # (lane, i) -> column
    ok, dc = dl < D, np.minimum(dl, D - 1)
    o = np.full(q.shape, np.nan, np.float32)
    ch = L // nsg if mutate == "floor-chunks" else -(-L // nsg)
    for b in range(B):
        for g in range(KVH):
            for hb in range(NHB):
                h0 = g * GQ + hb * HT
                hq = np.minimum(h0 + np.arange(HT), g * GQ + GQ - 1)
                qv = np.where(ok, q[b][hq][:, dc] * scale, 0).astype(np.float32)   # (HT, lane, i)
                state = []
                for s in range(nsg):
                    m = np.full(HT, -np.inf, np.float32)
                    l = np.zeros(HT, np.float32)
                    acc = np.zeros((HT, 32, DPL), np.float32)
                    keys = range(s, L, nsg) if split == "interleaved" else range(s * ch, min(L, (s + 1) * ch))
                    for j in keys:
                        kr = np.where(ok, k[b, g, j][dc], 0).astype(np.float32)
                        vr = np.where(ok, v[b, g, j][dc], 0).astype(np.float32)
                        sc_ = (qv * kr).sum(axis=2).sum(axis=1)          # per lane, then simd_sum over lanes
                        mnew = np.maximum(m, sc_)
                        alpha = np.where(m > -np.inf, ex(m - mnew), 0).astype(np.float32)
                        p = ex(sc_ - mnew).astype(np.float32)
                        l = l * alpha + p
                        acc = acc * alpha[:, None, None] + p[:, None, None] * vr
                        m = mnew
                    state.append((m, l, acc))
                ms = np.stack([x[0] for x in state])                 # (NSG, HT): the threadgroup arrays
                ls = np.stack([x[1] for x in state])
                for hh in range(HT):
                    M = ms[:, hh].max()
                    L_ = np.where(ms[:, hh] > -np.inf, ex(ms[:, hh] - M) * ls[:, hh], 0).sum()
                    part = np.full((nsg, 256), np.nan, np.float32)
                    for s, (m, _, acc) in enumerate(state):
                        f = (1 / L_ if mutate == "no-combine-rescale" else ex(m[hh] - M) / L_) if m[hh] > -np.inf else 0
                        part[s, dl[ok]] = (acc[hh] * f)[ok]
                    if h0 + hh < g * GQ + GQ:
                        assert np.isnan(o[b, h0 + hh]).all()            # written once
                        o[b, h0 + hh] = part[:, :D].sum(axis=0)
    return o


def _case(axes, seed=0):
    inp = make_inputs(TASK.definition, Workload(axes=axes, inputs={}), seed)
    return inp, run_reference(TASK.definition, inp)["o"]


SHAPES = [  # kv_len 1 and 3 (SIMD-groups without keys), GQA group 3 (a partial head block), head_dim 80
    {"batch": 1, "q_heads": 1, "kv_heads": 1, "kv_len": 1, "head_dim": 64},
    {"batch": 2, "q_heads": 6, "kv_heads": 2, "kv_len": 3, "head_dim": 16},
    {"batch": 1, "q_heads": 6, "kv_heads": 2, "kv_len": 77, "head_dim": 80},
    {"batch": 1, "q_heads": 8, "kv_heads": 1, "kv_len": 100, "head_dim": 128},
]


@pytest.mark.parametrize("axes", SHAPES, ids=lambda a: "b{batch}h{q_heads}g{kv_heads}L{kv_len}d{head_dim}".format(**a))
@pytest.mark.parametrize("choices, knobs", [({"exp": "exp2"}, {"simdgroups": 8, "heads_per_group": 4}),
                                            ({"kv_split": "contiguous"}, {"simdgroups": 4, "heads_per_group": 2}),
                                            ({"kv_split": "contiguous", "exp": "exp2"},
                                             {"simdgroups": 16, "heads_per_group": 8}),
                                            ({}, {"simdgroups": 4, "heads_per_group": 1})])
def test_split_kv_algorithm_meets_the_task_tolerance(axes, choices, knobs):
    inp, ref = _case(axes)
    k = PACK.render(TASK.definition, {"family": "split-kv", **choices}, knobs)
    t = k.launch["template"]
    o = emulate_split_kv(inp["q"], inp["k"], inp["v"], t["NSG"], t["HG"], k.choices["kv_split"],
                         k.choices["exp"] == "exp2")
    assert not np.isnan(o).any()
    tol = TASK.definition.tolerance_for("float16")
    np.testing.assert_allclose(o.astype(np.float16).astype(np.float64), ref, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("mutate", ["no-combine-rescale", "floor-chunks"])
def test_the_split_kv_emulation_fails_for_a_broken_combine(mutate):
    axes = SHAPES[2]
    inp, ref = _case(axes)
    o = emulate_split_kv(inp["q"], inp["k"], inp["v"], 8, 4, "contiguous", False, mutate=mutate)
    assert not np.allclose(o, ref, rtol=5e-3, atol=2e-3)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_every_body_type_checks_as_cpp_against_metal_declarations(tmp_path):
    axes = TASK.definition.axis_values(TASK.workload("d80"))
    naive = Candidate(target=TARGET, sources={"kernel.metal": TASK.naive_sources[TARGET]},
                      launch=TASK.naive_launch[TARGET])
    bodies = [naive] + [PACK.render(TASK.definition, c, kn).candidate() for c, kn in PATHS]
    units = [METAL_STUBS, ATTENTION_STUBS] + [as_cpp(c, TASK.definition, f"d{i}", axes) for i, c in enumerate(bodies)]
    src = tmp_path / "bodies.cpp"
    src.write_text("\n".join(units))
    r = cpp_syntax(src)
    assert r.returncode == 0, r.stderr[-4000:]
    assert src.read_text().count("s = metal::simd_sum(s);") >= 5
