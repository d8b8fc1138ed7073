"""The e2e runs are about the llm plumbing (backends, faults, token limits), not the judge's timing: their runs time
with the quick plan and fewer clock-calibration pings that tests/report/test_html.py's runs use (its `_small_run`),
so that a 6-evaluation search and its final table cost seconds, not the default plan's minimums for big workloads.
Every correctness check and every paired round of the judge still runs."""

import pytest

from tests.quick_ksearch import use_quick_timing


@pytest.fixture(autouse=True)
def quick_timing(monkeypatch):
    """`ksearch run` builds its RunConfig with the quick TimingPlan (`tests.targets.test_null.QUICK`; a resumed run
    keeps the plan it stored); each worker's clock calibrated with 4 pings, not 24."""
    use_quick_timing(monkeypatch.setattr)
