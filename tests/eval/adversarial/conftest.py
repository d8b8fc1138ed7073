import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate
from ksearch.jail.sandbox import Policy
from ksearch.tasks import load_task

QUICK = TimingPlan(warmup=1, min_repeats=5, max_repeats=8, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)
#: small enough that the memory hog and the huge file are over in a second
LIMITS = dict(address_space_bytes=1 << 30, file_size_bytes=32 << 20, home_bytes=32 << 20)


@pytest.fixture(scope="session")
def task():
    return load_task("selective-scan")


@pytest.fixture(scope="session")
def judge(task):
    """judge(static=True, timeout_s=5.0, hardware=None, **policy) -> a (cached) Evaluator."""
    cache: dict = {}

    def make(static: bool = True, timeout_s: float = 5.0, hardware=None, **policy) -> Evaluator:
        key = (static, timeout_s, id(hardware), tuple(sorted(policy.items())))
        if key not in cache:
            cfg = EvalConfig(seeds=[11, 12, 13], timeout_s=timeout_s, timing=QUICK, static_checks=static,
                             sandbox=Policy(**{**LIMITS, **policy}))
            cache[key] = Evaluator(task, hardware=hardware, config=cfg)
        return cache[key]

    yield make
    for ev in cache.values():
        ev.close()


def cand(source: str) -> Candidate:
    return Candidate(target="cpu", sources={"kernel.c": source})
