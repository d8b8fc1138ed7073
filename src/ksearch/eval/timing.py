"""Timing a candidate by a clock it cannot reach, interleaved with its reference kernels, on fresh inputs.

One workload is timed in *rounds*. Each round draws an input set no kernel of the session has seen (a fresh seed
per round: no cache, by pointer or by content, can pay), and each kernel of the session (the candidate and its
reference kernels: its parent, the current best, the naive kernel) runs once on it, in a random order. The judge
compares every kernel's outputs of every round with the reference outputs (computed once per run and input set,
so the rounds of a workload are capped by a budget of reference time as well as by memory).

The clock: for the cpu target the controller times each call itself, from the request that starts the call
(``go``) to its reply, with the outputs poisoned by the controller and the caches flushed before it, and takes
off the least round trip of an empty call (measured on each worker before its kernel loaded: `calibrate`; one
figure per session, so it cancels in the ratios) and the time the worker's thread waited for a CPU (the kernel's
own accounting). That clock decides (`decided_ms`). The worker reads its own clock around the call too; a kernel
runs in that address space and can forge it, which gains nothing, and a worker that claims far less than the
controller saw is REJECTED (``timing: ...``: `forged_clock`). A call of a few microseconds is below what a round
trip of tens of microseconds resolves: such workloads come out as ties and decide nothing (`resolved`). Device
targets (cuda, triton, mlx) are timed in blocks by the device's events, which their kernels cannot reach
(docs/evaluation.md says what that leaves), bounded by the controller's clock.

Decisions are made on the paired ratios (`ksearch.eval.stats`): at least `decision_rounds` rounds (11 at the
plan's 99.9%), then rounds continue until every comparison is decided or precise (`TimingPlan`), or a cap is hit
(rounds, time, the input sets that fit in memory and whose references fit the reference budget).
"""

from __future__ import annotations

import math
import os
import random
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ksearch.protocol import (ArgRef, CallRequest, ErrorReply, GoReply, GoRequest, PingRequest, PrepareRequest, Reply,
                              Request, TimedReply, TimingPlan)
from ksearch.records import Candidate, Paired, Status
from ksearch.errors import ExternalKill, ProtocolViolation, WorkerDied, WorkerStopped, WorkerTimeout, describe_exit
from ksearch.jail.sandbox import Worker
from ksearch.eval.stats import (LogSample, PairedStats, combine_paired, log_sample, min_rounds_for, paired_ratio,
                                summarize_times)

if TYPE_CHECKING:  # the evaluator drives this module; it is never imported from here at run time
    from ksearch.eval.evaluator import Evaluator
    from ksearch.records import WorkloadResult
    from ksearch.tasks.definition import Workload

#: pings per calibration (after PING_WARMUP untimed ones)
PINGS, PING_WARMUP = 24, 4
#: the early-stop test of a comparison is stricter than its verdict, so that looking after every round does not
#: inflate the rate of false differences: stop early only at this confidence
EARLY_CONFIDENCE = 0.9999


@dataclass(frozen=True)
class Reference:
    """A kernel the candidate is timed beside (paired rounds): ``role`` (``parent``, ``best``, ``naive``), the
    ``candidate``, and its speedup over the naive kernel per workload label as measured before (None: it *is*
    the naive kernel, 1.0 everywhere). The judge derives the candidate's speedups from these and the ratios."""

    role: str
    candidate: Candidate
    speedups: dict[str, float] | None = None


def killed_from_outside(e: WorkerDied) -> bool:
    """Whether a worker that died was killed by SIGKILL, which the judge did not send (it kills only on a
    deadline, and says so as a timeout): the OOM killer or another process."""
    return e.returncode == -signal.SIGKILL


def died_message(e: WorkerDied) -> str:
    """How a worker ended, with the tail of its stderr (the candidate's text: bounded)."""
    tail = e.stderr_tail.strip()
    return describe_exit(e.returncode) + (f"\n{tail[-1500:]}" if tail else "")


def failure_status(reply: ErrorReply) -> Status:
    """A failed call's status: RUNTIME_ERROR, unless the worker's runner said COMPILE_ERROR (Triton compiles at
    the first call) or REJECTED (a defense in the worker caught the kernel). Nothing better can be claimed."""
    return Status(reply.status) if reply.status is not None else Status.RUNTIME_ERROR


