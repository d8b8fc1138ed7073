"""Checks of command-line values shared by several commands (typer callbacks)."""

from __future__ import annotations

from typing import NoReturn

import typer


#: the longest duration `positive_seconds` takes (``inf`` reached thread waits and timers as an OverflowError)
MAX_SECONDS = 1e6


def positive_seconds(value: float) -> float:
    """A duration that must be more than zero and at most `MAX_SECONDS` (``--timeout``). Raises
    typer.BadParameter."""
    if not value > 0:  # NaN too
        raise typer.BadParameter(f"must be more than 0 seconds, not {value:g}")
    if value > MAX_SECONDS:
        raise typer.BadParameter(f"must be at most {MAX_SECONDS:g} seconds, not {value:g}")
    return value


#: help of ``--time-limit`` (run and resume)
TIME_LIMIT_HELP = ("Seconds of search (wall clock) after which no new evaluation starts; the final stage (hidden "
                   "workloads, side-by-side timing) still runs and is not bounded: leave it time (on a GPU with "
                   "large workloads, minutes). The run stays resumable.")


#: help of the task argument (run, eval, tasks show, tasks import)
TASK_HELP = ("Built-in task name, task folder, definition file (.json/.yaml; its workloads found beside it: "
             "<stem>.jsonl, or a flashinfer-bench dataset's workloads/<op_type>/<stem>.jsonl), or a flashinfer-bench "
             "dataset root plus a definition name, ROOT/NAME (e.g. flashinfer-trace/rmsnorm_h4096).")
#: help of ``--workloads-file``
WORKLOADS_FILE_HELP = ("A workloads file (JSONL: one Workload, or flashinfer-bench trace with a workload field, a "
                       "line) replacing the task's own workloads.")


def workload_names(value: str | None) -> list[str] | None:
    """``-w/--workloads NAMES`` as a list; None when the flag was not given (every workload). A value that names
    none (``-w ''``, ``-w ,``: a script's empty variable, most likely) is refused, not read as "all"."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        refuse(f"-w/--workloads {value!r} names no workload: give names (comma-separated), or leave the flag out "
               "for all of them")
    return names


def workloads_args(names: str | None, file: str) -> tuple[list[str] | None, str | None]:
    """(workload names, workloads file) from ``-w/--workloads`` and ``--workloads-file``: a ``--workloads`` value
    that is an existing file is taken as the workloads file (``--workloads FILE.jsonl``)."""
    from pathlib import Path

    if names and not file and Path(names).is_file():
        return None, names
    return workload_names(names), file or None


def refuse(message: str) -> NoReturn:
    """A user error found once the options are parsed (flags that contradict each other): ``error: message`` on
    one line of stderr, exit status 2, like every other user error (`ksearch.cli.main`)."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(2)


#: `LLMSettings` fields as the flags that set them
_FLAGS = {"backend": "--backend", "model": "--model", "planner_model": "--planner-model",
          "coder_model": "--coder-model", "base_url": "--base-url", "api_key_env": "--api-key-env",
          "command": "--command", "queue_dir": "--queue-dir", "context": "--context", "max_cost_usd": "--max-cost",
          "max_tokens": "--max-tokens", "timeout_s": "--llm-timeout", "prices_file": "--prices"}


def llm_settings(**values):
    """`LLMSettings` from command-line values; the first problem is refused (`refuse`), named by its flag."""
    from pydantic import ValidationError

    from ksearch.llm.settings import LLMSettings

    try:
        return LLMSettings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(_FLAGS.get(str(x), str(x)) for x in first["loc"])
        refuse(f"{where + ': ' if where else ''}{first['msg'].removeprefix('Value error, ')}")


def targets_help() -> str:
    """The targets ``--target`` takes, for help texts: each concrete one with its summary, each alias with what it
    stands for (`ksearch.targets.base`: the registry)."""
    from ksearch.targets import get_target, target_names
    from ksearch.targets.base import aliases

    alias = aliases()
    parts = []
    for name in target_names():
        if name in alias:
            parts.append(f"{name} ({' or '.join(alias[name])}, whichever this machine has)")
        else:
            parts.append(f"{name} ({get_target(name).summary})")
    return "; ".join(parts)


def suffixes_help() -> str:
    """The source file suffixes of every concrete target, for help texts (``.c/.cpp/... for cpu; ...``)."""
    from ksearch.targets import get_target, target_names
    from ksearch.targets.base import aliases

    return "; ".join(f"{'/'.join(get_target(n).source_suffixes)} for {n}" for n in target_names() if n not in aliases())


#: help of ``--workers``, ``--executor`` and ``--ray-address`` (run; resume may change them)
WORKERS_HELP = ("Evaluations at once, one worker each: on CPUs each worker owns a disjoint share of the cores, on "
                "GPUs one GPU each; a candidate is timed beside its parent and the best on one worker "
                "(docs/parallel.md).")
EXECUTOR_HELP = "Where the workers run: local (processes of this machine) or ray (a Ray cluster; pip install ray)."
RAY_ADDRESS_HELP = ("--executor ray: the cluster to join (auto: the one `ray start` runs here; ray://HOST:10001); "
                    "default: start one on this machine for the run.")


def executor_settings(workers: int, executor: str, ray_address: str) -> dict:
    """The run's executor fields from command-line values; contradictions are refused (`refuse`)."""
    if executor not in ("local", "ray"):
        refuse(f"--executor must be local or ray, not {executor!r}")
    if ray_address and executor != "ray":
        refuse("--ray-address is for --executor ray")
    return {"workers": workers, "executor": executor, "ray_address": ray_address or None}


#: help of ``--strategy`` (run, compare)
STRATEGY_HELP = ("How the next action is chosen: worldmodel (the world model's ratings, back-off and the planner's "
                 "choice), evolve (islands and a MAP-Elites archive of the kernels measured so far, in the manner of "
                 "OpenEvolve) or random (uniform over the open actions).")


def strategy_kind(name: str) -> str:
    """A ``--strategy`` value, checked (`refuse` for an unknown one)."""
    from ksearch.search.strategy import STRATEGIES

    if name not in STRATEGIES:
        refuse(f"--strategy must be one of {', '.join(STRATEGIES)}, not {name!r}")
    return name
