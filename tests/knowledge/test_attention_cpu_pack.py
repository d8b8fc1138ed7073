"""The attention cpu pack (prefill, causal and non-causal): every family x its decisions' default and every
choice taken alone render, compile and pass the judge on small check workloads, including large-logits (logits
of std 64, where a softmax without the running max overflows); the fp32-tile path with the polynomial exp and
shared GQA tiles passes every check workload; a variant with the max subtraction removed fails large-logits. The
bfloat16 tasks (attention-prefill-bf16, attention-prefill-noncausal-bf16): every path renders with bfloat16 loads and
stores, and a few paths (the naive family, the fast combination, omp-simd with -ffast-math) pass the judge.

Each family's default path and the fast combination are judged on both masks (both bfloat16 tasks); every other
single move, combination and random path on one, the tasks alternating down the list, so that each mask still
sees every family and most decisions (a judged kernel costs ~1 s of compile and worker start on 2 cores)."""

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import Candidate, Status
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .paths import path_id, random_paths, single_moves

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
BF16_TASKS = ["attention-prefill-bf16", "attention-prefill-noncausal-bf16"]
SMALL = ["tiny-L1", "mha-odd", "d80", "large-logits"]
FAST = {"family": "online-tiles", "simd": "f32-tiles", "exp": "exp2-poly", "gqa": "group-shared"}


@pytest.fixture(scope="module")
def pack():
    return load_pack("attention-prefill", "cpu")


@pytest.fixture(scope="module")
def evaluators():
    cfg = EvalConfig(seeds=[7], timeout_s=30.0, spare_workers=1)  # a spare starts while the next kernel compiles
    evs = {t: Evaluator(load_task(t), config=cfg) for t in TASKS + BF16_TASKS}
    yield evs
    for ev in evs.values():
        ev.close()


def _candidate(kernel, source: str | None = None) -> Candidate:
    return Candidate(target="cpu", sources={"kernel.c": source or kernel.sources["kernel.c"]},
                     entry_point=kernel.entry_point, compile_flags=list(kernel.compile_flags))


def _assert_passes(pack, ev, path, workloads) -> None:
    """Render ``path`` (choices, knobs) for ``ev``'s task and assert it passes the judge on ``workloads``."""
    choices, knobs = path
    kernel = pack.render(ev.definition, choices, knobs)
    res = ev.evaluate(_candidate(kernel), workloads, timing=False, with_speedup=False)
    assert res.status is Status.PASSED, f"{kernel.choices} {kernel.knobs}: {res.message}"


MOVES = single_moves(load_pack("attention-prefill", "cpu"))


def _cases(paths, tasks, both=lambda p: not p[1] and len(p[0]) == 1) -> list[tuple[str, tuple[dict, dict]]]:
    """(task, path) pairs: a path ``both`` selects (a family's default) on every task, the others on one task
    each, alternating."""
    out, i = [], 0
    for p in paths:
        if both(p):
            out += [(t, p) for t in tasks]
        else:
            out.append((tasks[i % len(tasks)], p))
            i += 1
    return out


def _ids(cases) -> list[str]:
    return [f"{path_id(p)}-{t}" for t, p in cases]


MOVE_CASES = _cases(MOVES, TASKS)


def test_every_reachable_path_renders(pack):
    """Sampled full paths (every decision and knob drawn) render for every task, deterministically; the element type
    follows the task's dtype (bfloat16: uint16_t bits, no _Float16 anywhere)."""
    for task in TASKS + BF16_TASKS:
        d = load_task(task).definition
        for choices, knobs in random_paths(pack, 40, seed=9) + MOVES:
            k = pack.render(d, choices, knobs)
            src = k.sources["kernel.c"]
            assert src == pack.render(d, choices, knobs).sources["kernel.c"]
            if task in BF16_TASKS:
                assert "_Float16" not in src and "typedef uint16_t elem_t;" in src and "STO(x) f2bf(x)" in src
            else:
                assert "typedef _Float16 elem_t;" in src


@pytest.mark.parametrize(("task", "path"), MOVE_CASES, ids=_ids(MOVE_CASES))
def test_single_moves_pass_small_workloads(pack, evaluators, task, path):
    _assert_passes(pack, evaluators[task], path, SMALL)


COMBOS = [(FAST, {}), (FAST, {"block_q": 64, "block_k": 32, "poly_degree": 3}),
          ({**FAST, "parallelism": "dynamic-heavy-first", "compile_flags": "fast-math"}, {"block_q": 8}),
          ({"family": "naive-rows", "simd": "omp-simd", "exp": "exp2-poly", "compile_flags": "fast-math"}, {})]
COMBO_CASES = _cases(COMBOS, TASKS, both=lambda p: p == (FAST, {}))


@pytest.mark.parametrize(("task", "path"), COMBO_CASES, ids=_ids(COMBO_CASES))
def test_fast_combinations_pass_small_workloads(pack, evaluators, task, path):
    _assert_passes(pack, evaluators[task], path, SMALL + ["gqa-b3"])


RANDOM_CASES = _cases(random_paths(load_pack("attention-prefill", "cpu"), 8, seed=2026), TASKS, both=lambda p: False)


@pytest.mark.slow
@pytest.mark.parametrize(("task", "path"), RANDOM_CASES, ids=_ids(RANDOM_CASES))
def test_random_full_paths_pass_every_check_workload(pack, evaluators, task, path):
    ev = evaluators[task]
    _assert_passes(pack, ev, path, [w.name for w in ev.task.workloads if w.purpose == "check"])


@pytest.mark.parametrize("choices", [{"family": "online-tiles"}, FAST], ids=["online-tiles", "fast"])
def test_without_the_running_max_large_logits_fails(pack, evaluators, choices):
    """exp(s) against a running max fixed at 0 overflows once logits pass ~88 (log2 units: ~128): only the
    large-logits workload (q, k ~ normal(0, 8)) catches it."""
    ev = evaluators["attention-prefill"]
    kernel = pack.render(ev.definition, choices, {})
    src = kernel.sources["kernel.c"]
    broken = src.replace("const float mnew = MAX(mo, tmax);", "const float mnew = 0.0f;")
    assert broken != src
    res = ev.evaluate(_candidate(kernel, broken), ["mha-odd", "d80", "large-logits"], timing=False,
                      with_speedup=False)
    assert [r.status for r in res.workloads] == [Status.PASSED, Status.PASSED, Status.INCORRECT_NUMERICAL], \
        [r.message for r in res.workloads]


BF16_PATHS = [({"family": "naive-rows"}, {}), (FAST, {}),
              ({"family": "online-tiles", "simd": "omp-simd", "exp": "exp2-poly", "compile_flags": "fast-math"},
               {"block_q": 8})]
BF16_CASES = _cases(BF16_PATHS, BF16_TASKS, both=lambda p: p == (FAST, {}))


@pytest.mark.parametrize(("task", "path"), BF16_CASES, ids=_ids(BF16_CASES))
def test_bf16_paths_pass_small_workloads(pack, evaluators, task, path):
    """The bfloat16 conversions (bit-shift loads, nearest-even stores) in the scalar, omp-simd and fp32-tile loads."""
    _assert_passes(pack, evaluators[task], path, SMALL + ["gqa-b3"])
