"""Hidden workloads: axis values the candidate has never been shown, drawn from the axes' valid ranges.

Used by the final evaluation with a secret seed (`secrets.randbits`), so a kernel that hard-codes the public
workload sizes fails there. Each var axis is drawn log-uniformly in [min, max] (the definition's ``min`` /
``max``; where it gives none, the range the public workloads span), then the largest axis (relative to its
minimum) is halved until the workload moves at most ``max_bytes`` (by default the largest public workload's
bytes, so hidden checks cost no more than the public ones); draws that break a constraint or repeat a public
workload are drawn again.
"""

from __future__ import annotations

import math
import random

from ksearch.errors import TaskError
from ksearch.tasks.definition import Definition, VarAxis, Workload


def axis_ranges(definition: Definition, public: list[Workload]) -> dict[str, tuple[int, int]]:
    """[min, max] of each var axis: the definition's bounds, else those of the public workloads, else [1, 1]."""
    out = {}
    for name, ax in definition.axes.items():
        if not isinstance(ax, VarAxis):
            continue
        seen = [int(w.axes[name]) for w in public if name in w.axes]
        lo = ax.min if ax.min is not None else (min(seen) if seen else 1)
        hi = ax.max if ax.max is not None else (max(seen) if seen else lo)
        out[name] = (max(0, int(lo)), max(int(lo), int(hi)))
    return out


def draw_hidden_workloads(definition: Definition, seed: int, n: int, public: list[Workload],
                          max_bytes: float | None = None, tries: int = 200) -> list[Workload]:
    """``n`` workloads (purpose ``check``, named ``hidden-<i>``) with axis values drawn as the module says.

    Args:
        definition: the task definition; seed: the secret seed; public: the workloads the search saw.
        max_bytes: bytes one hidden workload may move (None: the largest public workload's).

    Raises:
        TaskError: no valid draw within ``tries`` attempts (e.g. contradictory constraints).
    """
    ranges = axis_ranges(definition, public)
    if max_bytes is None:
        max_bytes = max((definition.bytes_of(w) for w in public), default=64 << 20)
    rng = random.Random(seed)
    shown = {tuple(sorted((k, int(v)) for k, v in w.axes.items())) for w in public}
    out: list[Workload] = []
    for i in range(n):
        for _ in range(tries):
            drawn = {name: _log_uniform(rng, lo, hi) for name, (lo, hi) in ranges.items()}
            axes = _shrink(definition, drawn, ranges, max_bytes)
            if axes is None or tuple(sorted(axes.items())) in shown:
                continue
            key = tuple(sorted(axes.items()))
            wl = Workload(axes=axes, name=f"hidden-{i}", purpose="check")
            try:
                definition.axis_values(wl)
            except TaskError:
                continue
            shown.add(key)
            out.append(wl)
            break
        else:
            raise TaskError(f"no valid hidden workload for {definition.name!r} in {tries} draws from {ranges}")
    return out


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    if hi <= lo:
        return lo
    a, b = math.log(max(lo, 1)), math.log(hi + 1)
    return max(lo, min(hi, int(math.exp(rng.uniform(a, b)))))


def _shrink(definition: Definition, axes: dict[str, int], ranges: dict[str, tuple[int, int]],
            max_bytes: float) -> dict[str, int] | None:
    """Halve the axis furthest above its minimum until the workload fits ``max_bytes`` (None if it cannot)."""
    axes = dict(axes)
    for _ in range(256):
        try:
            size = definition.bytes_of(Workload(axes=axes))
        except TaskError:
            return axes  # a constraint fails: the caller draws again
        if size <= max_bytes:
            return axes
        name = max(axes, key=lambda k: axes[k] / max(ranges[k][0], 1))
        if axes[name] <= max(ranges[name][0], 1):
            return None
        axes[name] = max(ranges[name][0], axes[name] // 2 + (axes[name] % 2))
    return None
