"""Messages between the controller and a worker: one JSON object per line.

Requests (controller -> worker):
- ``{"op": "ping"}``: answered at once with ``worker_ms`` of an empty native call; sent before the kernel loads, so
  the controller learns the round-trip cost of a call it times with its own clock (see ``go``);
- ``{"op": "load", "target", "artifact", "evict": path | null, "candidate": {...}, "definition": {...}}``;
  ``evict``: the judge's cache-eviction library (`ksearch.targets.cpu.CpuTarget.evict_library`), loaded first;
- ``{"op": "call", "args": [ArgRef...], "timing": TimingPlan | null, "warmup_args": [ArgRef...] | null}``;
  each ArgRef is ``{"kind": "array", "path", "dtype", "shape", "writable"}`` or ``{"kind": "scalar", "value"}``,
  in ABI order (inputs, outputs, axes). Untimed (``timing`` null), or, for a device target's runner, a block of
  repeats timed by the device's own events (warm-up on ``warmup_args``);
- ``{"op": "prepare", "args": [ArgRef...], "flush_bytes": N}``: map these inputs (at a new address) and outputs for
  the next ``go``, then, N > 0, evict them from every cache level line by line (the eviction library), or without
  that library write N bytes of a buffer (evicting the caches of the core the worker runs on);
- ``{"op": "go"}``: call the kernel once on the prepared arguments and reply at once with ``worker_ms``, the
  worker's own reading of the call. The controller times the request with its own clock; the worker's reading is
  only checked against it (a kernel in the worker's address space can forge the worker's clock, not the
  controller's).
Every request carries an ``id`` (random); every reply echoes it.
Replies (worker -> controller): ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a load reply has
``pid``, ``sandbox`` (what the sandbox enforced), ``evict`` (true: the eviction library is in use) and ``device`` (true: a device target's runner, timed in blocks by
device events), a timed block's reply ``times_ms`` and ``sums`` (per timed call: [non-finite output values, sum of
|finite output values|], taken after the clock stopped).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class TimingPlan(BaseModel):
    """How calls are timed: warm-up, then repeats until both minimums are met or a maximum is hit.

    Each repeat is preceded (outside the timed region) by re-poisoning the outputs and evicting the caches
    (``flush_bytes``: see the ``prepare`` request). A candidate timed beside reference kernels (paired rounds, see
    `ksearch.eval.timing`) stops once every comparison is decided or precise: after at least ``min_rounds``
    rounds (and the rounds an interval at ``confidence`` needs), when the interval excludes a tie or its half-width
    is at most ``precision`` (log units: 0.05 is about +-5%), or at ``max_rounds``; differences under
    ``min_effect`` are ties. ``block_repeats``: device-timed
    repeats per round for device targets (their events time a block; the round's time is its median).
    """

    warmup: int = 1
    min_repeats: int = 5
    max_repeats: int = 50
    min_time_s: float = 0.3
    max_time_s: float = 5.0
    flush_bytes: int = 64 << 20
    min_rounds: int = Field(default=3, ge=2)
    max_rounds: int = Field(default=25, ge=2)
    precision: float = Field(default=0.05, gt=0)
    confidence: float = Field(default=0.999, gt=0.5, lt=1)
    min_effect: float = Field(default=0.01, ge=0)
    block_repeats: int = Field(default=3, ge=1)

    def done(self, repeats: int, timed_s: float) -> bool:
        """Whether ``repeats`` timed calls adding up to ``timed_s`` seconds are enough: both minimums met, the
        repeat cap reached, or the time budget spent with at least three repeats (a median of one is no median)."""
        return (repeats >= self.max_repeats or (repeats >= self.min_repeats and timed_s >= self.min_time_s)
                or (timed_s >= self.max_time_s and repeats >= min(3, self.max_repeats)))
