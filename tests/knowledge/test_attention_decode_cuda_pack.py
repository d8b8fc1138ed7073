"""The attention-decode cuda pack. Without a GPU: every single move from a family's root renders, passes the cuda
static rules, its launch plan parses and resolves on every workload (and on hidden-like head_dims and GQA groups:
exactly one decode_split runs, decode_combine exactly where there is more than one chunk, the scratch shapes
resolve), and every distinct source compiles under NVRTC for sm_90 with the plan's kernel name expressions
(tests/nvrtc.py; skipped without the nvidia-cuda-nvrtc wheel or CUDA headers). A NumPy emulation of split-kv's
index math (chunks rounded to block steps, lane groups and their keys, the per-lane-group online softmax, the
shuffle and shared-memory merges, empty chunks, the log-sum-exp combine) matches the task's float64 reference, and
fails without the combine's rescale. This checks the algorithm's indexing, not the CUDA code: nothing here has run
on a GPU."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ksearch.eval import static_checks
from ksearch.eval.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import cuda_launch
from ksearch.targets.cuda import BASE_OPTIONS, combined_source
from ksearch.tasks import load_task

from ..nvrtc import nvrtc_compile, nvrtc_status
from .paths import single_moves

TASK = "attention-decode"
MOVES = single_moves(load_pack(TASK, "cuda"))
#: the H200's opt-in shared memory per block (227 KB)
MAX_SHARED = 232448


@pytest.fixture(scope="module")
def pack():
    return load_pack(TASK, "cuda")


def _candidate(k) -> Candidate:
    return Candidate(target="cuda", sources=dict(k.sources), entry_point="run", launch=k.launch,
                     compile_flags=list(k.compile_flags))


def test_moves_cover_both_families_and_every_decision():
    assert {c["family"] for c, _ in MOVES} == {"naive-heads", "split-kv"}
    assert {d for c, _ in MOVES for d in c if d != "family"} == {"split", "loads", "cache_hint", "exp"}


def test_rendering_is_deterministic(pack):
    d = load_task(TASK).definition
    for fam in ("naive-heads", "split-kv"):
        a, b = pack.render(d, {"family": fam}, {}), pack.render(d, {"family": fam}, {})
        assert a.sources == b.sources and a.launch == b.launch and a.content_hash == b.content_hash


def test_description_says_nothing_ran_on_a_gpu(pack):
    assert "NOTHING HERE HAS RUN ON A GPU YET" in pack.description


def _hidden_axes(w):
    """The workload's axes and variants with the head_dims and GQA groups hidden workloads may have."""
    out = [dict(w.axes)]
    for hd in (16, 72, 80, 100, 200, 256):
        out.append({**w.axes, "head_dim": hd})
    for hq in (3, 12, 40, 128):
        out.append({**w.axes, "q_heads": hq * w.axes["kv_heads"]} if hq * w.axes["kv_heads"] <= 128 else
                   {**w.axes, "q_heads": hq, "kv_heads": 1})
    return out


def _check_plan(k, plan, d, axes):
    runs = cuda_launch.resolve(plan, d, axes, max_shared_bytes=MAX_SHARED)
    if k.family == "naive-heads":
        assert [r.kernel for r in runs] == ["naive_decode"]
        return
    split = [r for r in runs if r.kernel != "decode_combine"]
    assert len(split) == 1, (k.choices, k.knobs, axes, runs)
    shapes = {n: cuda_launch.temporary_shape(tmp, n, axes) for n, tmp in plan.temporaries.items()}
    splits = split[0].grid[1]
    assert shapes["mid_lse"] == (axes["batch"] * axes["q_heads"], splits)
    assert shapes["mid_o"] == (axes["batch"] * axes["q_heads"], splits, axes["head_dim"])
    assert [r.kernel for r in runs][1:] == (["decode_combine"] if splits > 1 else []), (axes, runs)
    hdp, gm = (int(x) for x in split[0].kernel.split("<")[1].split(",")[:2])
    group = axes["q_heads"] // axes["kv_heads"]
    assert hdp // 2 < max(axes["head_dim"], 33) <= hdp and (gm // 2 < group <= gm or gm == 8 < group)
    assert split[0].grid[0] == axes["batch"] * axes["kv_heads"] * -(-group // gm)


def test_every_move_renders_passes_static_rules_and_resolves_on_every_workload(pack):
    """Every move on every workload of the task; the family roots and the split choices also on hidden-like
    head_dims and groups (eval_expr compiles each expression per call: the full product would take seconds)."""
    t = load_task(TASK)
    d = t.definition
    rules = static_checks.rules_for("cuda")
    for choices, knobs in MOVES:
        k = pack.render(d, choices, knobs)
        src = k.sources["kernel.cu"]
        findings = static_checks.check(_candidate(k), rules)
        assert findings == [], f"{k.choices} {k.knobs}: " + "; ".join(map(str, findings))
        plan = cuda_launch.parse_plan(k.launch, d)
        for launch in plan.launches:
            assert launch.kernel.split("<")[0] in src
        wide = set(choices) <= {"family", "split"} and not knobs
        for w in t.workloads:
            for axes in (_hidden_axes(w) if wide and w.name in ("tiny-L1", "mqa-d128") else [dict(w.axes)]):
                _check_plan(k, plan, d, axes)


@pytest.mark.skipif(nvrtc_status() is not None, reason=str(nvrtc_status()))
def test_every_distinct_source_compiles_under_nvrtc(pack):
    """Each family's root with every kernel name its plan has (all head_dim x group buckets of split-kv); every
    other distinct source (moves that change only the split share one) with the kernels it launches on
    llama3-8b-b8-kv4k, to keep NVRTC's ~0.4 s an instantiation within the test budget."""
    t = load_task(TASK)
    d = t.definition
    probe = [w.axes for w in t.workloads if w.name == "llama3-8b-b8-kv4k"]
    jobs = {}
    for choices, knobs in MOVES:
        k = pack.render(d, choices, knobs)
        plan = cuda_launch.parse_plan(k.launch, d)
        if len(choices) == 1 and not knobs:
            names = plan.kernel_names()
        else:
            names = list(dict.fromkeys(r.kernel for ax in probe for r in cuda_launch.resolve(plan, d, ax)))
        key = combined_source(_candidate(k))
        jobs.setdefault(key, [choices, knobs, [], list(k.compile_flags)])[2].extend(
            n for n in names if n not in jobs.get(key, [None, None, []])[2])
    assert len(jobs) >= 8
    with ThreadPoolExecutor(2) as pool:  # ctypes releases the GIL during the compile
        results = list(pool.map(lambda j: nvrtc_compile(j[0], [*BASE_OPTIONS, *j[1][3]], names=j[1][2]),
                                jobs.items()))
    failed = {str(job[:2]): log[:1500] for job, (ok, log) in zip(jobs.values(), results) if not ok}
    assert not failed, failed
