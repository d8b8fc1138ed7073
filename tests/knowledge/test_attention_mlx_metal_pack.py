"""The attention mlx-metal pack (prefill, causal and non-causal). No Metal compiler or Apple GPU runs here, so:

- every single move from a family's root and a seeded sample of full paths renders a body and a launch that pass
  what the static pass (`ksearch.search.static_pass`, what `ksearch run --target mlx-metal` runs without a Metal
  device) checks: the mlx target's compile step, the mlx-metal static rules and limits, the launch on every
  workload; the threadgroup memory, sized by head_dim, is measured with each workload's axes and at the
  definition's head_dim bounds (the static pass cannot: the axes are not known to it);
- the offline (patterns) proposer is run for each task against the m1-max catalog entry, three levels deep, and
  every candidate it emits passes the same checks; the CLI's static pass ends with 0 failing candidates;
- the flash family's tile loop is emulated in NumPy with an explicit 32-lane axis (the 8x8 fragment lane layout
  and the simd_shuffle_xor masks read from the rendered body, causal tile skipping, the online softmax on each
  lane's own elements, the schedule) against the task's float64 reference, and the emulation is shown to fail
  for a broken mask or reduction;
- every body type-checks as C++ against Metal stubs (g++ -fsyntax-only; the selective-scan Metal test's wrapper).
"""

import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from ksearch.eval import static_checks as sc
from ksearch.eval import static_limits as sl
from ksearch.records import Candidate
from ksearch.hardware import catalog
from ksearch.knowledge import load_pack
from ksearch.proposers.patterns import PatternsProposer
from ksearch.search.edits import apply
from ksearch.search.static_pass import _problem, check_candidates
from ksearch.search.worldmodel import ROOT_ID, EvalSummary, Tree, attach
from ksearch.targets import get_target
from ksearch.tasks import Workload, load_task
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference

from .paths import path_id, random_paths, single_moves
from .test_selective_scan_mlx_metal import METAL_STUBS, as_cpp, cpp_syntax

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
TARGET = "mlx-metal"
PACK = load_pack("attention-prefill", TARGET)
PATHS = single_moves(PACK) + random_paths(PACK, 12, seed=2026)
LIMIT = 32768

#: what the C++ type check needs beyond the selective-scan stubs: simdgroup_matrix (a lane's two elements through
#: thread_elements()), simdgroup_multiply_accumulate, simd_sum / simd_max, min / max / sqrt, INFINITY
ATTENTION_STUBS = """
#define INFINITY (__builtin_inff())
struct simdgroup_float8x8 {
    struct elements { float v[2]; float &operator[](int i) { return v[i]; } };
    elements e;
    elements &thread_elements() { return e; }
};
void simdgroup_multiply_accumulate(simdgroup_float8x8 &, const simdgroup_float8x8 &, const simdgroup_float8x8 &,
                                   const simdgroup_float8x8 &);
namespace metal {
float sqrt(float);
template <typename T> T max(T, T);
template <typename T> T min(T, T);
template <typename T> T simd_sum(T);
template <typename T> T simd_max(T);
}
"""


def static_problem(task, cand: Candidate) -> str | None:
    """What the static pass says of a candidate (None: it passes): the compile step, the mlx-metal rules and
    limits, the launch resolved for every workload."""
    return _problem(get_target(TARGET), cand, task, sc.rules_for(TARGET), task.select(None))


def threadgroup_bytes(k, axes: dict) -> tuple[int, list]:
    """Threadgroup bytes the body declares, measured by the static limit's own code with the launch's template
    constants *and* the axes substituted (the static pass has only the former); and the declarations."""
    code = "\n".join(t for _, t in sc.views(k.candidate()).code["kernel.metal"])
    consts, aliases = sl.constants(code, "metal", {**axes, **k.launch.get("template", {})})
    decls, _ = sl.declarations(code, "threadgroup", "metal", consts, aliases)
    assert all(d.bytes is not None for d in decls), [d.describe() for d in decls]
    return sum(d.bytes for d in decls), decls


