"""The GPU timing loop shared by the cuda and triton targets, driven by a fake device clock (no GPU): the order
of poison, flush, sync and events around each call, input rotation, warm-up, and when the repeats stop."""

from __future__ import annotations

from ksearch.protocol import ArrayRef, ScalarRef, TimingPlan
from ksearch.targets.gpu_timing import COVER_US, ROTATE, flush_size, rotation_copies, timed_repeats, warm_up


class FakeClock:
    def __init__(self, ms_per_call: float, log: list):
        self.ms, self.log, self.n = ms_per_call, log, 0

    def event(self):
        self.n += 1
        return f"e{self.n}"

    def record(self, event):
        self.log.append(("record", event))

    def elapsed_ms(self, start, stop):
        return self.ms

    def sync(self):
        self.log.append("sync")

    def flush(self, nbytes, value):
        self.log.append(("flush", nbytes, value))

    def cover(self, us):
        self.log.append(("cover", us))

    def free_bytes(self):
        return 1 << 30


def test_each_repeat_poisons_flushes_syncs_and_covers_outside_the_events():
    log: list = []
    plan = TimingPlan(min_repeats=3, max_repeats=3, min_time_s=0.0, flush_bytes=0)
    times, sums = timed_repeats(FakeClock(2.0, log), plan, l2_bytes=50 << 20, n_sets=2,
                                call=lambda i: log.append(("call", i)), poison=lambda: log.append("poison"),
                                summary=lambda: [0, 1.0])
    assert times == [2.0, 2.0, 2.0] and sums == [[0, 1.0]] * 3
    # the cover (a GPU spin) after the sync and before the start event: the host enqueues the call while the GPU
    # spins, so launch overhead is not timed
    one = ["poison", ("flush", 100 << 20, 0.0), "sync", ("cover", COVER_US), ("record", "e1"), ("call", 0),
           ("record", "e2"), "sync"]
    assert log[:8] == one and COVER_US >= 100
    assert [x for x in log if isinstance(x, tuple) and x[0] == "call"] == [("call", 0), ("call", 1), ("call", 0)]


def test_repeats_stop_at_the_minimum_time_or_the_maximum():
    plan = TimingPlan(min_repeats=5, max_repeats=50, min_time_s=0.3, max_time_s=5.0)
    times, _ = timed_repeats(FakeClock(100.0, []), plan, 0, 1, lambda i: None, lambda: None, lambda: [0, 0.0])
    assert len(times) == 5  # 0.5 s after 5 repeats
    times, _ = timed_repeats(FakeClock(0.001, []), plan, 0, 1, lambda i: None, lambda: None, lambda: [0, 0.0])
    assert len(times) == 50
    times, _ = timed_repeats(FakeClock(3000.0, []), plan, 0, 1, lambda i: None, lambda: None, lambda: [0, 0.0])
    assert len(times) == 3  # out of time, but never fewer than 3


def test_warm_up_runs_at_least_the_least():
    calls: list = []
    warm_up(FakeClock(1.0, calls), TimingPlan(warmup=0), lambda: calls.append("call"), lambda: None, least=1)
    assert calls == ["call", "sync"]


def test_rotation_and_flush_sizes():
    refs = [ArrayRef(path="in", shape=(1024,), dtype="<f4", writable=False),
            ArrayRef(path="out", shape=(1024,), dtype="<f4", writable=True), ScalarRef(value=3)]
    assert rotation_copies(refs, free_bytes=1 << 30) == ROTATE
    assert rotation_copies(refs, free_bytes=4096 * 4) == 2 and rotation_copies(refs, free_bytes=0) == 1
    assert flush_size(TimingPlan(flush_bytes=0), l2_bytes=0) == 1 << 20
    assert flush_size(TimingPlan(flush_bytes=64 << 20), l2_bytes=60 << 20) == 120 << 20
