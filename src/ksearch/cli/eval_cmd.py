"""``ksearch eval TASK KERNEL``: judge one kernel file against a task's reference and its naive kernel."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import typer
from rich.console import Console

from ksearch.errors import TaskError
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.eval.records import Candidate
from ksearch.report.tables import ceilings_lines, evaluation_json, evaluation_table, wide_console
from ksearch.tasks import load_task

console = Console(stderr=True)


def eval_command(
    task: str = typer.Argument(..., help="Built-in task name, task directory or definition file."),
    kernel: Path = typer.Argument(..., help="Kernel source file (.c/.cpp for the cpu target)."),
    target: str = typer.Option("cpu", help="Target that compiles and runs the kernel."),
    workloads: str = typer.Option("", "--workloads", "-w", help="Comma-separated workload names (default: all)."),
    seeds: int = typer.Option(3, min=1, help="Correctness checks per workload, each on fresh random inputs."),
    seed: int | None = typer.Option(None, help="Base seed for the inputs (default: fresh random)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed."),
    entry: str = typer.Option("run", help="Name of the kernel's entry-point function."),
    flags: str = typer.Option("", help="Extra compile flags, space-separated (e.g. '-ffast-math')."),
    naive: bool = typer.Option(True, help="Also time the task's naive kernel, for speedups."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """Compile KERNEL, check it against TASK's reference on every workload, time it, compare with the naive kernel."""
    t = load_task(task)
    try:
        source = kernel.read_text()
    except OSError as e:
        raise TaskError(f"cannot read kernel file {kernel}: {e.strerror}") from None
    names = [n.strip() for n in workloads.split(",") if n.strip()] or None
    selected = t.select(names)
    from ksearch.hardware.cache import load_or_measure

    if not as_json:
        console.print("[dim]hardware: loading the cached spec (first use measures the ceilings, ~10 s)…[/]")
    hardware = load_or_measure()
    base = secrets.randbits(62) if seed is None else seed
    cfg = EvalConfig(timeout_s=timeout, seeds=[base + i for i in range(seeds)])
    with console.status("starting", spinner="dots") as status:
        def progress(msg: str) -> None:
            if not as_json:
                status.update(msg)

        ev_ = Evaluator(t, target, hardware, cfg, progress)
        naive_ev = None
        if naive and target in t.naive_sources:
            naive_ev = ev_.measure_naive(selected)
        candidate = Candidate(target=target, sources={kernel.name: source}, entry_point=entry,
                              compile_flags=flags.split())
        result = ev_.evaluate(candidate, names)
    if as_json:
        typer.echo(json.dumps(evaluation_json(result, hardware), indent=2))
    else:
        out = wide_console()
        out.print(evaluation_table(result, title=f"{t.name} · {kernel.name} · {target}"))
        if result.message and not result.status.passed:
            out.print(f"[bold red]{result.status.value}[/]: {result.message}", markup=True, highlight=False)
        if naive_ev is not None and not naive_ev.status.passed:
            out.print(f"[yellow]naive kernel: {naive_ev.status.value}: {naive_ev.message}[/]")
        for line in ceilings_lines(hardware):
            out.print(line, highlight=False)
    if not result.status.passed:
        raise typer.Exit(1)
