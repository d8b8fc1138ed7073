"""The work a task's workload must do: its cost model (a task's own annotation, ksearch extension) and the figures
the roofline floor is computed from (`WorkloadCost`, made by `ksearch.tasks.definition.Definition.cost_of`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from ksearch.hardware.catalog import FIGURES
from ksearch.tasks.exprs import compile_expr

#: The ``peak_flops`` keys a cost model's ``flops_on`` may name: the hardware catalog's figures (plain dtypes are
#: vector/SIMD rates, ``tensor_*`` matrix-unit rates).
FLOPS_ON_KEYS: tuple[str, ...] = tuple(k.removeprefix("peak_flops.") for k in FIGURES if k.startswith("peak_flops."))


class CostModel(BaseModel):
    """Work per workload as Python expressions over the axes (ksearch extension).

    ``bytes``: bytes that must move between memory and the chip; when None, the sum of the sizes of all
    inputs and outputs (every input read once, every output written once). ``flops``: floating-point
    operations (an FMA counts 2). ``transcendentals``: exp/log/... evaluations. ``flops_on``: the hardware
    spec's ``peak_flops`` key whose rate the FLOPs can reach, ``float32`` (vector units) by default, a tensor key
    (``tensor_float16``, ``tensor_bfloat16``) for matmul FLOPs on 16-bit inputs that matrix units can run
    (see ``ksearch.hardware.roofline.peak_for``).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)  # a task record: unknown keys kept

    bytes: str | None = None
    flops: str = "0"
    transcendentals: str = "0"
    flops_on: str = "float32"

    @model_validator(mode="after")
    def _expressions_compile(self) -> "CostModel":
        for expr in (self.bytes, self.flops, self.transcendentals):
            if expr is not None:
                compile_expr(expr)
        if self.flops_on not in FLOPS_ON_KEYS:  # a typo would silently drop (GPU) or change (CPU) the compute term
            raise ValueError(f"flops_on {self.flops_on!r} is not a peak_flops key: one of {list(FLOPS_ON_KEYS)}")
        return self

    @property
    def is_empty(self) -> bool:
        """Whether it says nothing (the defaults: bytes from shapes, no FLOPs, no transcendentals): a task without
        a cost model, whose FLOPs `Definition.cost_of` counts on a torch reference instead. A task folder written
        by `ksearch tasks import` carries this empty model and stays without one."""
        return self.bytes is None and self.flops.strip() == "0" and self.transcendentals.strip() == "0"


#: `WorkloadCost.source` of a task's own cost model
COST_ANNOTATION = "annotation: the task's cost model"
#: `WorkloadCost.source` without FLOPs: the floor counts bytes only
COST_BYTES_ONLY = "bytes only"


def join_cost_sources(sources: list[str], most: int = 3) -> str:
    """Distinct `WorkloadCost.source` texts joined for a caption: the first ``most``, then how many more (a
    reason naming each workload, such as a missing blob, would otherwise print once per workload)."""
    sources = list(dict.fromkeys(sources))
    more = len(sources) - most
    return "; ".join(sources[:most]) + (f"; and {more} more (one per workload)" if more > 0 else "")


class WorkloadCost(BaseModel):
    """What one call of a workload must do: ``bytes`` moved, ``flops``, ``transcendentals`` (counts); ``flops_on``:
    the ``peak_flops`` key of the units the FLOPs can run on (CostModel); ``source``: where the figures come from
    (`Definition.cost_of`: the task's annotation, torch's FLOP counter, or bytes only)."""

    bytes: float
    flops: float
    transcendentals: float
    flops_on: str = "float32"
    source: str = COST_ANNOTATION
