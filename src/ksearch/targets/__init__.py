"""Targets compile, load and call candidates. One module per target behind the small contract in base.py."""

from ksearch.targets.base import CompileResult, Target, get_target, target_names

__all__ = ["CompileResult", "Target", "get_target", "target_names"]
