"""Statistics of timed repeats (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TimeStats:
    """``median_ms``, ``min_ms``; ``spread`` = (p75 - p25) / median (0 = perfectly repeatable); ``n`` repeats."""

    median_ms: float
    min_ms: float
    spread: float
    n: int


def summarize_times(times_ms: list[float]) -> TimeStats:
    """Median, minimum and relative interquartile spread of repeat times in ms. Raises ValueError if empty."""
    if not times_ms:
        raise ValueError("no timed repeats to summarize")
    t = np.asarray(times_ms, np.float64)
    med = float(np.median(t))
    q1, q3 = np.percentile(t, [25, 75])
    return TimeStats(median_ms=med, min_ms=float(t.min()), spread=float((q3 - q1) / med) if med > 0 else 0.0,
                     n=int(t.size))
