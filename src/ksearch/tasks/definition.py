"""Task records: Definition and Workload, compatible with flashinfer-bench's JSON files.

A *definition* says what to compute: named axes (``const`` with a value, or ``var``), named inputs and
outputs with symbolic shapes (lists of axis names) and dtypes, a reference implementation (Python source
defining a global ``run``), and constraints (Python expressions over the axes). A *workload* gives concrete
values to the ``var`` axes and says how each input is made.

The field names and meaning follow flashinfer-bench's Definition and Workload
(https://github.com/flashinfer-ai/flashinfer-bench, Apache-2.0), so its definition files load unchanged.
On top of those ksearch adds, all optional so foreign files still load:

- ``tolerance``: rtol/atol per output dtype;
- ``inputs[...].distribution``: how random inputs are drawn;
- ``cost``: expressions for FLOPs and transcendental ops (bytes default to the sum of all input and
  output sizes), from which the roofline floor is computed; a task without one whose reference is torch gets its
  FLOPs counted on the reference (`ksearch.tasks.flops`), else its floor counts bytes only;
- ``reference_backend``: ``torch`` (flashinfer-bench's convention) or ``numpy``;
- ``reference_inputs`` (numpy references): ``float64`` (the default: every input array widened before ``run``)
  or ``native`` (float16 and float32 arrays reach ``run`` as stored, and ``run`` widens them itself, e.g. a
  sequence at a time; bfloat16 is still decoded to float64, NumPy having no bfloat16). A torch reference gets
  its inputs as torch tensors whatever this says.
- ``input_generator`` and ``checker``: inputs and a correctness check written as Python by the task (imported
  KernelBench and GPU MODE problems; see `ksearch.tasks.generated`).
"""

from __future__ import annotations

import math
import uuid as uuidlib
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ksearch.errors import TaskError
from ksearch.tasks.cost import COST_ANNOTATION, COST_BYTES_ONLY, CostModel, WorkloadCost
from ksearch.tasks.cost import join_cost_sources  # noqa: F401 - re-exported: callers import it from here
from ksearch.tasks.dtypes import DEFAULT_TOLERANCE, DTYPE_BYTES, is_integer_dtype
from ksearch.tasks.exprs import compile_expr as _compile_expr
from ksearch.tasks.exprs import eval_expr
from ksearch.tasks.fi_dump import read_trace_dump
from ksearch.tasks.structured import compile_data_constraint, is_data_constraint


