"""The target contract: compile in the parent, load and call in the worker.

``compile`` runs in the controller's process (the compiler is a subprocess with a timeout) and returns an
artifact path. ``load`` runs inside the sandboxed worker and returns a callable taking the task's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ksearch.errors import TargetError
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

    def load(self, artifact: Path, candidate: Candidate, definition: Definition) -> Callable[..., None]:
        """Inside the worker: a function called as f(inputs..., outputs..., axes...) in definition order."""


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
