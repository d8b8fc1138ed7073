"""Shared by the GPU pack tests (marked ``cuda``): one evaluator per (task, target) for a module, so float64
references are computed once, and a check-then-time step that prints one ``GPU ...`` line per kernel."""

import pytest

from ksearch.records import Candidate, Status


@pytest.fixture(scope="module")
def evaluate():
    """evaluate(task, target, candidate, workloads) -> Evaluation, evaluators kept for the module."""
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


def naive_candidate(task, target: str) -> Candidate:
    """The task's naive cuda or triton kernel as a candidate."""
    if target == "cuda":
        return Candidate(target="cuda", sources={"kernel.cu": task.naive_sources["cuda"]},
                         launch=task.naive_launch["cuda"])
    return Candidate(target="triton", sources={"kernel.py": task.naive_sources["triton"]}, entry_point="run")


def check_and_time(evaluate, task, target: str, cand: Candidate, label: str, bench: str,
                   floor_ms: float | None = None) -> None:
    """Judge ``cand`` on every check workload of ``task`` and time it on ``bench``; print the line; assert PASSED."""
    checks = [w.name for w in task.workloads if w.purpose == "check"]
    result = evaluate(task, target, cand, checks + [bench])
    timed = [w for w in result.workloads if w.workload == bench]
    ms = timed[0].median_ms if timed and timed[0].median_ms else float("nan")
    floor = f" ({floor_ms / ms:.0%} of the copy-bandwidth floor)" if floor_ms else ""
    print(f"\nGPU {task.name} {target} {label}: {result.status.value} {ms:.4f} ms on {bench}{floor}")
    assert result.status is Status.PASSED, f"{label}: {result.message}"[:4000]
