"""Checks of command-line values shared by several commands (typer callbacks)."""

from __future__ import annotations

import typer


def positive_seconds(value: float) -> float:
    """A duration that must be more than zero (``--timeout``). Raises typer.BadParameter."""
    if not value > 0:  # NaN too
        raise typer.BadParameter(f"must be more than 0 seconds, not {value:g}")
    return value