def axes_to_check(task) -> list[dict]:
    """Every workload's axes, and the largest workload's with head_dim at the definition's bounds."""
    out = [task.definition.axis_values(w) for w in task.workloads]
    lo, hi = task.definition.axes["head_dim"].min, task.definition.axes["head_dim"].max
    out += [{**out[-1], "head_dim": d} for d in (lo, hi)]
    return out


# -- rendering and the static pass ------------------------------------------------------------------------------

def test_description_says_nothing_was_compiled_or_run():
    assert "NOTHING HERE HAS BEEN COMPILED BY METAL OR RUN ON AN APPLE GPU" in PACK.description
    assert [f.id for f in PACK.families] == ["naive-rows", "flash"]


@pytest.mark.parametrize("task_name", TASKS)
def test_every_move_and_sampled_path_passes_the_static_pass_and_fits_32_kb(task_name):
    task = load_task(task_name)
    hashes = set()
    for choices, knobs in PATHS:
        k = PACK.render(task.definition, choices, knobs)
        assert list(k.sources) == ["kernel.metal"] and k.target == TARGET
        body = k.sources["kernel.metal"]
        assert "kernel void" not in body and "[[kernel]]" not in body
        cand = k.candidate()
        assert static_problem(task, cand) is None, (path_id((choices, knobs)), static_problem(task, cand))
        tmpl = k.launch.get("template", {})
        used = {n for n in ("NSG", "BK") if re.search(rf"\b{n}\b", body)}
        assert used == set(tmpl), (choices, knobs)
        if k.family == "flash":
            causal = task.definition.axes["causal"].value
            assert ("n0 <= r0 + 7" in body) == bool(causal)           # causal tiles skipped only when causal
            assert ("metal::fast::exp2(" in body) == (k.choices["exp"] == "exp2")
            for axes in axes_to_check(task):
                total, decls = threadgroup_bytes(k, axes)
                assert [d.name for d in decls] == ["kv"] and 0 < total <= LIMIT, (knobs, axes, total)
        hashes.add(k.content_hash)
    resolved = {repr(PACK.resolve(c, kn)) for c, kn in PATHS}
    assert len(hashes) == len(resolved)                         # distinct paths, distinct candidates


def test_the_flash_tile_at_head_dim_256_is_measured_and_an_oversized_one_is_rejected():
    """At head_dim 256 and block_k 32 the K/V buffer is (256 + 8) x (32 + 8) halves = 21120 B; a block_k of 64
    would be 38016 B, and the same measure reports it over 32 KB with the declaration's line."""
    task = load_task("attention-prefill")
    k = PACK.render(task.definition, {"family": "flash"}, {"block_k": 32})
    axes = {**task.definition.axis_values(task.workloads[-1]), "head_dim": 256}
    assert threadgroup_bytes(k, axes)[0] == 264 * 40 * 2
    # the static pass itself cannot size it (head_dim is a template constant it does not know): not counted
    assert sc.check(k.candidate(), [r for r in sc.rules_for(TARGET) if r.id == "threadgroup-memory"]) == []
    big = k.candidate().model_copy(update={"launch": {**k.launch, "template": {"NSG": 4, "BK": 64}}})
    body = big.sources["kernel.metal"].replace("constexpr int DP = (head_dim + 7) / 8 * 8;", "constexpr int DP = 256;")
    big = big.model_copy(update={"sources": {"kernel.metal": body}})
    (f,) = sc.check(big, sc.rules_for(TARGET))
    assert f.rule == "threadgroup-memory" and "38016 B" in str(f) and "32768" in str(f) and "kv" in f.text


@pytest.mark.parametrize("task_name", TASKS)
def test_the_static_pass_and_the_cli_pass_every_candidate(task_name, tmp_path, monkeypatch):
    """What `ksearch run <task> --target mlx-metal` does on a machine without Metal: every generated candidate
    passes, then it stops (exit 2) saying a device is needed, and creates no run."""
    from ksearch.cli import app
    from ksearch.targets import mlx as mlxt

    checked = check_candidates(load_task(task_name), TARGET)
    assert [c.label for c in checked if c.problem] == [] and len(checked) >= 6
    assert {c.label.split()[0] for c in checked} >= {"naive", "naive-rows", "flash"}
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(mlxt, "mlx_status", lambda t: "no Metal device in this test")
    r = CliRunner().invoke(app, ["run", task_name, "--target", TARGET, "--budget", "6"])
    assert r.exit_code == 2, r.output
    assert f"{len(checked)} Metal candidates generated" in r.output and "(0 do not)" in r.output


