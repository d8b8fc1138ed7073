"""The attention-decode cpu pack: every family's default path and every single move from a family's root render,
compile and pass the judge on small check workloads, including large-logits (logits of std 64: a softmax without
the running max overflows) and kv_len 513 (three chunks of split-kv's default 256 keys, so the combine is
exercised); split-kv with the log-sum-exp rescale of its combine removed fails."""

import pathlib

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import Candidate, Status
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .paths import path_id, random_paths, single_moves

TASK = "attention-decode"
SMALL = ["tiny-L1", "odd-b7", "d80", "large-logits"]
FAST = {"family": "split-kv", "exp": "exp2-poly", "split": "occupancy-chunks"}


@pytest.fixture(scope="module")
def pack():
    return load_pack(TASK, "cpu")


@pytest.fixture(scope="module")
def evaluator():
    # a spare worker starts while the next kernel compiles (a search's judge keeps three)
    ev = Evaluator(load_task(TASK), config=EvalConfig(seeds=[7], timeout_s=30.0, spare_workers=1))
    yield ev
    ev.close()


def _candidate(kernel, source: str | None = None) -> Candidate:
    return Candidate(target="cpu", sources={"kernel.c": source or kernel.sources["kernel.c"]},
                     entry_point=kernel.entry_point, compile_flags=list(kernel.compile_flags))


MOVES = single_moves(load_pack(TASK, "cpu"))
_CPUINFO = pathlib.Path("/proc/cpuinfo")
HAS_F16C = _CPUINFO.exists() and " f16c" in _CPUINFO.read_text()


def test_pack_shares_the_prefill_prelude(pack):
    """The decode pack renders the attention/cpu pack's prelude (linked, not copied): h2f and the polynomial
    exp are the tested ones."""
    d = load_task(TASK).definition
    src = pack.render(d, FAST, {}).sources["kernel.c"]
    prefill = load_pack("attention-prefill", "cpu").render(load_task("attention-prefill").definition,
                                                           {"family": "naive-rows", "simd": "omp-simd", "exp": "exp2-poly"}, {})
    start = "typedef uint16_t __attribute__((may_alias)) half_bits;"
    end = "#define SCORE_SCALE LOG2E"
    assert start in src and end in src
    part = src[src.index(start):src.index(end)]
    assert part in prefill.sources["kernel.c"]


def test_every_reachable_path_renders(pack):
    """Sampled full paths (every decision and knob drawn) render, deterministically."""
    d = load_task(TASK).definition
    for choices, knobs in random_paths(pack, 40, seed=9) + MOVES:
        k = pack.render(d, choices, knobs)
        assert k.sources["kernel.c"] == pack.render(d, choices, knobs).sources["kernel.c"]


@pytest.mark.parametrize("path", MOVES, ids=[path_id(p) for p in MOVES])
def test_single_moves_pass_small_workloads(pack, evaluator, path):
    choices, knobs = path
    if choices.get("loads") == "f16c" and not HAS_F16C:
        pytest.skip("this CPU has no F16C")
    kernel = pack.render(evaluator.definition, choices, knobs)
    res = evaluator.evaluate(_candidate(kernel), SMALL, timing=False, with_speedup=False)
    assert res.status is Status.PASSED, f"{kernel.choices} {kernel.knobs}: {res.message}"


COMBOS = [(FAST, {}), ({**FAST, "loads": "f16c"}, {"block_k": 128}), ({**FAST, "compile_flags": "fast-math", "parallelism": "dynamic"},
                       {"items_per_thread": 8, "block_k": 16, "poly_degree": 3}),
          ({"family": "split-kv", "exp": "exp2-poly"}, {"kv_chunk": 128, "block_k": 256}),
          ({"family": "group-rows", "exp": "exp2-poly", "compile_flags": "fast-math"}, {"block_k": 256})]


@pytest.mark.parametrize("path", COMBOS, ids=[path_id(p) for p in COMBOS])
def test_fast_combinations_pass_small_workloads(pack, evaluator, path):
    choices, knobs = path
    if choices.get("loads") == "f16c" and not HAS_F16C:
        pytest.skip("this CPU has no F16C")
    kernel = pack.render(evaluator.definition, choices, knobs)
    res = evaluator.evaluate(_candidate(kernel), SMALL + ["mqa-d128"], timing=False, with_speedup=False)
    assert res.status is Status.PASSED, f"{kernel.choices} {kernel.knobs}: {res.message}"


@pytest.mark.slow
@pytest.mark.parametrize("path", random_paths(load_pack(TASK, "cpu"), 4, seed=2026), ids=path_id)
def test_random_full_paths_pass_every_check_workload(pack, evaluator, path):
    choices, knobs = path
    if choices.get("loads") == "f16c" and not HAS_F16C:
        pytest.skip("this CPU has no F16C")
    kernel = pack.render(evaluator.definition, choices, knobs)
    checks = [w.name for w in evaluator.task.workloads if w.purpose == "check"]
    res = evaluator.evaluate(_candidate(kernel), checks, timing=False, with_speedup=False)
    assert res.status is Status.PASSED, f"{kernel.choices} {kernel.knobs}: {res.message}"


@pytest.mark.parametrize("choices", [{"family": "split-kv"}, {**FAST, "split": "fixed-chunks"}],
                         ids=["split-kv", "split-kv-poly"])
def test_combine_without_the_rescale_fails(pack, evaluator, choices):
    """Chunks combined by plain sums of their (l, acc), each relative to its own max instead of rescaled by
    e^(m_c - M): right while kv_len fits one chunk (tiny-L1, d80: 129 keys), wrong once there are several
    (large-logits: 513 keys, 3 chunks of 256)."""
    kernel = pack.render(evaluator.definition, choices, {})
    src = kernel.sources["kernel.c"]
    broken = src.replace("const float w = exp_e(mc - M);", "const float w = 1.0f + 0.0f * mc;")
    assert broken != src
    res = evaluator.evaluate(_candidate(kernel, broken), ["tiny-L1", "d80", "large-logits"], timing=False,
                             with_speedup=False)
    assert [r.status for r in res.workloads] == [Status.PASSED, Status.PASSED, Status.INCORRECT_NUMERICAL], \
        [r.message for r in res.workloads]
