"""Property workloads: a workload's own input distributions (``Workload.distributions``) make inputs that catch
bugs the default ones never reach. The judge is the cpu evaluator; the kernels are the naive one and a copy with
the textbook softplus log(1 + exp(x)) in fp32, which overflows to inf for x > 88."""

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.tasks import load_task

QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)
THRESHOLD = "float dt = x > 20.0f ? x : log1pf(expf(x)); /* softplus */"
NAIVE_SOFTPLUS = "float dt = logf(1.0f + expf(x)); /* softplus without the large-x branch */"


def kernels(task):
    naive = task.naive_sources["cpu"]
    assert THRESHOLD in naive
    return naive, naive.replace(THRESHOLD, NAIVE_SOFTPLUS)


@pytest.fixture(scope="module", params=["selective-scan", "selective-scan-fp16"])
def evaluator(request):
    return Evaluator(load_task(request.param), config=EvalConfig(seeds=[21, 22, 23], timeout_s=20.0, timing=QUICK))


def defaults(task) -> list[str]:
    return [w.name for w in task.workloads if w.purpose == "check" and not w.distributions]


def test_extreme_dt_is_a_check_workload_with_its_own_delta(evaluator):
    w = evaluator.task.workload("extreme-dt")
    assert w.purpose == "check" and set(w.distributions) == {"delta"}
    assert w.distributions["delta"].std >= 30  # softplus(delta + bias) past 88 on some elements of every seed
    assert "extreme-dt" not in defaults(evaluator.task) and len(defaults(evaluator.task)) >= 4


def test_naive_kernel_passes_extreme_dt(evaluator):
    naive, _ = kernels(evaluator.task)
    res = evaluator.evaluate(Candidate(target="cpu", sources={"kernel.c": naive}), ["extreme-dt"], timing=False)
    assert res.status is Status.PASSED, res.message


def test_naive_softplus_fails_only_on_extreme_dt(evaluator):
    """The default check workloads pass the overflowing softplus (their delta + bias stays below 3); extreme-dt
    fails it, and only because of its delta distribution: the same axes with the definition's pass."""
    task = evaluator.task
    _, bad = kernels(task)
    cand = Candidate(target="cpu", sources={"kernel.c": bad})
    res = evaluator.evaluate(cand, defaults(task), timing=False)
    assert res.status is Status.PASSED, res.message
    res = evaluator.evaluate(cand, ["extreme-dt"], timing=False)
    assert res.status is Status.INCORRECT_NUMERICAL, res.message
    assert "non-finite" in res.message
    plain = task.workload("extreme-dt").model_copy(update={"name": "extreme-dt-axes", "distributions": {},
                                                           "uuid": "extreme-dt-axes"})
    res = evaluator.evaluate(cand, [plain], timing=False)
    assert res.status is Status.PASSED, res.message
