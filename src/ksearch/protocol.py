"""Messages between the controller and a worker: one JSON object per line, typed on both ends.

Every request carries an ``id`` (random, set by `ksearch.jail.sandbox.Worker.request`); its reply echoes it.
The worker validates each line into a `Request` (a malformed one, or an unknown ``op``, gets an `ErrorReply` and
the worker reads on); the controller validates each reply as the request's `Request.expects` or an `ErrorReply`
(a reply of another shape, or with another ``id``, is a protocol violation: something in the worker wrote to the
reply stream). The worker writes its replies as plain objects through the ``json.dumps`` it bound before the
kernel loaded, so no class a kernel in its process could patch takes part in a reply.

Requests (controller -> worker), by ``op``:

- `PingRequest` ``{"op": "ping"}`` -> `PingReply` (``worker_ms`` of an empty native call): sent before the kernel
  loads, so the controller learns the round-trip cost of a call it times with its own clock (see ``go``);
- `LoadRequest` ``{"op": "load", "target", "artifact", "evict": path | null, "candidate", "definition"}`` ->
  `LoadReply` (``pid``, ``sandbox``: what the sandbox enforced, ``evict``: the eviction library is in use,
  ``clock``: whose clock times the runner, `Clock`); ``evict``: the judge's cache-eviction library
  (`ksearch.targets.cpu.CpuTarget.evict_library`), loaded before the kernel;
- `CallRequest` ``{"op": "call", "args": [ArgRef...], "timing": TimingPlan | null, "warmup_args": [ArgRef...] |
  null}``: untimed (``timing`` null) -> `OkReply`; or, for a runner on the device clock, a block of repeats timed
  by the device's own events (warm-up on ``warmup_args``) -> `TimedReply` (``times_ms``, ``sums``);
- `PrepareRequest` ``{"op": "prepare", "args": [ArgRef...], "flush_bytes": N}`` -> `OkReply`: map these inputs
  (at a new address) and outputs for the next ``go``, then, N > 0, evict them from every cache level line by line
  (the eviction library), or without that library write N bytes of a buffer (evicting the caches of the core the
  worker runs on);
- `GoRequest` ``{"op": "go"}`` -> `GoReply`: call the kernel once on the prepared arguments and reply at once with
  ``worker_ms``, the worker's own reading of the call. The controller times the request with its own clock; the
  worker's reading is only checked against it (a kernel in the worker's address space can forge the worker's
  clock, not the controller's).

``prepare`` and ``go`` are for runners on the controller's clock (the cpu target), a timed ``call`` for runners
on the device's (`ksearch.targets.base.Runner`). Arguments are `ArgRef` s in ABI order (inputs, outputs, axes).
Any request can fail: `ErrorReply` (``error``; ``status`` COMPILE_ERROR or REJECTED where the runner gave that
verdict; ``sandbox`` on a failed load).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ksearch.records import Candidate

#: whose clock times a runner's calls: ``controller`` (the judge times ``prepare`` then ``go`` from outside the
#: worker: the cpu target) or ``device`` (the runner times blocks of repeats with the device's events)
Clock = Literal["controller", "device"]


class _Message(BaseModel):
    """A message on the wire: unknown fields refused (a typo is an error, not a silent default); non-finite floats
    written as ``json.dumps`` writes them (``NaN``, ``Infinity``). Validators are built at first use (the worker
    never builds the reply types: a shorter start)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants", defer_build=True)


# -- arguments ---------------------------------------------------------------------------------------


class ArrayRef(_Message):
    """An array argument: a file of ``shape`` elements of ``dtype`` (a NumPy dtype string such as ``"<f4"``),
    row-major, no header. Inputs (``writable`` false) are the controller's files, mapped read-only; outputs
    (``writable`` true) are files the worker may write and the controller reads back and compares."""

    kind: Literal["array"] = "array"
    path: str
    dtype: str
    shape: tuple[int, ...]
    writable: bool = False

    @property
    def size(self) -> int:
        """Elements (the product of ``shape``; 1 for a 0-d array)."""
        n = 1
        for s in self.shape:
            n *= s
        return n


class ScalarRef(_Message):
    """A scalar argument: a Python-scalar input or an axis value, by value."""

    kind: Literal["scalar"] = "scalar"
    value: bool | int | float


#: one argument of a call, told apart by ``kind``
ArgRef = Annotated[Union[ArrayRef, ScalarRef], Field(discriminator="kind")]


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


# -- replies -----------------------------------------------------------------------------------------


class Reply(_Message):
    """What every reply has: ``id`` (the request's) and ``ok``."""

    id: str | None = None
    ok: bool


class ErrorReply(Reply):
    """A request that failed: ``error`` (what happened), ``status`` (COMPILE_ERROR or REJECTED where the runner
    gave that verdict: a late compile failed, a defense caught the kernel; absent: an infrastructure or runtime
    error, the controller decides), ``sandbox`` (a failed load's report of what the sandbox enforced)."""

    ok: Literal[False] = False
    error: str
    status: Literal["COMPILE_ERROR", "REJECTED"] | None = None
    sandbox: dict[str, Any] | None = None


