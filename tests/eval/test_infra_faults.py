"""A worker killed from outside the judge (the OOM killer's SIGKILL, another process's) is an infrastructure fault:
the workload is judged again on a fresh worker and the fault recorded, never blamed on the candidate; killed again
on the fresh worker, it is the candidate's RUNTIME_ERROR (a kernel that keeps running out of memory)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.tasks import load_task

TASK = load_task("selective-scan")
PLAN = TimingPlan(warmup=1, min_repeats=5, max_repeats=8, min_time_s=0.0, max_time_s=2.0, flush_bytes=1 << 20)


def _workers() -> list[int]:
    """Pids of this process's descendants that run an evaluation worker, deepest last."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    out, todo = [], [(os.getpid(), 0)]
    while todo:
        pid, depth = todo.pop()
        for kid in kids.get(pid, []):
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    if b"ksearch.eval.worker" in f.read():
                        out.append((depth + 1, kid))
            except OSError:
                pass
            todo.append((kid, depth + 1))
    return [pid for _, pid in sorted(out)]


def _killer(times: int, stop: threading.Event, killed: list[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to a live worker (the deepest process: the one running the kernel) ``times`` times, each a
    new one."""
    while not stop.is_set() and len(killed) < times:
        if [p for p in _workers() if p not in killed]:
            time.sleep(0.3)  # let it start working (and fork its namespace's init and the worker proper)
            found = [p for p in _workers() if p not in killed]
            if not found:
                continue
            try:
                os.kill(found[-1], sig)
                killed.append(found[-1])
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _evaluate_while_killing(times: int, sig: int = signal.SIGKILL):
    ev = Evaluator(TASK, config=EvalConfig(seeds=[1, 2, 3], timing=PLAN, busy_wait_s=0.0))
    stop, killed = threading.Event(), []
    t = threading.Thread(target=_killer, args=(times, stop, killed, sig), daemon=True)
    t.start()
    try:
        res = ev.evaluate(Candidate(target="cpu", sources={"kernel.c": TASK.naive_sources["cpu"]}), ["long-state"])
    finally:
        stop.set()
        t.join(10)
        ev.close()
    return res, killed


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_worker_killed_from_outside_is_judged_again_and_recorded():
    res, killed = _evaluate_while_killing(1)
    assert len(killed) == 1
    assert res.status is Status.PASSED, res.message
    assert len(res.infra_faults) == 1 and "killed or stopped from outside the judge" in res.infra_faults[0], \
        res.infra_faults
    assert res.workloads[0].checks == 3 and res.workloads[0].repeats >= 5


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_worker_killed_again_on_the_fresh_worker_is_the_candidates_fault():
    res, killed = _evaluate_while_killing(2)
    assert len(killed) == 2
    assert res.status is Status.RUNTIME_ERROR and "killed (or stopped) twice" in res.message, res.message
    assert len(res.infra_faults) == 2


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_a_worker_stopped_from_outside_is_judged_again_not_timed_out():
    """SIGSTOP from someone else: seen within a second (the request's wait checks the worker's processes), not at
    the call's deadline, and recorded as an infrastructure fault rather than the kernel's TIMEOUT."""
    t0 = time.monotonic()
    res, stopped = _evaluate_while_killing(1, signal.SIGSTOP)
    assert len(stopped) == 1
    assert res.status is Status.PASSED, res.message
    assert len(res.infra_faults) == 1 and "stopped by a signal from outside" in res.infra_faults[0], res.infra_faults
    assert time.monotonic() - t0 < 30
