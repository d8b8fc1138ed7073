"""Command-line durations (ksearch/cli/options.py): ``inf`` or an absurd number is a usage error, not an
OverflowError traceback from a thread's wait or a timer (``--llm-timeout inf``, ``ksearch eval --timeout inf``)."""

from __future__ import annotations

import pytest
import typer

from ksearch.cli.options import MAX_SECONDS, positive_seconds


def test_a_duration_is_more_than_zero_and_finite():
    assert positive_seconds(0.5) == 0.5 and positive_seconds(MAX_SECONDS) == MAX_SECONDS
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(typer.BadParameter):
            positive_seconds(bad)


def test_eval_timeout_inf_is_a_usage_error():
    from typer.testing import CliRunner

    from ksearch.cli import app

    r = CliRunner().invoke(app, ["eval", "selective-scan", "k.c", "--timeout", "inf"])
    assert r.exit_code == 2 and "must be at most" in r.output, r.output