def proposer_candidates(task_name: str, depth: int = 3) -> list[tuple[str, Candidate]]:
    """Every candidate the patterns proposer emits for ``task_name`` on mlx-metal (m1-max limits) down to
    ``depth`` levels: the families, then the moves under each node once it is marked as passing."""
    task = load_task(task_name)
    p = PatternsProposer(task, TARGET, catalog.to_spec("m1-max"))
    tree, _ = apply(Tree.new(), p.initial_edits(Tree.new()))
    tree = attach(tree, ROOT_ID, "cand-root", EvalSummary(status="PASSED", score=1.0))
    frontier = [n.id for n in tree.children(ROOT_ID)]
    for _ in range(depth - 1):
        nxt = []
        for node_id in frontier:
            tree = attach(tree, node_id, f"cand-{node_id}", EvalSummary(status="PASSED", score=1.0))
            edits = p.refine(tree, node_id, None)
            tree, _ = apply(tree, edits)
            nxt += [n.id for n in tree.children(node_id)]
            assert not tree[node_id].payload.get("pruned"), tree[node_id].payload["pruned"]
        frontier = nxt
    return [(n.label, p.propose(tree, n.id, None)) for n in tree if n.id != ROOT_ID]


@pytest.mark.parametrize("task_name", TASKS)
def test_every_candidate_the_offline_proposer_emits_passes(task_name):
    task = load_task(task_name)
    emitted = proposer_candidates(task_name)
    assert len(emitted) >= 20                                   # families, their moves, the moves under those
    assert {c.meta["family"] for _, c in emitted} == {"naive-rows", "flash"}
    for label, cand in emitted:
        assert static_problem(task, cand) is None, (label, static_problem(task, cand))


# -- the flash tile loop in NumPy, with an explicit 32-lane axis -------------------------------------------------

LANE = np.arange(32)


