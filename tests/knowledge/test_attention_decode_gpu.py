"""The attention-decode packs on an NVIDIA GPU (marked ``cuda``: run on the device machine, skipped elsewhere).
Every single move of the cuda and triton decode packs (each family's default path and each one-step change from
it), and the task's naive cuda and triton kernels, is compiled, checked against the task's float64 reference on
every check workload by the evaluator (poisoned outputs, two seeds) and timed on one bench workload
(llama3-8b-b8-kv4k: 134 MB of K/V, 32 us at the H200's 4.17 TB/s copy bandwidth). The printed line per kernel
(``-s``) gives its median ms and its fraction of that floor, which is how the packs' ratings are to be compared."""

import pytest

from ksearch.knowledge import load_pack
from ksearch.tasks import load_task

from .gpu_judge import check_and_time, evaluate, naive_candidate  # noqa: F401 (fixture)
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


@pytest.mark.parametrize("target", TARGETS)
def test_naive_kernel_passes(evaluate, target):
    t = load_task(TASK)
    check_and_time(evaluate, t, target, naive_candidate(t, target), "naive", BENCH, FLOOR_MS)


@pytest.mark.parametrize("target, path", CASES, ids=[f"{t}:{path_id(p)}" for t, p in CASES])
def test_single_move_passes(evaluate, target, path):
    t = load_task(TASK)
    k = load_pack(TASK, target).render(t.definition, *path)
    check_and_time(evaluate, t, target, k.candidate(), path_id(path), BENCH, FLOOR_MS)
