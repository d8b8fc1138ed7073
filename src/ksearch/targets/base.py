"""The target contract: compile in the parent, load and call in the worker.

``compile`` runs in the controller's process (the compiler is a subprocess with a timeout) and returns an
artifact path. ``load`` runs inside the sandboxed worker and returns a `Runner`, the one contract the worker
(`ksearch.eval.worker`) drives every target through: it says whose clock times it and takes the protocol's
requests (`ksearch.protocol`) as method calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from ksearch.errors import TargetError, UnsupportedOp
from ksearch.protocol import ArgRef, Clock, TimingPlan
from ksearch.records import Candidate
from ksearch.tasks.definition import Definition


@dataclass
class CompileResult:
    """``ok``: whether it built; ``artifact``: the built file; ``log``: compiler output; ``seconds``; ``cached``."""

    ok: bool
    artifact: Path | None
    log: str
    seconds: float
    cached: bool = False


class Target(Protocol):
    name: str

    def available(self) -> str | None:
        """None when this machine can run the target, else the reason it cannot."""

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float) -> CompileResult: ...

    def load(self, artifact: Path, candidate: Candidate, definition: Definition) -> Runner:
        """Inside the worker: the candidate's `Runner` (its arguments in definition order: inputs, outputs,
        axes)."""


#: the judge's line-by-line cache eviction of host memory, ``ksearch_evict(address, bytes)``
#: (`ksearch.targets.cpu.CpuTarget.evict_library`)
Evict = Callable[[int, int], None]


class Runner(Protocol):
    """A loaded candidate inside the worker, whatever its target: what `Target.load` returns.

    ``clock`` says who times it. ``controller``: the judge times each call from outside the worker with its own
    clock, as `prepare` (outside the timed region) then `go` (the call). ``device``: the runner times blocks of
    repeats itself with the device's events (`timed`). Every runner has `call` (one untimed call, whose outputs
    the judge checks). A method its clock does not support raises UnsupportedOp (`ControllerClockRunner`,
    `DeviceClockRunner` give those methods).

    ``evict``: the judge's eviction of host memory (`Evict`; None: none), loaded by the worker before the kernel
    (what the kernel does at load cannot reach it) and set here after `Target.load`, before any call. A runner
    on the controller's clock evicts its arguments with it in `prepare`; others may ignore it.

    ``args`` of every method: `ksearch.protocol.ArgRef` s in ABI order (inputs, outputs, axes). Outputs are
    written to the output files before a method returns (a timed block: the last timed call's).
    """

    clock: Clock
    evict: Evict | None

    def call(self, args: Sequence[ArgRef]) -> None:
        """One untimed call on ``args``."""

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        """Controller clock: make ``args`` ready for the next `go` (inputs at a new address) and, ``flush_bytes``
        > 0, evict the caches (the arguments with ``evict``, else by writing ``flush_bytes`` of a buffer)."""

    def go(self) -> None:
        """Controller clock: one call on the prepared arguments (what the judge times). Raises UnsupportedOp
        without a `prepare` since the last call."""

    def timed(self, args: Sequence[ArgRef], warmup_args: Sequence[ArgRef] | None,
              plan: TimingPlan) -> tuple[list[float], list[list[float]]]:
        """Device clock: ``plan.warmup`` calls on ``warmup_args`` (None: ``args``), then repeats on ``args`` per
        ``plan``, each timed by the device's events. Returns (times in ms, per timed call [non-finite output
        values, sum of |finite output values|], taken after the clock stopped)."""
        ...


class ControllerClockRunner:
    """Base of a runner on the controller's clock: `timed` raises UnsupportedOp."""

    clock: Clock = "controller"
    evict: Evict | None = None

    def timed(self, args: Sequence[ArgRef], warmup_args: Sequence[ArgRef] | None,
              plan: TimingPlan) -> tuple[list[float], list[list[float]]]:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the controller's clock (prepare, go), not by a "
                            "timed call")


class DeviceClockRunner:
    """Base of a runner on the device's clock: `prepare` and `go` raise UnsupportedOp."""

    clock: Clock = "device"
    evict: Evict | None = None

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the device's events (a timed call), not by "
                            "prepare and go")

    def go(self) -> None:
        raise UnsupportedOp(f"{type(self).__name__} is timed by the device's events (a timed call), not by "
                            "prepare and go")


# -- the registry: target modules found by name ------------------------------------------------------------

#: where a target module without ``ORDER`` is listed


def target_names() -> list[str]:
    """Every target name ``--target`` takes (``mlx`` resolves to mlx-metal or mlx-cuda: `resolve_target`)."""
    return ["cpu", "cuda", "triton", "mlx", "mlx-metal", "mlx-cuda"]


def resolve_target(name: str) -> str:
    """The concrete target a name stands for: ``mlx`` becomes ``mlx-metal`` or ``mlx-cuda`` for this
    machine; others are unchanged. Raises TargetError (listing the targets available here) when ``mlx`` has
    no backend."""
    if name == "mlx":
        from ksearch.targets.mlx import resolve_mlx

        return resolve_mlx(name)
    return name


def available_targets() -> list[str]:
    """The concrete targets this machine can run now (each target's ``available()`` is None)."""
    out = []
    for name in target_names():
        if name == "mlx":
            continue
        try:
            if get_target(name).available() is None:
                out.append(name)
        except Exception:  # a broken installation of one target's libraries hides only that target
            continue
    return out


def get_target(name: str) -> Target:
    """The target called ``name``. Raises TargetError naming the known targets."""
    if name == "cpu":
        from ksearch.targets.cpu import CpuTarget

        return CpuTarget()
    if name == "cuda":
        from ksearch.targets.cuda import CudaTarget

        return CudaTarget()
    if name == "triton":
        from ksearch.targets.triton import TritonTarget

        return TritonTarget()
    if name in ("mlx-metal", "mlx-cuda"):
        from ksearch.targets.mlx import MlxTarget

        return MlxTarget(name)
    if name == "mlx":
        return get_target(resolve_target(name))
    raise TargetError(f"unknown target {name!r}; known: {', '.join(target_names())}")