@dataclass(frozen=True)
class Overhead:
    """The controller's round trip of a timed call without the kernel, in ms (measured before the kernel loads)."""

    min_ms: float
    p50_ms: float
    p90_ms: float

    @property
    def jitter_ms(self) -> float:
        return max(self.p90_ms - self.min_ms, 0.0)


def calibrate(worker: Worker, timeout_s: float = 10.0) -> Overhead:
    """Ping ``worker`` (before its kernel loads) and return the round trip's statistics. Raises the worker's
    exceptions (WorkerDied, WorkerTimeout, ProtocolViolation)."""
    clock = time.perf_counter
    rts = []
    for i in range(PING_WARMUP + PINGS):
        t0 = clock()
        worker.request(PingRequest(), timeout_s)
        if i >= PING_WARMUP:
            rts.append((clock() - t0) * 1e3)
    q = np.percentile(rts, [0, 50, 90])
    return Overhead(float(q[0]), float(q[1]), float(q[2]))


def decided_ms(host_ms: float, empty_ms: float, waits_ms: float = 0.0) -> float:
    """The time of one call that decisions use: the controller's reading of the call less ``empty_ms``, the least
    round trip of an empty call over the session's workers (one figure for every kernel of a paired session, so
    that it cancels in their ratios), less ``waits_ms``, the time the worker's protocol thread was runnable but
    waiting for a CPU during it (the kernel's accounting: another process had the CPU); never below 1 ns."""
    return max(host_ms - empty_ms - waits_ms, 1e-6)


