"""The attention-decode packs on an NVIDIA GPU (marked ``cuda``: run on the device machine, skipped elsewhere).
Every single move of the cuda and triton decode packs (each family's default path and each one-step change from
it), and the task's naive cuda and triton kernels, is compiled, checked against the task's float64 reference on
every check workload by the evaluator (poisoned outputs, two seeds) and timed on one bench workload
(llama3-8b-b8-kv4k: 134 MB of K/V, 32 us at the H200's 4.17 TB/s copy bandwidth). The printed line per kernel
(``-s``) gives its median ms and its fraction of that floor, which is how the packs' ratings are to be compared."""

import pytest

from ksearch.eval.records import Candidate, Status
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .paths import path_id, single_moves

pytestmark = pytest.mark.cuda

TASK = "attention-decode"
TARGETS = ["cuda", "triton"]
BENCH = "llama3-8b-b8-kv4k"
#: K and V read once plus q and o (the task's cost.bytes at BENCH) over the H200's measured copy bandwidth, in ms
FLOOR_MS = 2 * 8 * 128 * (2 * 8 * 4096 + 2 * 32) / 4.17e12 * 1e3


def _moves(target):
    return [(target, p) for p in single_moves(load_pack(TASK, target))]


CASES = _moves("cuda") + _moves("triton")


@pytest.fixture(scope="module")
def evaluate():
    """evaluate(target, candidate, workloads): one evaluator per target for the module, so the float64 references
    are computed once."""
    from ksearch.eval.evaluator import EvalConfig, Evaluator

    evaluators = {}
    task = load_task(TASK)

    def run(target, candidate, workloads):
        if target not in evaluators:
            evaluators[target] = Evaluator(task, target, None, EvalConfig(seeds=[1, 2]))
        return evaluators[target].evaluate(candidate, workloads)
    yield run
    for ev in evaluators.values():
        ev.close()


def _check(evaluate, target, cand, label):
    task = load_task(TASK)
    checks = [w.name for w in task.workloads if w.purpose == "check"]
    result = evaluate(target, cand, checks + [BENCH])
    bench = [w for w in result.workloads if w.workload == BENCH]
    ms = bench[0].median_ms if bench and bench[0].median_ms else float("nan")
    print(f"\nGPU {TASK} {target} {label}: {result.status.value} {ms:.4f} ms on {BENCH} "
          f"({FLOOR_MS / ms:.0%} of the copy-bandwidth floor)")
    assert result.status is Status.PASSED, f"{label}: {result.message}"[:4000]


@pytest.mark.parametrize("target", TARGETS)
def test_naive_kernel_passes(evaluate, target):
    t = load_task(TASK)
    if target == "cuda":
        cand = Candidate(target="cuda", sources={"kernel.cu": t.naive_sources["cuda"]}, launch=t.naive_launch["cuda"])
    else:
        cand = Candidate(target="triton", sources={"kernel.py": t.naive_sources["triton"]}, entry_point="run")
    _check(evaluate, target, cand, "naive")


@pytest.mark.parametrize("target, path", CASES, ids=[f"{t}:{path_id(p)}" for t, p in CASES])
def test_single_move_passes(evaluate, target, path):
    t = load_task(TASK)
    k = load_pack(TASK, target).render(t.definition, *path)
    if target == "cuda":
        cand = Candidate(target="cuda", sources=dict(k.sources), entry_point="run", launch=k.launch,
                         compile_flags=list(k.compile_flags))
    else:
        cand = Candidate(target="triton", sources=dict(k.sources), entry_point="run",
                         compile_flags=list(k.compile_flags))
    _check(evaluate, target, cand, path_id(path))
