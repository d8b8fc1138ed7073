"""The cuda target's launch plan: kernels, grid and block as expressions over the task's axes, as data.

The format is documented in docs/cuda-target.md. Pure Python (no CUDA): validated and resolved the same way
in the controller (so a bad plan is a COMPILE_ERROR before any worker starts) and in the worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ksearch.errors import PlanError, TaskError
from ksearch.tasks.definition import Definition, _compile_expr, eval_expr

RawExpr = Union[int, str]

#: NVRTC options a candidate may add (prefix match); everything else is refused
ALLOWED_FLAG_PREFIXES = ("-D", "--define-macro=", "--use_fast_math", "-use_fast_math", "--maxrregcount=",
                         "-maxrregcount=", "-lineinfo", "--generate-line-info", "--extra-device-vectorization",
                         "-std=c++17", "-std=c++20", "--std=c++17", "--std=c++20", "--ftz=", "-ftz=", "--prec-div=",
                         "-prec-div=", "--prec-sqrt=", "-prec-sqrt=", "--fmad=", "-fmad=", "-U")


def _check_expr(v: RawExpr) -> RawExpr:
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not an integer or an expression")
    if isinstance(v, str):
        _compile_expr(v)  # raises ValueError naming what is wrong
    return v


#: an integer, or an expression over the task's axes (checked when the plan is parsed)
Expr = Annotated[RawExpr, AfterValidator(_check_expr)]


class Temporary(BaseModel):
    """A device buffer the judge allocates for the candidate: ``shape`` (expressions over axes), ``dtype``;
    ``init``: ``poison`` (NaN / 0xA5 bytes before every call, outside the clock) or ``zero`` (zeroed inside
    the timed region, before the first launch)."""

    model_config = ConfigDict(extra="forbid")

    dtype: str
    shape: list[Expr] = Field(min_length=1)
    init: Literal["poison", "zero"] = "poison"



class Launch(BaseModel):
    """One kernel launch: ``kernel`` (a name in the source, or an exact template instantiation), ``grid`` and
    ``block`` (1 to 3 expressions, x y z), ``shared_bytes`` (dynamic shared memory, bytes), ``args`` (names
    of inputs, outputs, axes, temporaries; None: inputs, outputs, axes in definition order), ``when``
    (an optional condition: the launch runs only where it holds)."""

    model_config = ConfigDict(extra="forbid")

    kernel: str = Field(min_length=1)
    grid: list[Expr] = Field(min_length=1, max_length=3)
    block: list[Expr] = Field(min_length=1, max_length=3)
    shared_bytes: Expr = 0
    args: list[str] | None = None
    when: Annotated[str, AfterValidator(_check_expr)] | None = None



class LaunchPlan(BaseModel):
    """A sequence of launches run in order on one stream, plus the temporaries they share."""

    model_config = ConfigDict(extra="forbid")

    launches: list[Launch] = Field(min_length=1)
    temporaries: dict[str, Temporary] = Field(default_factory=dict)

    def kernel_names(self) -> list[str]:
        """Distinct kernel names, in first-use order (NVRTC name expressions)."""
        return list(dict.fromkeys(launch.kernel for launch in self.launches))


@dataclass(frozen=True)
class ResolvedLaunch:
    """A launch with every expression evaluated for one workload."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[str, ...]


