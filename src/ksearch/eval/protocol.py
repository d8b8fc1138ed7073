"""Messages between the controller and a worker: one JSON object per line.

Requests (controller -> worker):
- ``{"op": "load", "target", "artifact", "candidate": {...}, "definition": {...}}``
- ``{"op": "call", "args": [ArgRef...], "timing": TimingPlan | null, "warmup_args": [ArgRef...] | null}``;
  each ArgRef is ``{"kind": "array", "path", "dtype", "shape", "writable"}`` or ``{"kind": "scalar", "value"}``,
  in ABI order (inputs, outputs, axes). With a timing plan, the warm-up calls use ``warmup_args`` (other
  inputs), the timed calls ``args``.
Every request carries an ``id`` (random); every reply echoes it.
Replies (worker -> controller): ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a load reply has
``pid`` and ``sandbox`` (what the sandbox enforced), a timing reply ``times_ms`` and ``sums`` (per timed call:
[non-finite output values, sum of |finite output values|], taken after the clock stopped).
"""

from __future__ import annotations

from pydantic import BaseModel


class TimingPlan(BaseModel):
    """How the worker times calls: warm-up, then repeats until both minimums are met or a maximum is hit.

    Each repeat is preceded (outside the timed region) by re-poisoning the outputs and writing a buffer of
    ``flush_bytes`` to evict the caches.
    """

    warmup: int = 1
    min_repeats: int = 5
    max_repeats: int = 50
    min_time_s: float = 0.3
    max_time_s: float = 5.0
    flush_bytes: int = 64 << 20

    def done(self, repeats: int, timed_s: float) -> bool:
        """Whether ``repeats`` timed calls adding up to ``timed_s`` seconds are enough: both minimums met, the
        repeat cap reached, or the time budget spent with at least three repeats (a median of one is no median)."""
        return (repeats >= self.max_repeats or (repeats >= self.min_repeats and timed_s >= self.min_time_s)
                or (timed_s >= self.max_time_s and repeats >= min(3, self.max_repeats)))
