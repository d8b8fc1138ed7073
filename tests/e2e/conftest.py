"""The e2e runs are about the llm plumbing (backends, faults, token limits), not the judge's timing: they time with
a quick plan (few repeats, a 1 MiB cache flush) and calibrate each worker's clock with fewer pings, as
tests/report/test_html.py's runs do, so that a 10-evaluation search and its final table cost seconds, not the
default plan's minimums for big workloads. Every correctness check and every paired round of the judge still
runs."""

import pytest

from ksearch.protocol import TimingPlan

QUICK = dict(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=0.5, flush_bytes=1 << 20)


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch):
    """Every TimingPlan made without arguments (the run's default) is the quick one; explicit fields still win."""
    from ksearch.eval import timing

    init = TimingPlan.__init__
    monkeypatch.setattr(TimingPlan, "__init__", lambda self, **kw: init(self, **{**QUICK, **kw}))
    monkeypatch.setattr(timing, "PINGS", 4)  # 24 round trips per worker: seconds on a busy machine
