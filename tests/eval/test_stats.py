"""The judge's statistics on tiny hand-made inputs: median intervals, paired ratios, verdicts, combining."""

import math

import pytest

from ksearch.eval.stats import (LogSample, PairedStats, combine_paired, log_sample, median_interval, min_rounds_for,
                                order_interval, paired_ratio, summarize_times)


def test_median_interval_is_order_statistics_with_binomial_coverage():
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # below 6 values at 95%: the whole range
    vals = [float(v) for v in range(1, 21)]  # n = 20: P(X <= 5) = 0.0207 -> ranks 6 and 15 give 95.9%
    assert median_interval(vals) == (6.0, 15.0)
    with pytest.raises(ValueError):
        median_interval([])


def test_rounds_needed_for_an_interval():
    assert min_rounds_for(0.99) == 8 and min_rounds_for(0.95) == 6 and min_rounds_for(0.999) == 11
    assert order_interval([1.0] * 7, 0.99) is None
    assert order_interval([float(i) for i in range(8)], 0.99) == (0.0, 7.0)


def test_summarize_times_reports_the_median_interval():
    s = summarize_times([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_ms == 3.0 and s.min_ms == 1.0 and s.n == 5 and s.ci_ms == (1.0, 100.0)


def _rounds(base, factor, wiggle):
    return [base * (1 + w) for w in wiggle], [base * factor * (1 - w) for w in wiggle]


WIGGLE = [0.01, -0.02, 0.015, 0.0, -0.01, 0.02, -0.005, 0.01, -0.015, 0.005]


def test_identical_times_are_a_tie_and_a_clear_speedup_is_faster():
    c, r = _rounds(10.0, 1.0, WIGGLE)
    same = paired_ratio(c, r, 0.99)
    assert same.verdict() == "tie" and same.lo < 1 < same.hi
    c, r = _rounds(10.0, 1.3, WIGGLE)  # the reference 1.3x slower: the candidate is faster
    fast = paired_ratio(c, r, 0.99)
    assert fast.verdict() == "faster" and fast.lo > 1.2 and fast.ratio == pytest.approx(1.3, rel=0.03)
    slow = paired_ratio(r, c, 0.99)
    assert slow.verdict() == "slower" and slow.hi < 1


def test_too_few_rounds_never_decide_however_large_the_effect():
    seven = paired_ratio([1.0] * 7, [10.0] * 7, 0.99)
    assert seven.ratio == pytest.approx(10.0) and seven.lo == 0 and math.isinf(seven.hi)
    assert seven.verdict() == "tie" and math.isinf(seven.half_width)


def test_a_significant_difference_under_the_margin_is_a_tie():
    c, r = _rounds(10.0, 1.005, [0.0001 * i for i in range(10)])  # +0.5%, almost no spread
    tiny = paired_ratio(c, r, 0.99)
    assert tiny.lo > 1 and tiny.verdict(min_effect=0.01) == "tie"
    assert tiny.verdict(min_effect=0.001) == "faster"


def test_a_minority_of_extreme_rounds_moves_the_estimate_by_a_rank():
    """Calls a kernel skipped work on (or calls a busy machine preempted), 100x off: the median ignores them."""
    c, r = _rounds(10.0, 1.0, WIGGLE)
    honest = paired_ratio(c, r, 0.99)
    cheat = paired_ratio(c[:7] + [0.1, 0.1, 0.1], r, 0.99)  # 3 of 10 rounds "100x faster"
    assert cheat.verdict() == "tie"
    assert cheat.ratio / honest.ratio < 1.05  # a mean of the log-ratios would have moved by 100^(3/10) = 4x


def test_paired_lists_must_match():
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_ratio([0.0], [1.0])


def test_combining_workloads_is_a_geometric_mean_over_aligned_rounds():
    c, r = _rounds(5.0, 2.0, WIGGLE)
    a = log_sample(c, r)  # 2x
    c, r = _rounds(10.0, 1.0, WIGGLE)
    b = log_sample(c, r)  # 1x
    both = combine_paired([a, b], 0.99)
    assert both.ratio == pytest.approx(math.sqrt(2), rel=0.03)
    assert both.n == 10 and both.lo < both.ratio < both.hi and both.verdict() == "faster"
    with pytest.raises(ValueError):
        combine_paired([])
    short = combine_paired([a, LogSample((0.0,) * 5)], 0.99)  # the fewest rounds bound the combined ones
    assert short.n == 5 and short.lo == 0 and math.isinf(short.hi)


def test_verdicts_of_hand_made_intervals():
    assert PairedStats(1.3, 1.1, 1.5, 10, 0.99).verdict() == "faster"
    assert PairedStats(1.3, 0.9, 1.5, 10, 0.99).verdict() == "tie"
    assert PairedStats(0.7, 0.5, 0.9, 10, 0.99).verdict() == "slower"
    assert PairedStats(0.995, 0.99, 0.999, 10, 0.99).verdict(min_effect=0.01) == "tie"


def test_two_calls_a_round_only_while_the_input_sets_leave_enough_rounds_for_a_verdict():
    """A busy machine's two calls a round take two input sets each: never so many that the cap of sets leaves
    fewer rounds than an interval needs (11 at 99.9%), which would leave every comparison without a verdict."""
    from ksearch.eval.timing import calls_per_round, decision_rounds
    from ksearch.protocol import TimingPlan

    plan = TimingPlan()
    least = decision_rounds(plan)
    assert least == 11
    assert calls_per_round(2, 50, plan) == 2 and calls_per_round(2, 2 * least, plan) == 2
    assert calls_per_round(2, 2 * least - 1, plan) == 1  # 21 sets: 21 rounds of one call, not 10 of two
    assert calls_per_round(2, 5, plan) == 1 and calls_per_round(1, 50, plan) == 1
    assert calls_per_round(3, 2 * least, plan) == 2
