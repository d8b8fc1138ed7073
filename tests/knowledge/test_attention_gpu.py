"""The attention packs on an NVIDIA GPU (marked ``cuda``: run on the device machine, skipped elsewhere). Every
single move of the cuda and triton prefill packs (each family's default path and each one-step change from it),
and each task's naive kernel, is compiled, checked against the task's float64 reference on every check workload
by the evaluator (poisoned outputs, two seeds) and timed on one bench workload (llama3-8b-L4k). The printed line
per kernel (``-s``) gives its median ms, which is how the packs' ratings were first compared on the H200."""

import pytest

from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .gpu_judge import check_and_time, evaluate, naive_candidate  # noqa: F401 (fixture)
from .paths import path_id, single_moves

pytestmark = pytest.mark.cuda

TASKS = ["attention-prefill", "attention-prefill-noncausal"]
TARGETS = ["cuda", "triton"]
BENCH = "llama3-8b-L4k"


def _moves(target):
    return [(target, p) for p in single_moves(load_pack("attention-prefill", target))]


CASES = _moves("cuda") + _moves("triton")


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("target", TARGETS)
def test_naive_kernel_passes(evaluate, name, target):
    t = load_task(name)
    check_and_time(evaluate, t, target, naive_candidate(t, target), "naive", BENCH)


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("target, path", CASES, ids=[f"{t}:{path_id(p)}" for t, p in CASES])
def test_single_move_passes(evaluate, name, target, path):
    t = load_task(name)
    k = load_pack(name, target).render(t.definition, *path)
    check_and_time(evaluate, t, target, k.candidate(), path_id(path), BENCH)
