"""Checks of command-line values shared by several commands (typer callbacks)."""

from __future__ import annotations

import typer


def positive_seconds(value: float) -> float:
    """A duration that must be more than zero (``--timeout``). Raises typer.BadParameter."""
    if not value > 0:  # NaN too
        raise typer.BadParameter(f"must be more than 0 seconds, not {value:g}")
    return value


def llm_settings(**values):
    """`LLMSettings` from command-line values. Raises typer.BadParameter with the first problem."""
    from pydantic import ValidationError

    from ksearch.llm.settings import LLMSettings

    try:
        return LLMSettings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise typer.BadParameter(f"{where + ': ' if where else ''}{first['msg'].removeprefix('Value error, ')}") from None