def thread_count(pid: int | None) -> int | None:
    """Threads of process ``pid`` now (/proc/<pid>/status), or None."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def runqueue_wait_ms(tid: int | None) -> float | None:
    """Milliseconds thread ``tid`` has spent runnable but waiting for a CPU since it started (the kernel's own
    accounting, /proc/<tid>/schedstat's second field: the candidate cannot touch it), or None where the system
    does not keep it."""
    if tid is None:
        return None
    try:
        with open(f"/proc/{tid}/schedstat") as f:
            return int(f.read().split()[1]) * 1e-6
    except (OSError, ValueError, IndexError):
        return None


def settle(tid: int | None, timeout_s: float = 0.05) -> None:
    """Wait (up to ``timeout_s``) until thread ``tid`` sleeps: after answering ``prepare`` the worker may still be
    runnable on its way back to reading the next request, and a wait in progress is accounted only when it ends,
    so a runqueue reading taken then would count a wait from before the call."""
    if tid is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state not in ("R", "W"):
            return
        time.sleep(0.0001)


def worker_main_pid(pid: int) -> int:
    """The host pid of a worker's process that runs the protocol: inside the jail's namespaces that is the
    grandchild of the process the controller started (its PID namespace's init in between); without them, that
    process itself."""
    for _ in range(2):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
        except OSError:
            return pid
        if not kids:
            return pid
        pid = int(kids[0])
    return pid


def forged_clock(host_ms: list[float], worker_ms: list[float], waits_ms: list[float], overhead: Overhead) -> str | None:
    """Why the worker's readings cannot be true beside the controller's (both read CLOCK_MONOTONIC, the
    worker's interval lies inside the controller's), or None.

    Rounds disagree when the worker claims more than the controller saw, or far less: the median gap (the
    controller's reading less the empty round trip, less the time the worker's thread and ours waited for a CPU
    (``waits_ms``: a busy machine's delays, from the kernel's accounting), less the worker's reading) above half the
    median call and above 1 ms + 10 x the round trip's jitter."""
    if not host_ms:
        return None
    over = [w - h for h, w in zip(host_ms, worker_ms) if w > h + 0.01]
    if len(over) > len(host_ms) // 2:
        return (f"the worker reported calls longer than the judge's clock saw in {len(over)} of {len(host_ms)} "
                f"rounds (by up to {max(over):.3g} ms)")
    gaps = [h - overhead.min_ms - q - w for h, w, q in zip(host_ms, worker_ms, waits_ms)]
    gap, call = float(np.median(gaps)), float(np.median(host_ms))
    if gap > 0.5 * call and gap > 1.0 + 10 * overhead.jitter_ms:
        return (f"the worker's clock read {float(np.median(worker_ms)):.4g} ms per call where the judge's read "
                f"{call:.4g} ms (median over {len(host_ms)} rounds; empty call {overhead.min_ms:.3g} ms, waits for a "
                f"CPU {float(np.median(waits_ms)):.3g} ms): the kernel tampered with the worker's clock")
    return None


@dataclass
class Contender:
    """One kernel of a timing session: the candidate (role ``candidate``) or a reference kernel.

    ``device``: timed in blocks by device events; ``out_dir``: where its output files live (its own);
    ``overhead``: its worker's calibrated round trip (cpu); ``times_ms``: decided time per round; ``host_ms`` and
    ``worker_ms``: the controller's and the worker's readings (cpu); ``failure``: why it dropped out."""

    role: str
    candidate_id: str
    worker: Worker | None  # None: it never started (its build failed)
    device: bool
    out_dir: Path
    overhead: Overhead | None = None
    times_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    worker_ms: list[float] = field(default_factory=list)
    failure: tuple[Status, str] | None = None
    out_paths: dict[str, Path] = field(default_factory=dict)
    #: per round: ms the worker's protocol thread waited for a CPU during the call (kernel accounting)
    waits_ms: list[float] = field(default_factory=list)
    #: per round: those waits plus this process's thread's (an upper bound of the delays: `forged_clock`)
    slack_ms: list[float] = field(default_factory=list)
    #: host pid of the worker's protocol thread (for its runqueue wait; None: unknown)
    main_pid: int | None = None
    #: further roles of the same kernel (the parent that is also the best): one worker, one comparison each
    aliases: tuple[str, ...] = ()
    #: (candidate, artifact, start time) of a worker started but not yet calibrated and loaded
    spawned: tuple[Candidate, Path, float] | None = None

    @property
    def running(self) -> Worker:
        """Its worker. Raises RuntimeError for a contender that never started one (its build failed: the judge
        reads its ``failure`` instead)."""
        if self.worker is None:
            raise RuntimeError(f"the {self.role} kernel {self.candidate_id} has no worker: {self.failure}")
        return self.worker

    @property
    def roles(self) -> tuple[str, ...]:
        return (self.role, *self.aliases)

    def reset(self) -> None:
        """Forget the last workload's times."""
        self.times_ms, self.host_ms, self.worker_ms, self.waits_ms, self.slack_ms = [], [], [], [], []


def decision_rounds(plan: TimingPlan) -> int:
    """The least number of paired rounds before a comparison can be decided (or the session stop early): the
    plan's ``min_rounds``, and enough for an interval at its confidence (`min_rounds_for`: 11 at 0.999)."""
    return max(plan.min_rounds, min_rounds_for(plan.confidence))


def calls_per_round(calls: int, cap: int, plan: TimingPlan) -> int:
    """Calls of each kernel a round, at most ``calls``: each takes an input set of the ``cap``, and more than one a
    round (a busy machine) only while the rounds left are still enough for an interval (`decision_rounds`, or
    ``cap`` where it is fewer): 20 sets as 10 rounds of two calls gave an honest kernel a ratio without a verdict
    ("10 rounds: too few for an interval") under load."""
    k = max(1, calls)
    while k > 1 and cap // k < min(cap, decision_rounds(plan)):
        k -= 1
    return k


#: a call shorter than this many empty round trips is below what the controller's clock resolves
RESOLVE_ROUND_TRIPS = 10
#: device-timed calls shorter than this (ms) decide no combined verdict: on the H200 two workers' copies of one
#: 8 us kernel differed by 3.5% (1.035x [1.011, 1.063], 11 rounds; bench/results/gpu-judge-paired-h200-20261201.md)
DEVICE_RESOLVED_MS = 0.05


def resolved(times_ms: list[float], empty_ms: float) -> bool:
    """Whether calls of these (median) times are long enough for the controller's clock: at least
    RESOLVE_ROUND_TRIPS empty round trips. Shorter workloads come out as ties and do not decide combined verdicts."""
    return bool(times_ms) and float(np.median(times_ms)) >= RESOLVE_ROUND_TRIPS * empty_ms


def within_clock_noise(res: "WorkloadResult", jitter_ms: float) -> bool:
    """Whether ``res``, timed below its roofline floor, is below it by no more than the controller's clock can
    tell: timed by the controller, too short to resolve (`resolved`), and under the floor by at most ``jitter_ms``
    (the empty call's p90 less its minimum). A call of nanoseconds reads as ~0 once the empty round trip is taken
    off; that is no evidence of a forged time, and such a workload is a tie that decides nothing."""
    if res.clock != "controller" or res.resolved or res.floor_ms is None or res.median_ms is None:
        return False
    return res.floor_ms - res.median_ms <= jitter_ms


def enough_rounds(plan: TimingPlan, cand: Contender, refs: list[Contender], cap: int, empty_ms: float = 0.0) -> bool:
    """Whether the session may stop after the rounds done: the cap of input sets, or of rounds (``max_rounds`` with
    references, ``max_repeats`` alone); alone, as
    `TimingPlan.done`; with references, once `decision_rounds` are done: the time budget, calls too short for the
    controller's clock to resolve (`resolved`: more rounds would not decide them), or every live comparison
    decided at EARLY_CONFIDENCE (a stricter level than the verdict's, since this looks after every round) or within
    ``plan.precision`` at ``plan.confidence``."""
    n = len(cand.times_ms)
    timed_s = sum(cand.times_ms) * 1e-3
    live = [r for r in refs if r.failure is None and len(r.times_ms) == n]
    if n >= min(cap, plan.max_rounds if live else plan.max_repeats):
        return True
    if not live:
        return plan.done(n, timed_s)
    if n < decision_rounds(plan):
        return False
    if not resolved(cand.times_ms, empty_ms) and not all(resolved(r.times_ms, empty_ms) for r in live):
        return True  # calls too short for the controller's clock: more rounds would not decide them
    everyone_s = timed_s + sum(sum(r.times_ms) for r in live) * 1e-3
    if timed_s >= plan.max_time_s or everyone_s >= 2 * plan.max_time_s:
        return True
    for r in live:
        if paired_ratio(cand.times_ms, r.times_ms, EARLY_CONFIDENCE).verdict(plan.min_effect) != "tie":
            continue
        if paired_ratio(cand.times_ms, r.times_ms, plan.confidence).half_width > plan.precision:
            return False
    return True


def summary(role: str, candidate_id: str, stats: PairedStats | None, min_effect: float,
            reference_ms: float | None = None, note: str = "") -> Paired:
    """A Paired record from statistics (None: no comparison, ``note`` says why). Too few rounds for an interval
    give a ratio without a verdict (the search then falls back on the scores)."""
    if stats is None:
        return Paired(role=role, candidate_id=candidate_id, note=note)
    finite = (lambda x: x if x is not None and math.isfinite(x) and x > 0 else None)
    bounded = finite(stats.lo) is not None and finite(stats.hi) is not None
    if not bounded and not note:
        note = f"{stats.n} rounds: too few for an interval at {stats.confidence:.0%}"
    return Paired(role=role, candidate_id=candidate_id, ratio=stats.ratio, lo=finite(stats.lo), hi=finite(stats.hi),
                  n=stats.n, confidence=stats.confidence, verdict=stats.verdict(min_effect) if bounded else None,
                  reference_ms=reference_ms, note=note)


def combine(per_workload: list[dict[str, LogSample]], roles: dict[str, str], plan: TimingPlan) -> list[Paired]:
    """One Paired per reference role over the workloads where it was compared (``roles``: role -> candidate id)."""
    out = []
    for role, cid in roles.items():
        samples = [d[role] for d in per_workload if role in d]
        if not samples:
            out.append(Paired(role=role, candidate_id=cid, note="not compared on any timed workload"))
            continue
        out.append(summary(role, cid, combine_paired(samples, plan.confidence), plan.min_effect))
    return out


class RoundTimer:
    """Times one workload in paired rounds for an Evaluator (see the module docstring).

    Args:
        judge: the Evaluator (its cases, reference outputs, checks and flush).
        wl: the workload; axes: its axis values.
        contenders: the candidate first, then the reference kernels (loaded, calibrated workers).
        plan: the TimingPlan; timeout_s: per call.
        warm: the warm-up case (a check's inputs), as `Evaluator._prepare` returns it.
        seeds: input set index -> seed (default: the judge's `timing_seed`, the same in every evaluation of a run,
            so the inputs and reference outputs are made once per run).
        calls: calls of each kernel per round, each on its own input set, in a random order with the others'; the
            round's time of a kernel is its fastest call (on a busy machine, 2: a delay from another process then
            spoils a round only when it hits both calls); fewer where the input sets (`run`'s cap) would leave
            fewer rounds than a paired decision needs.
    """

    def __init__(self, judge: "Evaluator", wl: "Workload", axes: dict[str, int], contenders: list[Contender],
                 plan: TimingPlan, timeout_s: float, warm: tuple | None, seeds: Callable[[int], int] | None = None,
                 calls: int = 1):
        self.judge, self.wl, self.axes = judge, wl, axes
        self.seeds = seeds or judge.timing_seed
        self.calls = max(1, calls)
        self.empty_ms = min((c.overhead.min_ms for c in contenders if c.overhead is not None), default=0.0)
        self.cpu_list = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.cpus = len(self.cpu_list) or (os.cpu_count() or 1)
        self.cpu: int | None = None  # this round's CPU (`_pin`)
        self.cand, self.refs = contenders[0], contenders[1:]
        self.plan, self.timeout_s, self.warm = plan, timeout_s, warm
        self.rng = random.Random(secrets.randbits(64))
        self.flush = True  # caches flushed before every cpu call (see `warm_up`)

    # -- one call of one contender ------------------------------------------------------------------

    def _fail(self, c: Contender, status: Status, msg: str) -> None:
        c.failure = (status, msg)

    def _request(self, c: Contender, msg: Request, timeout_s: float) -> Reply | None:
        """A request to ``c``'s worker; its reply, or None (and ``c.failure`` set) when it failed. Raises
        ExternalKill."""
        assert c.worker is not None  # a contender without a worker has failed already
        try:
            reply = c.worker.request(msg, timeout_s)
        except WorkerStopped as e:
            raise ExternalKill(c.role, str(e)) from None
        except WorkerTimeout:
            self._fail(c, Status.TIMEOUT, f"the kernel did not return within {timeout_s:g} s (killed)")
            return None
        except WorkerDied as e:
            if killed_from_outside(e):
                raise ExternalKill(c.role, died_message(e)) from None
            self._fail(c, Status.RUNTIME_ERROR, died_message(e))
            return None
        except ProtocolViolation as e:
            self._fail(c, Status.REJECTED, str(e))
            return None
        if isinstance(reply, ErrorReply):
            self._fail(c, failure_status(reply), reply.error)
            return None
        return reply

    def _pin(self, c: Contender) -> None:
        """Run the worker's protocol thread (which runs the kernel's serial part) on this round's CPU: on a busy
        machine a worker otherwise keeps to one CPU for a whole session, and the CPUs are not equally fast then
        (copies of one kernel measured 0.74x and 1.18x apart, each worker on its own CPU). Both kernels of a round
        share its CPU, so its speed cancels in their ratio. A thread pool the kernel made earlier keeps its own
        placement."""
        if self.cpu is None or c.main_pid is None:
            return
        try:
            os.sched_setaffinity(c.main_pid, {self.cpu})
        except OSError:  # the worker is gone (its request will say so) or the system refuses: unpinned
            pass

    def _cpu_call(self, c: Contender, args: list[ArgRef], timed: bool) -> float | None:
        """``prepare`` (the worker maps the inputs and evicts them and the outputs this process just poisoned from the
        caches: see the protocol), then one ``go`` timed by this process's clock; the decided time in ms."""
        if timed:
            self._pin(c)
        flush = self.judge.flush_bytes(self.wl) if self.flush else 0
        if self._request(c, PrepareRequest(args=args, flush_bytes=flush), self.timeout_s) is None:
            return None
        settle(c.main_pid)
        w0, q0 = runqueue_wait_ms(c.main_pid), runqueue_wait_ms(threading.get_native_id())
        t0 = time.perf_counter()
        reply = self._request(c, GoRequest(), self.timeout_s)
        host = (time.perf_counter() - t0) * 1e3
        w1, q1 = runqueue_wait_ms(c.main_pid), runqueue_wait_ms(threading.get_native_id())
        if not isinstance(reply, GoReply):
            return None
        if not timed:
            return host
        worker = reply.worker_ms
        if not math.isfinite(worker) or worker < 0:
            self._fail(c, Status.REJECTED, f"timing: the worker answered a timed call with {worker!r}")
            return None
        # The worker thread's waits for a CPU are time the call lost to other processes (or to us), and count
        # only while the kernel cannot have caused them: no more threads than CPUs (a kernel that oversubscribes
        # makes its own protocol thread wait while its other threads compute). Our own thread's waits do not
        # count: it may wait while the worker runs on its CPU (woken there), which loses the call nothing.
        waited = w1 - w0 if w0 is not None and w1 is not None else 0.0
        threads = thread_count(c.main_pid)
        if threads is None or threads > self.cpus:
            waited = 0.0
        c.host_ms.append(host)
        c.worker_ms.append(float(worker))
        c.waits_ms.append(waited)
        c.slack_ms.append(waited + (q1 - q0 if q0 is not None and q1 is not None else 0.0))  # for `forged_clock`: lenient
        return decided_ms(host, self.empty_ms, waited)

    def _device_call(self, c: Contender, args: list[ArgRef], warmup_args: list[ArgRef] | None, repeats: int,
                     warmup: int) -> float | None:
        """One block of ``repeats`` device-timed calls; the block's median in ms (checked against our clock)."""
        block = self.plan.model_copy(update={"warmup": warmup, "min_repeats": repeats, "max_repeats": repeats,
                                             "min_time_s": 0.0, "flush_bytes": self.judge.flush_bytes(self.wl)})
        budget = self.timeout_s * (warmup + repeats + 2)
        t0 = time.perf_counter()
        reply = self._request(c, CallRequest(args=args, warmup_args=warmup_args, timing=block), budget)
        wall_ms = (time.perf_counter() - t0) * 1e3
        if reply is None:
            return None
        times = reply.times_ms if isinstance(reply, TimedReply) else []
        if not times:
            self._fail(c, Status.RUNTIME_ERROR, "timing failed: no times in the reply")
            return None
        if min(times) <= 0 or sum(times) > wall_ms * 1.01 + 1.0:
            self._fail(c, Status.REJECTED, f"timing: {len(times)} calls reported {sum(times):.4g} ms in total (min "
                                           f"{min(times):.3g} ms) within {wall_ms:.4g} ms of the judge's clock")
            return None
        return float(np.median(times))

    def _run(self, c: Contender, case: tuple, timed: bool) -> float | None:
        inputs, in_dir, _want, _args, _outs, axes = case
        args, c.out_paths = self.judge.write_args(inputs, in_dir, axes, c.out_dir)
        if c.device:
            if not timed:
                return self._device_call(c, args, None, 1, 0)
            return self._device_call(c, args, None, self.plan.block_repeats, 0)
        return self._cpu_call(c, args, timed)

    # -- the session --------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """``plan.warmup`` untimed calls of every contender on the warm-up case (a check's inputs). A candidate
        whose warm-up call is shorter than the controller's clock resolves (`resolved`) is timed without flushing
        the caches between calls: its rounds cannot decide anything, and the flush (twice the last-level cache,
        milliseconds) would be nearly all their cost."""
        if self.warm is None:
            return
        for c in [self.cand, *self.refs]:
            for _ in range(self.plan.warmup):
                if c.failure is None:
                    took = self._run(c, self.warm, timed=False)
                    if c is self.cand and took is not None and not c.device:
                        self.flush = resolved([max(took - self.empty_ms, 0.0)], self.empty_ms)

    def _check(self, c: Contender, case: tuple, seed: int) -> bool:
        """Compare ``c``'s outputs of this round with the reference. False (and ``c.failure``) when they are wrong."""
        inputs, _in_dir, _want, _args, _outs, axes = case
        want = self.judge.reference(self.wl, seed, inputs)
        status, msg, _, _ = self.judge.check_outputs(c.out_paths, want, axes, errors=False, inputs=inputs)
        if status is not Status.PASSED:
            self._fail(c, status, f"outputs of the timed calls (round {len(self.cand.times_ms) + 1}): {msg}")
            return False
        return True

    def run(self, res: "WorkloadResult", cap: int) -> None:
        """Time the rounds and fill ``res`` (times of the candidate, paired comparisons, status on failure).
        Raises ExternalKill (the caller retries on fresh workers)."""
        for c in (self.cand, *self.refs):
            c.reset()
        self.warm_up()
        if self.cand.failure:
            res.status, res.message = self.cand.failure
            return
        k = calls_per_round(self.calls, cap, self.plan)
        while True:
            r = len(self.cand.times_ms)
            self.cpu = self.rng.choice(self.cpu_list) if len(self.cpu_list) > 1 else None
            cases = []
            for j in range(k):
                seed = self.seeds(r * k + j)
                cases.append((seed, self.judge.timing_case(self.wl, seed, self.axes)))
            live = [c for c in (self.cand, *self.refs) if c.failure is None]
            best: dict[str, float] = {}
            order = [(c, j) for c in live for j in range(k)]
            self.rng.shuffle(order)
            for c, j in order:
                if c.failure is not None:
                    continue
                seed, case = cases[j]
                t = self._run(c, case, timed=True)
                # before the next call overwrites the outputs; every kernel's, the references' too: the judge's
                # work between calls must be the same whichever kernel ran (on a busy machine, checking only the
                # candidate's outputs made copies of one kernel differ by 20%)
                if t is not None and self._check(c, case, seed):
                    best[c.role] = min(best.get(c.role, t), t)
            if self.cand.failure:
                res.status, res.message = self.cand.failure
                return
            for c in live:
                if c.failure is None:
                    c.times_ms.append(best[c.role])
            for ref in self.refs:  # a reference that failed leaves the session with its rounds
                if ref.failure is not None:
                    ref.times_ms = []
            if enough_rounds(self.plan, self.cand, self.refs, max(1, cap // k), self.empty_ms):
                break
        case = cases[-1][1]
        status, msg = self.judge.check_inputs(case[0], case[1])
        if status is not Status.PASSED:
            res.status, res.message = status, msg
            return
        self._fill(res)

    def _fill(self, res: "WorkloadResult") -> None:
        c = self.cand
        if not c.device and c.overhead is not None:
            why = forged_clock(c.host_ms, c.worker_ms, c.slack_ms, c.overhead)
            if why:
                res.status, res.message = Status.REJECTED, f"timing: {why}"
                return
        stats = summarize_times(c.times_ms)
        res.median_ms, res.min_ms, res.spread, res.repeats = stats.median_ms, stats.min_ms, stats.spread, stats.n
        res.ci_ms = [stats.ci_ms[0], stats.ci_ms[1]]
        res.clock = "device events" if c.device else "controller"
        res.verified_rounds = stats.n
        res.resolved = float(np.median(c.times_ms)) >= DEVICE_RESOLVED_MS if c.device else \
            resolved(c.times_ms, self.empty_ms)
        for r in self.refs:
            for role in r.roles:
                if r.failure is not None:
                    res.paired.append(summary(role, r.candidate_id, None, self.plan.min_effect,
                                              note=f"the reference failed in this session: {r.failure[1][:300]}"))
                    continue
                stats_r = paired_ratio(c.times_ms, r.times_ms, self.plan.confidence)
                res.paired.append(summary(role, r.candidate_id, stats_r, self.plan.min_effect,
                                          reference_ms=float(np.median(r.times_ms))))

    def log_samples(self) -> dict[str, LogSample]:
        """The paired rounds of this workload per live reference role, for combining over workloads."""
        return {role: log_sample(self.cand.times_ms, r.times_ms) for r in self.refs for role in r.roles
                if r.failure is None and r.times_ms and len(r.times_ms) == len(self.cand.times_ms)}