class OkReply(Reply):
    """A request done, nothing to report (``prepare``, an untimed ``call``)."""

    ok: Literal[True] = True


class PingReply(OkReply):
    """``worker_ms``: the worker's own reading of an empty native call, in ms."""

    worker_ms: float


class GoReply(OkReply):
    """``worker_ms``: the worker's own reading of the call, in ms (only a cross-check: `GoRequest`)."""

    worker_ms: float


class LoadReply(OkReply):
    """The kernel is loaded: ``pid`` (the worker's, in its PID namespace), ``sandbox`` (what the sandbox
    enforced: `ksearch.jail.jail.enter`'s report), ``evict`` (the eviction library is in use), ``clock`` (whose
    clock times the runner)."""

    pid: int
    sandbox: dict[str, Any]
    evict: bool
    clock: Clock

    @property
    def device(self) -> bool:
        """Whether the runner times blocks of repeats with device events (a timed `CallRequest`)."""
        return self.clock == "device"


class TimedReply(OkReply):
    """A timed block (a `CallRequest` with a plan): ``times_ms`` per timed call in ms, and ``sums`` per timed call
    ([non-finite output values, sum of |finite output values|], taken after the clock stopped)."""

    times_ms: list[float]
    sums: list[list[float]]


# -- requests ----------------------------------------------------------------------------------------

ReplyT = TypeVar("ReplyT", bound=Reply)


class Request(_Message, Generic[ReplyT]):
    """What every request has: ``op`` (its kind) and ``id`` (random; the reply echoes it). ``ReplyT``: its successful
    reply's type (`expects`)."""

    op: str
    id: str | None = None

    def expects(self) -> type[Reply]:
        """The type of this request's successful reply."""
        return OkReply


class PingRequest(Request[PingReply]):
    """The round trip of an empty call, before the kernel loads (see the module docstring)."""

    op: Literal["ping"] = "ping"

    def expects(self) -> type[Reply]:
        return PingReply


class LoadRequest(Request[LoadReply]):
    """Load ``artifact`` (built by target ``target`` for ``candidate``) for ``definition`` (a
    `ksearch.tasks.definition.Definition` as JSON: validated by the worker, whose package sits above this one).
    ``evict``: the path of the judge's eviction library, loaded before the kernel (None: none)."""

    op: Literal["load"] = "load"
    target: str
    artifact: str
    evict: str | None = None
    candidate: Candidate
    definition: dict[str, Any]

    def expects(self) -> type[Reply]:
        return LoadReply


class CallRequest(Request[Union[OkReply, TimedReply]]):
    """One call on ``args``: untimed (``timing`` None), or a block of repeats timed by the device's events per the
    plan, warmed up on ``warmup_args`` (None: ``args``)."""

    op: Literal["call"] = "call"
    args: list[ArgRef]
    timing: TimingPlan | None = None
    warmup_args: list[ArgRef] | None = None

    def expects(self) -> type[Reply]:
        return OkReply if self.timing is None else TimedReply


class PrepareRequest(Request[OkReply]):
    """Map ``args`` for the next `GoRequest` and, ``flush_bytes`` > 0, evict the caches (see the module
    docstring)."""

    op: Literal["prepare"] = "prepare"
    args: list[ArgRef]
    flush_bytes: int = Field(default=0, ge=0)


class GoRequest(Request[GoReply]):
    """One call on the prepared arguments, timed by the controller."""

    op: Literal["go"] = "go"

    def expects(self) -> type[Reply]:
        return GoReply


#: any request, told apart by ``op``
AnyRequest = Annotated[Union[PingRequest, LoadRequest, CallRequest, PrepareRequest, GoRequest],
                       Field(discriminator="op")]
#: the ops a worker answers
OPS = ("ping", "load", "call", "prepare", "go")
REQUEST: TypeAdapter[Any] = TypeAdapter(AnyRequest)


@lru_cache(maxsize=None)
def reply_adapter(expected: type[Reply]) -> TypeAdapter[Any]:
    """Validates a reply line as ``expected`` (``ok`` true) or an `ErrorReply` (``ok`` false)."""
    form: Any = Annotated[Union[expected, ErrorReply], Field(discriminator="ok")]  # a type made at run time
    return TypeAdapter(form)


def describe(e: ValidationError, limit: int = 4) -> str:
    """A validation error in one line: each bad field's location and message (the first ``limit``)."""
    errs = e.errors(include_url=False)
    parts = [f"{'.'.join(str(x) for x in err['loc']) or 'message'}: {err['msg']}" for err in errs[:limit]]
    return "; ".join(parts) + (f" (and {len(errs) - limit} more)" if len(errs) > limit else "")
