"""The attention packs on an NVIDIA GPU (marked ``cuda``: run on the device machine, skipped elsewhere). Every
single move of the cuda and triton prefill packs (each family's default path and each one-step change from it),
and each task's naive kernel, is compiled, checked against the task's float64 reference on every check workload
by the evaluator (poisoned outputs, two seeds) and timed on one bench workload (llama3-8b-L4k). The printed line
per kernel (``-s``) gives its median ms, which is how the packs' ratings were first compared on the H200."""

import pytest

from ksearch.eval.records import Candidate, Status
from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .paths import path_id, single_moves

pytestmark = pytest.mark.cuda

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
TARGETS = ["cuda", "triton"]
BENCH = "llama3-8b-L4k"


def _moves(target):
    return [(target, p) for p in single_moves(load_pack("attention-prefill", target))]


CASES = _moves("cuda") + _moves("triton")


@pytest.fixture(scope="module")
def evaluate():
    """evaluate(task, target, candidate, workloads): one evaluator per (task, target) for the module, so the
    float64 references (the L4k one takes seconds) are computed once."""
    from ksearch.eval.evaluator import EvalConfig, Evaluator

    evaluators = {}

    def run(task, target, candidate, workloads):
        key = (task.name, target)
        if key not in evaluators:
            evaluators[key] = Evaluator(task, target, None, EvalConfig(seeds=[1, 2]))
        return evaluators[key].evaluate(candidate, workloads)
    yield run
    for ev in evaluators.values():
        ev.close()


def _check(evaluate, task, target, cand, label):
    checks = [w.name for w in task.workloads if w.purpose == "check"]
    result = evaluate(task, target, cand, checks + [BENCH])
    bench = [w for w in result.workloads if w.workload == BENCH]
    ms = bench[0].median_ms if bench and bench[0].median_ms else float("nan")
    print(f"\nGPU {task.name} {target} {label}: {result.status.value} {ms:.3f} ms on {BENCH}")
    assert result.status is Status.PASSED, f"{label}: {result.message}"[:4000]


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("target", TARGETS)
def test_naive_kernel_passes(evaluate, name, target):
    t = load_task(name)
    if target == "cuda":
        cand = Candidate(target="cuda", sources={"kernel.cu": t.naive_sources["cuda"]}, launch=t.naive_launch["cuda"])
    else:
        cand = Candidate(target="triton", sources={"kernel.py": t.naive_sources["triton"]}, entry_point="run")
    _check(evaluate, t, target, cand, "naive")


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("target, path", CASES, ids=[f"{t}:{path_id(p)}" for t, p in CASES])
def test_single_move_passes(evaluate, name, target, path):
    t = load_task(name)
    k = load_pack(name, target).render(t.definition, *path)
    if target == "cuda":
        cand = Candidate(target="cuda", sources=dict(k.sources), entry_point="run", launch=k.launch,
                         compile_flags=list(k.compile_flags))
    else:
        cand = Candidate(target="triton", sources=dict(k.sources), entry_point="run",
                         compile_flags=list(k.compile_flags))
    _check(evaluate, t, target, cand, path_id(path))