class _Record(BaseModel):
    """Base of task records: unknown keys are kept (third-party files), values validated."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ConstAxis(_Record):
    """An axis fixed by the definition (e.g. a model's head_dim)."""

    type: Literal["const"]
    value: int = Field(ge=0)
    description: str | None = None


class VarAxis(_Record):
    """An axis whose value each workload gives (e.g. sequence length)."""

    type: Literal["var"]
    description: str | None = None
    #: ksearch extension: valid range (inclusive), checked on every workload and used to draw hidden ones.
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _range_in_order(self) -> "VarAxis":
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


Axis = Annotated[Union[ConstAxis, VarAxis], Field(discriminator="type")]


class Distribution(_Record):
    """How a random input is drawn (ksearch extension).

    ``normal``: mean + std * N(0, 1); ``uniform``: U(low, high); ``neg_uniform``: -U(low, high), for
    parameters that must be negative such as Mamba's A; ``integers``: integers in [low, high); ``zeros``: all
    zeros (for an input whose zero is the common case, such as a scan's initial state, which a ``check`` workload
    then draws nonzero through its ``distributions``).
    """

    kind: Literal["normal", "uniform", "neg_uniform", "integers", "zeros"] = "normal"
    mean: float = 0.0
    std: float = Field(default=1.0, ge=0)
    low: float = 0.0
    high: float = 1.0

    @model_validator(mode="after")
    def _range_in_order(self) -> "Distribution":
        if not all(math.isfinite(v) for v in (self.mean, self.std, self.low, self.high)):
            raise ValueError(f"{self.kind} distribution: mean, std, low and high must be finite")
        if self.kind not in ("normal", "zeros") and self.low > self.high:
            raise ValueError(f"{self.kind} distribution: low {self.low} > high {self.high}")
        if self.kind not in ("normal", "zeros") and not math.isfinite(self.high - self.low):
            raise ValueError(f"{self.kind} distribution: high - low overflows ({self.low}, {self.high})")
        if self.kind == "integers" and int(self.low) >= int(self.high):
            raise ValueError(f"integers distribution: no integer in [{int(self.low)}, {int(self.high)})")
        return self

    def describe(self) -> str:
        """Short text: ``normal(mean 4, std 3)``, ``uniform[-4, -1)``, ``-uniform[1, 16)``, ``integers[0, 100)``,
        ``zeros``."""
        if self.kind == "zeros":
            return "zeros"
        if self.kind == "normal":
            return f"normal(mean {self.mean:g}, std {self.std:g})"
        sign = "-" if self.kind == "neg_uniform" else ""
        name = "integers" if self.kind == "integers" else "uniform"
        return f"{sign}{name}[{self.low:g}, {self.high:g})"


class TensorSpec(_Record):
    """A named input or output: symbolic shape (axis names; ``None`` for a Python scalar) and dtype."""

    shape: list[str] | None
    dtype: str
    description: str | None = None
    distribution: Distribution | None = None

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        if v not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {v!r}; known: {', '.join(DTYPE_BYTES)}")
        return v


class Tolerance(_Record):
    """When an output element is right, per output dtype, and how many must be.

    ``rule`` ``sum`` (ksearch's, NumPy's allclose): |got - want| <= atol + rtol * |want|. ``either``
    (flashinfer-bench's ``compute_error_stats``): |got - want| <= atol or |got - want| <= rtol * (|want| + 1e-8).
    ``matched_ratio``: the least share of elements that must be right (flashinfer-bench's
    ``required_matched_ratio``; 1.0: all). A non-finite value where the reference is finite is always wrong and
    fails the output, whatever the ratio.
    """

    rtol: float = Field(ge=0)
    atol: float = Field(ge=0)
    rule: Literal["sum", "either"] = "sum"
    matched_ratio: float = Field(default=1.0, gt=0, le=1)


class Definition(_Record):
    """What to compute. Field names and meaning as in flashinfer-bench's Definition."""

    name: str
    op_type: str = "custom"
    tags: list[str] = Field(default_factory=list)
    description: str | None = None
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str
    #: expressions over the axes, checked on each workload; one that reads input data (``num_kv_indices ==
    #: kv_indptr[-1].item()``) is checked on the drawn inputs instead (`ksearch.tasks.structured`). null: none.
    constraints: list[str] = Field(default_factory=list)
    # ksearch extensions
    tolerance: dict[str, Tolerance] = Field(default_factory=dict)
    cost: CostModel = Field(default_factory=CostModel)
    reference_backend: Literal["torch", "numpy"] = "torch"
    reference_inputs: Literal["float64", "native"] = "float64"
    #: other implementations to time beside the candidates: name -> Python file (relative to the definition's
    #: directory) defining ``run`` with the reference's signature, e.g. a framework's token-by-token loop.
    baselines: dict[str, str] = Field(default_factory=dict)
    #: Python source defining ``generate(seed, **axes)`` that returns every input by name (torch tensors or NumPy
    #: arrays of the spec's shape and dtype, Python numbers for scalars): the inputs of a (workload, seed) come from
    #: it instead of the distributions (`ksearch.tasks.generated`; KernelBench's ``get_inputs``, GPU MODE's
    #: ``generate_input``). Trusted task code, run in the judge's process like the reference.
    input_generator: str | None = None
    #: Python source defining ``check(inputs, outputs)`` (dicts by name of torch tensors for a torch reference, else
    #: NumPy arrays) returning True/False, ``(ok, message)`` or a message (empty: passed): the task's own
    #: correctness check, used instead of the tolerance (`ksearch.tasks.generated`; GPU MODE's ``check_implementation``)
    checker: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _trace_dump(cls, data):
        return read_trace_dump(data) if isinstance(data, dict) else data  # FlashInfer's dumper: tasks/fi_dump.py

    @field_validator("constraints", mode="before")
    @classmethod
    def _null_constraints(cls, v):
        return [] if v is None else v  # flashinfer-bench writes "constraints": null

    @model_validator(mode="after")
    def _shapes_name_axes(self) -> "Definition":
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for name, spec in specs.items():
                for ax in spec.shape or []:
                    if ax not in self.axes:
                        raise ValueError(f"{kind} {name!r} uses axis {ax!r}, not among axes {list(self.axes)}")
        clash = set(self.inputs) & set(self.outputs)
        if clash:  # an in-place update (FlashInfer's trace dumper writes them so): a kernel's inputs are read-only
            raise ValueError(f"names used for both an input and an output: {sorted(clash)} (an in-place update: "
                             "inputs are read-only here; name the updated tensor as an output of its own)")
        for expr in self.constraints:
            if is_data_constraint(expr, self.inputs):
                compile_data_constraint(expr, known=set(self.axes) | set(self.inputs))
            else:
                _compile_expr(expr)
        if "def run" not in self.reference:
            raise ValueError("reference must define a global function `run`")
        return self

    # -- derived values -------------------------------------------------------------------------

    @property
    def axis_constraints(self) -> list[str]:
        """The constraints over axes only (checked on each workload by `axis_values`)."""
        return [c for c in self.constraints if not is_data_constraint(c, self.inputs)]

    @property
    def data_constraints(self) -> list[str]:
        """The constraints that read input data (checked on drawn inputs: `ksearch.tasks.structured`)."""
        return [c for c in self.constraints if is_data_constraint(c, self.inputs)]

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if isinstance(a, VarAxis)]

    def axis_values(self, workload: "Workload") -> dict[str, int]:
        """All axis values (const and var) for a workload, in definition order.

        Raises:
            TaskError: the workload names an axis the definition does not have, a var axis is missing from the
                workload or outside its range (negative, or outside the axis' ``min``/``max``), a const axis given
                another value, or a constraint does not hold.
        """
        unknown = [k for k in workload.axes if k not in self.axes]
        if unknown:  # a typo would leave the axis it meant at its default, or missing, and say nothing
            raise TaskError(f"workload {workload.label!r} gives axis {', '.join(map(repr, unknown))}, which "
                            f"{self.name!r} does not have; its axes: {list(self.axes)}")
        values: dict[str, int] = {}
        for name, ax in self.axes.items():
            given = workload.axes.get(name)
            if isinstance(ax, ConstAxis):
                if given is not None and given != ax.value:
                    raise TaskError(f"workload {workload.label!r} gives {name}={given}, but {self.name!r} fixes it "
                                    f"at {ax.value}")
                values[name] = ax.value
                continue
            if given is None:
                raise TaskError(f"workload {workload.label!r} gives no value for var axis {name!r} of {self.name!r}")
            lo = 0 if ax.min is None else ax.min
            if given < lo or (ax.max is not None and given > ax.max):
                allowed = f">= {lo}" if ax.max is None else f"in [{lo}, {ax.max}]"
                raise TaskError(f"workload {workload.label!r} gives {name}={given}; {self.name!r} allows {allowed}")
            values[name] = int(given)
        for expr in self.axis_constraints:
            if not eval_expr(expr, values):
                raise TaskError(f"workload {workload.label!r} breaks constraint {expr!r} of {self.name!r} ({values})")
        return values

    def check_workload(self, workload: "Workload") -> dict[str, int]:
        """`axis_values`, and the workload's ``inputs`` name inputs of this definition, a scalar only for a scalar
        input; its ``distributions`` name random inputs of this definition, ``integers`` exactly for integer
        dtypes. Returns the axis values.

        Raises:
            TaskError: as `axis_values`, or an input the definition does not have, a scalar for an array, or a
                distribution for a non-random input or of the wrong kind for the input's dtype.
        """
        values = self.axis_values(workload)
        for name, how in workload.inputs.items():
            spec = self.inputs.get(name)
            if spec is None:
                raise TaskError(f"workload {workload.label!r} gives input {name!r}, which {self.name!r} does not "
                                f"have; its inputs: {list(self.inputs)}")
            if isinstance(how, ScalarInput) and spec.shape is not None:
                raise TaskError(f"workload {workload.label!r} gives a scalar for input {name!r}, an array of shape "
                                f"{spec.shape}")
        for name, dist in workload.distributions.items():
            spec = self.inputs.get(name)
            if spec is None:
                raise TaskError(f"workload {workload.label!r} gives a distribution for input {name!r}, which "
                                f"{self.name!r} does not have; its inputs: {list(self.inputs)}")
            how = workload.inputs.get(name)
            if how is not None and not isinstance(how, RandomInput):
                raise TaskError(f"workload {workload.label!r} gives a distribution for input {name!r}, which it "
                                f"also gives as {how.type!r} (a distribution is for random inputs)")
            is_int = is_integer_dtype(spec.dtype)
            if dist.kind != "zeros" and is_int != (dist.kind == "integers"):
                raise TaskError(f"workload {workload.label!r}: distribution {dist.kind!r} for {spec.dtype} input "
                                f"{name!r} ({'integers or zeros' if is_int else 'normal, uniform, neg_uniform or zeros'}"
                                " expected)")
        return values

    def shape_of(self, spec: TensorSpec, axis_values: dict[str, int]) -> tuple[int, ...] | None:
        """Concrete shape of an input/output, or None for a Python scalar."""
        if spec.shape is None:
            return None
        return tuple(axis_values[a] for a in spec.shape)

    def tolerance_for(self, dtype: str) -> Tolerance:
        """The tolerance for outputs of this dtype: the definition's, else the default table."""
        if dtype in self.tolerance:
            return self.tolerance[dtype]
        if dtype in DEFAULT_TOLERANCE:
            return Tolerance.model_validate(DEFAULT_TOLERANCE[dtype])
        return Tolerance(rtol=0.0, atol=0.0)

    def bytes_of(self, workload: "Workload") -> float:
        """Bytes a workload must move: the cost model's ``bytes`` expression, else the sum of the sizes of all
        inputs and outputs (their shapes times their dtypes' sizes)."""
        values = self.axis_values(workload)
        if self.cost.bytes is not None:
            return float(eval_expr(self.cost.bytes, values))
        nbytes = 0.0
        for spec in list(self.inputs.values()) + list(self.outputs.values()):
            shape = self.shape_of(spec, values)
            if shape is not None:
                nbytes += math.prod(shape) * DTYPE_BYTES[spec.dtype]
        return nbytes

    def cost_of(self, workload: "Workload") -> WorkloadCost:
        """Bytes, FLOPs and transcendentals a workload must move or compute, and where the figures come from
        (``source``): the task's cost model where it gives one (`COST_ANNOTATION`); else, for a torch reference,
        the FLOPs torch's FlopCounterMode counts on it (`ksearch.tasks.flops`; cached per workload shape); else
        bytes only (`COST_BYTES_ONLY`). Bytes: `bytes_of`."""
        values = self.axis_values(workload)
        nbytes = self.bytes_of(workload)
        if not self.cost.is_empty:
            return WorkloadCost(bytes=nbytes, flops=float(eval_expr(self.cost.flops, values)),
                                transcendentals=float(eval_expr(self.cost.transcendentals, values)),
                                flops_on=self.cost.flops_on, source=COST_ANNOTATION)
        if self.reference_backend == "torch":
            from ksearch.tasks.flops import SOURCE, count_flops

            counted = count_flops(self, workload)
            if counted.flops is not None:
                return WorkloadCost(bytes=nbytes, flops=counted.flops, transcendentals=0.0,
                                    flops_on=counted.flops_on, source=SOURCE)
            return WorkloadCost(bytes=nbytes, flops=0.0, transcendentals=0.0,
                                source=f"{COST_BYTES_ONLY} (FLOPs not counted: {counted.note[:120]})")
        return WorkloadCost(bytes=nbytes, flops=0.0, transcendentals=0.0, source=COST_BYTES_ONLY)


class RandomInput(_Record):
    type: Literal["random"]


class ScalarInput(_Record):
    type: Literal["scalar"]
    value: float | int | bool


class SafetensorsInput(_Record):
    type: Literal["safetensors"]
    path: str
    tensor_key: str


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")]


class Workload(_Record):
    """Concrete values for a definition's var axes, and how each input is made.

    Field names as in flashinfer-bench's Workload; inputs not listed are drawn at random.
    ``name`` (for display; defaults to the axis values) and ``purpose`` are ksearch extensions.
    """

    uuid: str = Field(default_factory=lambda: str(uuidlib.uuid4()))
    axes: dict[str, int]
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    name: str | None = None
    #: ksearch extension: ``check`` workloads are small shapes for correctness only (a search does not time
    #: them); ``bench`` workloads are checked and timed, and the search's objective is measured on them.
    purpose: Literal["check", "bench"] = "bench"
    #: ksearch extension: input name -> the distribution its random values are drawn from in this workload,
    #: over the definition's (a property workload: large-magnitude logits, extreme dt); inputs not named keep
    #: the definition's. Checked against the definition by `Definition.check_workload`.
    distributions: dict[str, Distribution] = Field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or ",".join(f"{k}={v}" for k, v in self.axes.items())
