"""Targets compile, load and call candidates. One module per target behind the small contract in base.py."""

from ksearch.targets.base import CompileResult, Target, available_targets, get_target, resolve_target, target_names

__all__ = ["CompileResult", "Target", "available_targets", "get_target", "resolve_target", "target_names"]