def lane_layout(body: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(fm, fn) per lane as the rendered body computes them, and the simd_shuffle_xor masks of its row max."""
    def expr(name):
        e = re.search(rf"const int {name} = ([^;]+);", body).group(1).replace("/", "//")
        return eval(e, {"lane": LANE})  # noqa: S307 - the body's own integer expression, on a NumPy array
    masks = [int(x) for x in re.findall(r"tmax = metal::max\(tmax, metal::simd_shuffle_xor\(tmax, ushort\((\d+)\)\)\)",
                                        body)]
    return expr("fm"), expr("fn"), masks


def test_fragment_layout_covers_each_element_once_and_rows_match_the_shuffle_masks():
    body = PACK.render(load_task("attention-prefill").definition, {"family": "flash"}, {}).sources["kernel.metal"]
    fm, fn, masks = lane_layout(body)
    cells = {(int(r), int(c) + e) for r, c in zip(fm, fn) for e in (0, 1)}
    assert len(cells) == 64 and cells == {(r, c) for r in range(8) for c in range(8)}
    assert masks == [1, 8]
    for lane in range(32):   # the lanes a row reduction over xor 1 and 8 reaches are exactly the row's lanes
        reach = {lane ^ a ^ b for a in (0, masks[0]) for b in (0, masks[1])}
        assert reach == set(np.flatnonzero(fm == fm[lane]).tolist())


def shuffle_xor(x, m):
    return x[LANE ^ m]


def emulate_flash(q, k, v, causal, body, nsg, bk, exp2, heavy_first, mutate=None):
    """o as the flash body computes it, threadgroup by threadgroup, SIMD-group by SIMD-group, the lanes' fragment
    elements explicit (float32). ``mutate``: "no-mask" (the causal comparison dropped), "xor-1" (the row max and
    sum over lanes l, l^1 only), "no-rescale" (O not rescaled by alpha)."""
    fm, fn, masks = lane_layout(body)
    if mutate == "xor-1":
        masks = masks[:1]
    B, H, L, D = q.shape
    G = H // k.shape[1]
    DP = (D + 7) // 8 * 8
    ND, NKF, BQ = DP // 8, bk // 8, 8 * nsg
    NQT = (L + BQ - 1) // BQ
    scale = np.float32((1.4426950408889634 if exp2 else 1.0) / np.sqrt(D))
    ex = np.exp2 if exp2 else np.exp
    o = np.full(q.shape, np.nan, np.float32)
    pad = lambda a, rows: np.pad(a, ((0, rows - a.shape[0]), (0, DP - D))).astype(np.float32)  # noqa: E731
    for b in range(B):
        for h in range(H):
            kh, vh = k[b, h // G], v[b, h // G]
            for x in range(NQT):
                qt = NQT - 1 - x if (heavy_first and causal) else x
                q0 = qt * BQ
                kv_end = min(L, q0 + BQ) if causal else L
                for sg in range(nsg):
                    r0 = q0 + 8 * sg
                    if r0 >= L:
                        continue
                    row = r0 + fm
                    Q8 = pad(q[b, h, r0:r0 + 8], 8)
                    O = np.zeros((32, ND, 2), np.float32)
                    m = np.full(32, -np.inf, np.float32)
                    l = np.zeros(32, np.float32)
                    for n0 in range(0, kv_end, bk):
                        if causal and n0 > r0 + 7:
                            continue
                        Kt, Vt = pad(kh[n0:n0 + bk], bk), pad(vh[n0:n0 + bk], bk)
                        S = Q8 @ Kt.T
                        col = np.arange(NKF)[None, :, None] * 8 + fn[:, None, None] + np.arange(2)[None, None, :]
                        s = S[fm[:, None, None], col]
                        key = n0 + col
                        vis = (key < L) & ((key <= row[:, None, None]) | (not causal or mutate == "no-mask"))
                        s = np.where(vis, s * scale, -np.inf).astype(np.float32)
                        tmax = s.max(axis=(1, 2))
                        for mk in masks:
                            tmax = np.maximum(tmax, shuffle_xor(tmax, mk))
                        mnew = np.maximum(m, tmax)
                        alpha = np.where(m > -np.inf, ex(m - mnew), 0).astype(np.float32)
                        p = np.where(s > -np.inf, ex(s - mnew[:, None, None]), 0).astype(np.float32)
                        psum = p.sum(axis=(1, 2))
                        for mk in masks:
                            psum = psum + shuffle_xor(psum, mk)
                        l, m = l * alpha + psum, mnew
                        if mutate != "no-rescale":
                            O *= alpha[:, None, None]
                        P = np.zeros((8, bk), np.float32)
                        P[fm[:, None, None], col] = p           # the S fragments hold P: scatter by the layout
                        PV = P @ Vt
                        dcol = np.arange(ND)[None, :, None] * 8 + fn[:, None, None] + np.arange(2)[None, None, :]
                        O += PV[fm[:, None, None], dcol]
                    live = row < L
                    inv = np.where(l > 0, 1 / l, 0)
                    for lane in np.flatnonzero(live):
                        d = (np.arange(ND)[:, None] * 8 + fn[lane] + np.arange(2)[None, :]).ravel()
                        val = (O[lane] * inv[lane]).ravel()
                        keep = d < D
                        assert np.isnan(o[b, h, row[lane], d[keep]]).all()   # written once
                        o[b, h, row[lane], d[keep]] = val[keep]
    return o


def _case(task_name, axes, seed=0):
    definition = load_task(task_name).definition
    inp = make_inputs(definition, Workload(axes=axes, inputs={}), seed)
    return definition, inp, run_reference(definition, inp)["o"]


SHAPES = [  # (batch, q_heads, kv_heads, seqlen, head_dim): seqlen 1, GQA, odd seqlen, head_dim 80 (not a power of 2)
    {"batch": 1, "q_heads": 1, "kv_heads": 1, "seqlen": 1, "head_dim": 64},
    {"batch": 1, "q_heads": 4, "kv_heads": 2, "seqlen": 77, "head_dim": 80},
    {"batch": 2, "q_heads": 2, "kv_heads": 1, "seqlen": 40, "head_dim": 16},
]


@pytest.mark.parametrize("task_name", TASKS)
@pytest.mark.parametrize("axes", SHAPES, ids=lambda a: "b{batch}h{q_heads}g{kv_heads}L{seqlen}d{head_dim}".format(**a))
@pytest.mark.parametrize("knobs, choices", [({"simdgroups": 4, "block_k": 16}, {"exp": "exp2"}),
                                            ({"simdgroups": 2, "block_k": 32}, {"schedule": "heavy-first"}),
                                            ({"simdgroups": 8, "block_k": 32}, {"k_access": "rows"})])
def test_flash_tile_loop_meets_the_task_tolerance(task_name, axes, knobs, choices):
    """The flash body's algorithm (not the Metal code), in fp32 on the fp16 inputs, rounded to fp16 at the store,
    against the float64 reference at the task's tolerance; the constants come from the rendered body and launch."""
    definition, inp, ref = _case(task_name, axes)
    k = PACK.render(definition, {"family": "flash", **choices}, knobs)
    tmpl = k.launch["template"]
    assert tmpl == {"NSG": knobs["simdgroups"], "BK": knobs["block_k"]}
    o = emulate_flash(inp["q"], inp["k"], inp["v"], bool(definition.axes["causal"].value), k.sources["kernel.metal"],
                      tmpl["NSG"], tmpl["BK"], k.choices["exp"] == "exp2", k.choices["schedule"] == "heavy-first")
    assert not np.isnan(o).any()                               # every output element written
    tol = definition.tolerance_for("float16")
    np.testing.assert_allclose(o.astype(np.float16).astype(np.float64), ref, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("mutate", ["no-mask", "xor-1", "no-rescale"])
def test_the_flash_emulation_fails_for_a_broken_kernel(mutate):
    definition, inp, ref = _case("attention-prefill", SHAPES[1])
    body = PACK.render(definition, {"family": "flash"}, {}).sources["kernel.metal"]
    with np.errstate(invalid="ignore", divide="ignore"):        # a broken reduction makes -inf - -inf
        o = emulate_flash(inp["q"], inp["k"], inp["v"], True, body, 4, 16, False, False, mutate=mutate)
    assert not np.allclose(o, ref, rtol=5e-3, atol=2e-3)


# -- the bodies as C++ against Metal stubs ------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_every_body_type_checks_as_cpp_against_metal_declarations(tmp_path):
    """A proxy for the Metal compiler (not one): the naive kernels and every path above, wrapped as MLX wraps a
    body and instantiated for a workload of each task (head_dim 80 causal, 128 non-causal), has no undeclared
    name, no type error, no variable-length array."""
    units = [METAL_STUBS, ATTENTION_STUBS]
    for task_name, wl in (("attention-prefill", "d80"), ("attention-prefill-noncausal", "gqa-d128")):
        task = load_task(task_name)
        axes = task.definition.axis_values(task.workload(wl))
        naive = Candidate(target=TARGET, sources={"kernel.metal": task.naive_sources[TARGET]},
                          launch=task.naive_launch[TARGET])
        bodies = [naive] + [PACK.render(task.definition, c, kn).candidate() for c, kn in PATHS]
        for i, cand in enumerate(bodies):
            units.append(as_cpp(cand, task.definition, f"k_{task_name.replace('-', '_')}_{i}", axes))
    src = tmp_path / "bodies.cpp"
    src.write_text("\n".join(units))
    r = cpp_syntax(src)
    assert r.returncode == 0, r.stderr[-4000:]
    assert src.read_text().count("simdgroup_multiply_accumulate(sf[j], qf[dd], kf, sf[j]);") >= 10
    # the check can fail: a CUDA-ism the static rules do not name (a half2 type) is an undeclared name
    src.write_text(src.read_text().replace("simdgroup_float8x8 kf;", "half2 kf;", 1))
    r = cpp_syntax(src, strict=False)
    assert r.returncode != 0 and "half2" in r.stderr