def field_errors(what: str, e: ValidationError) -> PlanError:
    """A PlanError naming each bad field of ``what`` (``launch plan: launches.0.grid.1: ...; ...``)."""
    return PlanError(f"{what}: " + "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                                            for err in e.errors()))


def parse_plan(launch: dict, definition: Definition) -> LaunchPlan:
    """Validate ``Candidate.launch`` against the format and the task's names.

    Raises:
        PlanError: the message names the field (``launches.0.grid.1: ...``) or the unknown argument name.
    """
    if not launch:
        raise PlanError("the cuda target needs a launch plan (Candidate.launch); see docs/cuda-target.md")
    try:
        plan = LaunchPlan.model_validate(launch)
    except ValidationError as e:
        raise field_errors("launch plan", e) from None
    known = set(definition.inputs) | set(definition.outputs) | set(definition.axes)
    clash = known & set(plan.temporaries)
    if clash:
        raise PlanError(f"launch plan: temporaries {sorted(clash)} reuse the names of inputs, outputs or axes")
    known |= set(plan.temporaries)
    for i, launch_ in enumerate(plan.launches):
        for name in launch_.args or []:
            if name not in known:
                raise PlanError(f"launch plan: launches.{i}.args: unknown name {name!r} "
                                f"(inputs, outputs, axes, temporaries: {sorted(known)})")
    for name, tmp in plan.temporaries.items():
        if tmp.dtype not in _DTYPES:
            raise PlanError(f"launch plan: temporaries.{name}.dtype: {tmp.dtype!r} is not one of {sorted(_DTYPES)}")
    return plan


_DTYPES = {"float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool", "int16"}


def default_args(definition: Definition) -> tuple[str, ...]:
    """The ABI order: inputs, outputs, then every axis, in definition order."""
    return tuple(definition.inputs) + tuple(definition.outputs) + tuple(definition.axes)


def _int(expr: Expr, axes: dict[str, int], where: str, least: int) -> int:
    try:
        value = eval_expr(expr, axes) if isinstance(expr, str) else expr
    except (TaskError, ArithmeticError, TypeError, ValueError) as e:
        raise PlanError(f"{where}: {expr!r}: {e}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise PlanError(f"{where}: {expr!r} = {value!r} for axes {axes}; expected an integer >= {least}")
    return value


#: CUDA's limits on grid and block dimensions (x, y, z), the same on every device since compute capability 3.0
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)


def resolve(plan: LaunchPlan, definition: Definition, axes: dict[str, int],
            max_threads_per_block: int = 1024, max_shared_bytes: int | None = None) -> list[ResolvedLaunch]:
    """The launches that run for these axis values, every expression evaluated.

    Raises:
        PlanError: a dimension that is not a positive integer or is over CUDA's limit (`MAX_GRID`,
            `MAX_BLOCK`), a block over ``max_threads_per_block``, dynamic shared memory over
            ``max_shared_bytes`` (None: not checked), a condition that does not evaluate; the message names
            the launch and the field.
    """
    out = []
    for i, launch in enumerate(plan.launches):
        where = f"launches.{i} ({launch.kernel})"
        if launch.when is not None:
            try:
                if not eval_expr(launch.when, axes):
                    continue
            except (TaskError, ArithmeticError, TypeError, ValueError) as e:
                raise PlanError(f"{where}.when: {e}") from None
        grid = [_int(x, axes, f"{where}.grid.{j}", 1) for j, x in enumerate(launch.grid)]
        block = [_int(x, axes, f"{where}.block.{j}", 1) for j, x in enumerate(launch.block)]
        grid += [1] * (3 - len(grid))
        block += [1] * (3 - len(block))
        if math.prod(block) > max_threads_per_block:
            raise PlanError(f"{where}.block: {block} is {math.prod(block)} threads, over the device's "
                            f"{max_threads_per_block} per block")
        for field, dims, limits in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK)):
            for j, (n, most) in enumerate(zip(dims, limits)):
                if n > most:
                    raise PlanError(f"{where}.{field}.{j}: {n} for axes {axes}, over CUDA's limit of {most}")
        shared = _int(launch.shared_bytes, axes, f"{where}.shared_bytes", 0)
        if max_shared_bytes is not None and shared > max_shared_bytes:
            raise PlanError(f"{where}.shared_bytes: {shared} bytes for axes {axes}, over the device's "
                            f"{max_shared_bytes} per block")
        args = tuple(launch.args) if launch.args is not None else default_args(definition)
        out.append(ResolvedLaunch(launch.kernel, tuple(grid), tuple(block), shared, args))
    return out


def temporary_shape(tmp: Temporary, name: str, axes: dict[str, int]) -> tuple[int, ...]:
    """The shape of temporary ``name`` for these axes. Raises PlanError naming the bad dimension."""
    return tuple(_int(x, axes, f"temporaries.{name}.shape.{j}", 0) for j, x in enumerate(tmp.shape))


def refused_flag(flags: list[str]) -> str | None:
    """Why one of the candidate's NVRTC options is refused, or None."""
    for flag in flags:
        if not flag.startswith(ALLOWED_FLAG_PREFIXES):
            return (f"NVRTC option {flag!r} is not allowed for candidates (allowed prefixes: "
                    f"{', '.join(ALLOWED_FLAG_PREFIXES)})")
    return None
