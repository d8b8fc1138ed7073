"""The attention cuda pack (prefill, causal and non-causal). Without a GPU: every family's default path and every
single move from a family's root renders, passes the cuda static rules and limits, its launch plan parses and
resolves for every workload of both tasks (exactly one launch runs on each), and the source compiles with
nvcc -arch=sm_90 without spills over 64 bytes (skipped without nvcc). A NumPy emulation of the flash family's tile
loop (blocks, 16-row slices, key tiles, causal skip and masks, online softmax with exp2) against the task's
float64 reference checks the algorithm's indexing, not the CUDA code: nothing here has run on a GPU."""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from ksearch.eval import static_checks
from ksearch.eval.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import cuda_launch
from ksearch.tasks import load_task

from .paths import single_moves

TASKS = ["attention-prefill", "attention-prefill-noncausal"]


@pytest.fixture(scope="module")
def pack():
    return load_pack("attention-prefill", "cuda")


MOVES = single_moves(load_pack("attention-prefill", "cuda"))


def _candidate(k) -> Candidate:
    return Candidate(target="cuda", sources=dict(k.sources), entry_point="run", launch=k.launch,
                     compile_flags=list(k.compile_flags))


def test_moves_cover_both_families_and_every_decision():
    assert {c["family"] for c, _ in MOVES} == {"naive-rows", "flash"}
    assert {d for c, _ in MOVES for d in c if d != "family"} == {"kv_pipeline", "q_tile", "exp", "masking", "schedule"}


def test_description_says_nothing_ran_on_a_gpu(pack):
    assert "NOTHING HERE HAS RUN ON A GPU YET" in pack.description


@pytest.mark.parametrize("task", TASKS)
def test_every_move_renders_passes_static_rules_and_resolves_on_every_workload(pack, task):
    t = load_task(task)
    d = t.definition
    rules = static_checks.rules_for("cuda")
    for choices, knobs in MOVES:
        k = pack.render(d, choices, knobs)
        src = k.sources["kernel.cu"]
        assert src == pack.render(d, choices, knobs).sources["kernel.cu"]
        findings = static_checks.check(_candidate(k), rules)
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


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_sources_compile_for_sm90_without_spills(pack, tmp_path):
    """The CUDA C++ NVRTC gets, compiled by nvcc as a proxy (errors, registers, spills); both masks."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(task, c, kn) for task in TASKS for c, kn in MOVES if task == TASKS[0] or c["family"] == "flash"
            and len(c) == 1 and not kn]

    def compile_one(i, task, choices, knobs):
        k = pack.render(load_task(task).definition, choices, knobs)
        src = tmp_path / f"k{i}.cu"
        src.write_text(k.sources["kernel.cu"])
        r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-c", str(src), "-o", str(tmp_path / f"k{i}.o"),
                            "-Xptxas", "-v"], capture_output=True, text=True, timeout=300)
        return task, choices, knobs, k, r

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda a: compile_one(*a), [(i, *j) for i, j in enumerate(jobs)]))
    for task, choices, knobs, k, r in results:
        assert r.returncode == 0, f"{task} {choices} {knobs}:\n{r.stderr[-3000:]}"
        if k.family != "naive-rows":   # the naive kernel's row arrays are local memory by design
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", r.stderr)]
            assert len(spills) == 3 and max(spills) <= 64, f"{task} {choices} {knobs} spills:\n{r.stderr[-2000:]}"


# -- the flash tile loop, emulated in NumPy (the algorithm's indexing, not the CUDA code) ---------------------------

def _flash_emulated(q, k, v, causal, BM, BN, W, masking="diagonal-only", exp2=True, heavy_first=True):
    """o as the flash kernel computes it, block by block and slice by slice, float64 apart from P rounded to fp16."""
    batch, hq, L, D = q.shape
    group = hq // k.shape[1]
    o = np.full(q.shape, np.nan)
    unit = np.log2(np.e) if exp2 else 1.0
    ex = np.exp2 if exp2 else np.exp
    scale = unit / np.sqrt(D)
    mblocks = -(-L // BM)
    for bh in range(batch * hq):
        b, h = divmod(bh, hq)
        kh, vh = k[b, h // group], v[b, h // group]
        for x in range(mblocks):
            mb = mblocks - 1 - x if (causal and heavy_first) else x
            m0 = mb * BM
            kv_end = min(L, m0 + BM) if causal else L
            ntiles = -(-kv_end // BN)
            for warp in range(W):
                r0 = m0 + warp * 16
                if r0 >= L:
                    continue
                rows = np.arange(r0, r0 + 16)
                qs = np.zeros((16, D))
                qs[rows < L] = q[b, h, rows[rows < L]]
                m, lsum, acc = np.full(16, -np.inf), np.zeros(16), np.zeros((16, D))
                for t in range(ntiles):
                    n0 = t * BN
                    if causal and n0 > r0 + 15:
                        continue
                    keys = np.arange(n0, n0 + BN)
                    kt, vt = np.zeros((BN, D)), np.zeros((BN, D))
                    kt[keys < L], vt[keys < L] = kh[keys[keys < L]], vh[keys[keys < L]]
                    s = (qs @ kt.T) * scale
                    masked = masking == "every-tile" or n0 + BN > L or (causal and n0 + BN - 1 > r0)
                    if masked:
                        bad = (keys[None, :] >= L) | ((keys[None, :] > rows[:, None]) if causal else False)
                        s = np.where(bad, -np.inf, s)
                    mnew = np.maximum(m, s.max(axis=1))
                    mu = np.where(mnew == -np.inf, 0.0, mnew)
                    alpha = ex(m - mu)
                    p = ex(s - mu[:, None])
                    lsum = lsum * alpha + p.sum(axis=1)
                    m = mnew
                    acc = acc * alpha[:, None] + p.astype(np.float16).astype(np.float64) @ vt
                ok = rows < L
                o[b, h, rows[ok]] = acc[ok] / lsum[ok, None]
    return o


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("shape, tiles", [((1, 4, 2, 77, 80), (64, 32, 4)), ((2, 2, 2, 33, 64), (128, 64, 8)),
                                          ((1, 3, 1, 1, 16), (64, 64, 4)), ((1, 2, 1, 200, 128), (64, 64, 4))])
def test_flash_tile_loop_matches_the_reference(task, shape, tiles):
    batch, hq, hkv, L, D = shape
    rng = np.random.default_rng(L * 7 + D)
    q, k, v = (rng.normal(size=(batch, h, L, D)).astype(np.float16) for h in (hq, hkv, hkv))
    ns = {}
    definition = load_task(task).definition
    exec(definition.reference, ns)
    ref = ns["run"](q, k, v)
    tol = definition.tolerance["float16"]
    causal = task == "attention-prefill"
    for masking in ("diagonal-only", "every-tile"):
        got = _flash_emulated(*(x.astype(np.float64) for x in (q, k, v)), causal, *tiles, masking=masking)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=tol.rtol, atol=tol.atol)


def test_flash_emulation_without_the_causal_mask_fails():
    """The emulation is sensitive to the mask: dropping it for the causal task misses the reference."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 2, 50, 64)) for _ in range(3))
    ns = {}
    exec(load_task("attention-prefill").definition.reference, ns)
    got = _flash_emulated(q, k, v, False, 64, 32, 4)
    assert not np.allclose(got, ns["run"](q, k, v), atol=2e-3, rtol=5e-3)
