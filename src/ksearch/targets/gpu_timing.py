"""GPU timing inside the worker, shared by the device targets (cuda through CuPy, triton through torch).

One loop, whatever library owns the device, so every GPU target is timed by the same rules: warm-up calls on
the warm-up inputs, then per repeat, outside the clock, the outputs re-poisoned and a buffer of
max(flush_bytes, 2 x L2, 1 MiB) bytes written (evicts L2) and the device synchronized; then a launch cover: a
spin of COVER_US microseconds enqueued on the stream, so the host enqueues the start event, the candidate's
launches and the stop event while the GPU is busy, and the start event fires when the spin ends; inside the
clock, the candidate's call between the two events on the current stream; the whole device synchronized before
the elapsed time is read. The clock is therefore the GPU's time from the first operation of the call to its
last, with host launch overhead hidden up to COVER_US per call (nvbench's blocking kernel and the L2-flush
kernel that triton.testing.do_bench enqueues before its start event do the same; without the cover the judge
timed a 45-60 us cuda decode kernel 20-30% above the benchmark's time for it on the H200, the GPU idling while
the host launched: bench/results/gpu-attention-decode-sweep-h200-20261130.md). Host time past the cover is timed, as the GPU then waits with the clock running; a call that
reads device data back to the host waits for the spin and is timed from there. GPU work on another stream is
not behind the spin: a candidate that reached one (the triton target's rules refuse streams) could run up to
COVER_US of work before the start event fires (docs/triton-target.md, "Streams"). The timed
inputs rotate among up to ``ROTATE`` device copies at distinct addresses (same data: the controller checks
every timed call's output summary against the verified last one). Repeats stop as `TimingPlan` says.

A target supplies a `DeviceClock` (events, device-wide synchronization, the flush buffer, free memory) and
callbacks for its call, its poisoning and its output summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Protocol

import numpy as np

from ksearch.protocol import ArgRef

ROTATE = 3
#: microseconds of GPU spin before each timed call's start event (launch overhead hidden up to this much)
COVER_US = 200.0
#: GPU clock cycles a microsecond for a cycle-counting spin (torch.cuda._sleep): 2 GHz, so a spin lasts at least
#: its microseconds on any clock up to 2 GHz (the H200 boosts to 1.98 GHz)
CYCLES_PER_US = 2000


def torch_spin(torch):
    """``spin(us=COVER_US)``: enqueue a GPU busy loop of ``us`` microseconds on torch's current stream
    (torch.cuda._sleep, cycles counted at CYCLES_PER_US), the launch cover of the torch-timed judge (triton),
    baselines and benches; a no-op where torch has no _sleep. torch.cuda._sleep is looked up once, here: a
    candidate running in the same process cannot swap it afterwards."""
    sleep = getattr(torch.cuda, "_sleep", None)

    def spin(us: float = COVER_US) -> None:
        if sleep is not None:
            sleep(int(us * CYCLES_PER_US))
    return spin


class DeviceClock(Protocol):
    """What the timing loop needs from the library that owns the device."""

    def event(self) -> Any:
        """A new timing event."""

    def record(self, event: Any) -> None:
        """Record ``event`` on the current stream."""

    def elapsed_ms(self, start: Any, stop: Any) -> float:
        """Milliseconds between two recorded, completed events."""

    def sync(self) -> None:
        """Wait for all work on the device (every stream)."""

    def flush(self, nbytes: int, value: float) -> None:
        """Write ``nbytes`` bytes of ``value`` to a buffer kept between calls (evicts L2)."""

    def cover(self, us: float) -> None:
        """Enqueue GPU work on the current stream that runs for at least ``us`` microseconds (a spin); a clock
        that cannot does nothing (launch overhead then timed)."""

    def free_bytes(self) -> int:
        """Free device memory, in bytes."""


def input_bytes(refs: Sequence[ArgRef]) -> int:
    """Bytes of the array inputs among ArgRefs (what one more device copy of the inputs costs)."""
    return sum(int(np.prod(r.shape)) * np.dtype(r.dtype).itemsize
               for r in refs if r.kind == "array" and not r.writable)


def rotation_copies(refs: Sequence[ArgRef], free_bytes: int) -> int:
    """How many device copies of the timed inputs to rotate through: up to ROTATE, within half the free memory."""
    return max(1, min(ROTATE, int(0.5 * free_bytes) // max(input_bytes(refs), 1)))


def flush_size(plan, l2_bytes: int) -> int:
    """Bytes written between repeats: the plan's, at least twice the L2 and at least 1 MiB."""
    return max(int(plan.flush_bytes), 2 * int(l2_bytes), 1 << 20)


def warm_up(clock: DeviceClock, plan, call: Callable[[], None], poison: Callable[[], None], least: int = 0) -> None:
    """``max(plan.warmup, least)`` calls on the warm-up inputs (outputs poisoned before each), then a device sync."""
    for _ in range(max(plan.warmup, least)):
        poison()
        call()
    clock.sync()


def timed_repeats(clock: DeviceClock, plan, l2_bytes: int, n_sets: int, call: Callable[[int], None],
                  poison: Callable[[], None], summary: Callable[[], list[float]]) -> tuple[list[float], list[list[float]]]:
    """Timed repeats per ``plan`` (a TimingPlan): ``call(i)`` runs the candidate on input set ``i`` (of
    ``n_sets``, rotated). Returns (times in ms, output summaries taken after each repeat, outside the clock)."""
    nbytes = flush_size(plan, l2_bytes)
    start, stop = clock.event(), clock.event()
    times_ms: list[float] = []
    sums: list[list[float]] = []
    total_s = 0.0
    while len(times_ms) < plan.max_repeats:
        i = len(times_ms)
        poison()
        clock.flush(nbytes, float(i))  # evicts L2 (writes 2 x L2), outside the clock
        clock.sync()
        clock.cover(COVER_US)  # the GPU spins while the host enqueues the call: launch overhead not timed
        clock.record(start)
        call(i % n_sets)
        clock.record(stop)
        clock.sync()  # device-wide, before the clock is read
        dt_ms = float(clock.elapsed_ms(start, stop))
        times_ms.append(dt_ms)
        sums.append(summary())
        total_s += dt_ms * 1e-3
        if plan.done(len(times_ms), total_s):
            break
    return times_ms, sums
