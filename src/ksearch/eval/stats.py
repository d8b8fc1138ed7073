"""Statistics of timed repeats and paired comparisons (pure functions).

Two kinds of figure come out of the judge's timing:

- one kernel's times on one workload: median, minimum, relative interquartile spread and a distribution-free
  interval for the median (`summarize_times`);
- a *paired* comparison of a candidate with a reference kernel timed interleaved with it, round by round, on the
  same inputs (`paired_ratio`): the ratio reference time / candidate time (> 1: the candidate is faster), its
  confidence interval, and a verdict (faster / slower / tie). Per-workload comparisons combine into one over the
  workloads (`combine_paired`, a geometric mean, as the search's score is).

The paired estimate is the median of the rounds' log-ratios and its interval the order statistics that cover the
median with the asked confidence under Binomial(n, 1/2) (the sign test, inverted). It assumes nothing about the
noise but that a round's two orders are equally likely (the judge randomises them): a busy machine's bursts, one
preempted call, or a call a kernel skipped work on move the median by one rank, not by their size. The price is
a least number of rounds for any decision: 11 at 99.9%, the judge's level (`min_rounds_for`). A difference whose interval contains 1,
or that is smaller than the indifference margin ``min_effect``, is a tie: never a regression, never an
improvement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Verdict = Literal["faster", "slower", "tie"]


@dataclass(frozen=True)
class TimeStats:
    """``median_ms``, ``min_ms``; ``spread`` = (p75 - p25) / median (0 = perfectly repeatable); ``n`` repeats;
    ``ci_ms``: (low, high) interval of the median in ms (order statistics, ~95%; (min, max) below 6 repeats)."""

    median_ms: float
    min_ms: float
    spread: float
    n: int
    ci_ms: tuple[float, float] = (0.0, 0.0)


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics (k, n+1-k) with the largest
    k whose coverage under Binomial(n, 1/2) is at least ``confidence``; (min, max) when none reaches it (fewer
    than 6 values at 95%). Raises ValueError if empty."""
    if not values:
        raise ValueError("no values")
    v = sorted(values)
    n = len(v)
    k_best = 1
    for k in range(1, n // 2 + 1):
        # P(X < k) for X ~ Binomial(n, 1/2): the chance that the median lies below the k-th order statistic
        tail = sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if 1 - 2 * tail >= confidence:
            k_best = k
        else:
            break
    return v[k_best - 1], v[n - k_best]


def summarize_times(times_ms: list[float]) -> TimeStats:
    """Median, minimum, relative interquartile spread and median interval of repeat times in ms. Raises
    ValueError if empty."""
    if not times_ms:
        raise ValueError("no timed repeats to summarize")
    t = np.asarray(times_ms, np.float64)
    med = float(np.median(t))
    q1, q3 = np.percentile(t, [25, 75])
    return TimeStats(median_ms=med, min_ms=float(t.min()), spread=float((q3 - q1) / med) if med > 0 else 0.0,
                     n=int(t.size), ci_ms=median_interval(list(t)))


def min_rounds_for(confidence: float) -> int:
    """The least number of paired rounds whose widest order-statistic interval (min, max) covers the median with
    ``confidence``: 1 - 2 / 2^n >= confidence (8 at 0.99, 6 at 0.95)."""
    n = 1
    while 1 - 2 * 0.5 ** n < confidence:
        n += 1
    return n


def order_interval(values: list[float], confidence: float) -> tuple[float, float] | None:
    """The order-statistic interval of the median at ``confidence`` (see `median_interval`), or None when there
    are too few values to reach it (`min_rounds_for`)."""
    if len(values) < min_rounds_for(confidence):
        return None
    return median_interval(values, confidence)


@dataclass(frozen=True)
class LogSample:
    """The paired rounds of one workload as log-ratios ln(reference time / candidate time), in round order."""

    d: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.d)


@dataclass(frozen=True)
class PairedStats:
    """Reference time / candidate time: ``ratio`` the exp of the median log-ratio over rounds (> 1: the candidate
    is faster), its ``confidence`` interval (``lo``, ``hi``; (0, inf) when there are too few rounds for one),
    ``n`` rounds."""

    ratio: float
    lo: float
    hi: float
    n: int
    confidence: float

    def verdict(self, min_effect: float = 0.01) -> Verdict:
        """``faster`` when the whole interval is above 1 and the ratio at least 1 + ``min_effect``; ``slower``
        when the whole interval is below 1 and the ratio at most 1 / (1 + ``min_effect``); else ``tie``."""
        if self.lo > 1.0 and self.ratio >= 1.0 + min_effect:
            return "faster"
        if self.hi < 1.0 and self.ratio <= 1.0 / (1.0 + min_effect):
            return "slower"
        return "tie"

    @property
    def half_width(self) -> float:
        """Half the interval's width in log space (0.05 is about +-5%); inf when there is no interval."""
        if self.lo <= 0 or not math.isfinite(self.hi):
            return math.inf
        return 0.5 * (math.log(self.hi) - math.log(self.lo))


def log_sample(cand_ms: list[float], ref_ms: list[float]) -> LogSample:
    """The rounds of one workload (candidate and reference times of the same rounds, in ms) as log-ratios.
    Raises ValueError when the lists differ in length, are empty, or hold a time <= 0."""
    if len(cand_ms) != len(ref_ms) or not cand_ms:
        raise ValueError(f"paired times need equal, non-empty lists (got {len(cand_ms)} and {len(ref_ms)})")
    c, r = np.asarray(cand_ms, np.float64), np.asarray(ref_ms, np.float64)
    if (c <= 0).any() or (r <= 0).any():
        raise ValueError("paired times must be > 0 ms")
    return LogSample(tuple(float(x) for x in np.log(r) - np.log(c)))


def _stats(d: list[float], confidence: float) -> PairedStats:
    est = float(np.median(d))
    iv = order_interval(d, confidence)
    if iv is None:
        return PairedStats(math.exp(est), 0.0, math.inf, len(d), confidence)
    return PairedStats(math.exp(est), math.exp(iv[0]), math.exp(iv[1]), len(d), confidence)


def paired_ratio(cand_ms: list[float], ref_ms: list[float], confidence: float = 0.999) -> PairedStats:
    """Reference / candidate time over the paired rounds of one workload, with the order-statistic interval of
    the median log-ratio. Raises ValueError as `log_sample`."""
    return _stats(list(log_sample(cand_ms, ref_ms).d), confidence)


def combine_paired(samples: list[LogSample], confidence: float = 0.999) -> PairedStats:
    """Over workloads (each weighing the same, a geometric mean as the search's score is): round r's combined
    log-ratio is the mean over workloads of their r-th rounds' (rounds up to the fewest any workload had; under
    equal kernels each is symmetric about 0, so the interval stays distribution-free), then median and interval
    as for one workload. ``n`` counts the combined rounds. Raises ValueError when ``samples`` is empty."""
    if not samples:
        raise ValueError("no paired samples to combine")
    n = min(s.n for s in samples)
    d = [sum(s.d[r] for s in samples) / len(samples) for r in range(n)]
    return _stats(d, confidence)
