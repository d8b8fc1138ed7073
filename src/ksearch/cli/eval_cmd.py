"""``ksearch eval TASK KERNEL``: judge one kernel file against a task's reference and its naive kernel."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ksearch.cli import signals
from ksearch.cli.options import TASK_HELP, WORKLOADS_FILE_HELP, positive_seconds, workloads_args
from ksearch.errors import TargetError, TaskError
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import Candidate
from ksearch.jail.sandbox import Policy
from ksearch.eval.timing import Reference
from ksearch.llm.untrusted import clean
from ksearch.report.tables import ceilings_lines, evaluation_json, evaluation_table, wide_console
from ksearch.cli.options import suffixes_help, targets_help
from ksearch.targets import get_target, resolve_target
from ksearch.tasks import load_task, validate

console = Console(stderr=True)


def eval_command(
    task: str = typer.Argument(..., help=TASK_HELP),
    kernel: Path = typer.Argument(..., help=f"Kernel source file ({suffixes_help()}), or a candidate JSON (`ksearch "
                                  "knowledge render -o`, a run's best/candidate.json: its sources, entry point, flags "
                                  "and launch plan as they are), or a directory holding one (a run's best/ or the "
                                  "run directory itself: the kernel the run judged)."),
    target: str = typer.Option("cpu", help=f"Target that compiles and runs the kernel: {targets_help()}."),
    workloads: str | None = typer.Option(None, "--workloads", "-w",
                                         help="Comma-separated workload names (default: all), "
                                              "or a workloads file (as --workloads-file)."),
    workloads_file: str = typer.Option("", "--workloads-file", help=WORKLOADS_FILE_HELP),
    seeds: int = typer.Option(3, min=1, help="Correctness checks per workload, each on fresh random inputs."),
    seed: int | None = typer.Option(None, min=0, help="Base seed for the inputs (default: fresh random)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed.",
                                  callback=positive_seconds),
    reference_timeout: float | None = typer.Option(
        None, "--reference-timeout", callback=lambda v: v if v is None else positive_seconds(v),
        help="Seconds one call of the task's own code (its reference, input generator or check) may take; past it "
             "the task is at fault (exit 2). Default: 5 x --timeout, at least 60."),
    entry: str = typer.Option("run", help="Name of the kernel's entry-point function."),
    flags: str = typer.Option("", help="Extra compile flags, space-separated (e.g. '-ffast-math')."),
    naive: bool = typer.Option(True, help="Also time the task's naive kernel, for speedups."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    launch: Path | None = typer.Option(None, help="Launch plan (YAML/JSON) for GPU targets; default: "
                                       "<kernel without extension>.launch.yaml beside KERNEL (docs/cuda-target.md)."),
    namespaces: str = typer.Option("auto", help="Sandbox namespaces: auto | no-user | off (off: the documented "
                                   "fallback when CUDA does not initialise inside the jail)."),
) -> None:
    """Compile KERNEL, check it against TASK's reference on every workload, time it, compare with the naive kernel."""
    names, wfile = workloads_args(workloads, workloads_file)
    t = load_task(task, workloads=wfile)
    kernel = _candidate_in(kernel)
    # a regular file of bounded size only: a FIFO would block, /dev/zero never ends (`ksearch.tasks.validate`)
    given = None
    if kernel.suffix == ".json":  # a whole candidate: sources, entry point, flags and launch plan
        given = validate.read_candidate(kernel)
    else:
        source = validate.read_text(kernel, "kernel file")
    for w in t.select(names):  # an unknown workload name is refused here, before anything is built; so is one
        validate.check_fits_memory(t.definition, w, t.definition.axis_values(w))  # whose arrays cannot fit
    target = resolve_target(target)
    if given is not None and given.target != target:
        raise TaskError(f"{kernel} is a candidate for target {given.target!r}, not {target!r}: "
                        f"pass --target {given.target}")
    t_ = get_target(target)
    why = t_.available()  # what is missing (a compiler, torch, triton, cupy, a device) before anything runs
    if why:
        raise TargetError(f"target {target!r} is not available here: {why}")
    from ksearch.targets import base

    if not as_json:
        console.print("[dim]hardware: loading the cached spec (first use measures the ceilings, ~10 s)…[/]")
    hardware = base.spec_for_target(target)
    plan = _launch_plan(kernel, launch, target) if t_.takes_launch and given is None else {}
    if namespaces not in ("auto", "no-user", "off"):
        raise TaskError(f"--namespaces must be auto, no-user or off, not {namespaces!r}")
    base = secrets.randbits(62) if seed is None else seed
    cfg = EvalConfig(timeout_s=timeout, seeds=[base + i for i in range(seeds)],
                     sandbox=Policy(namespaces=namespaces), reference_timeout_s=reference_timeout)
    try:
        with console.status("starting", spinner="dots") as status:
            def progress(msg: str) -> None:
                if not as_json:
                    status.update(msg)

            ev_ = Evaluator(t, target, hardware, cfg, progress)
            # the naive kernel is timed beside the candidate (paired rounds), its outputs checked on every timed
            # call there: no check of it alone first (that ran it on every workload and seed once more; a naive
            # kernel that fails is dropped from the rounds, and said so below)
            refs = [Reference("naive", ev_.naive_candidate())] if naive and t_.naive_candidate(t) is not None else []
            candidate = given or Candidate(target=target, sources={kernel.name: source}, entry_point=entry,
                                           compile_flags=flags.split(), launch=plan)
            if given is None:
                validate.check_candidate(candidate, str(kernel))
                _warn_if_not_the_judged_kernel(kernel, candidate, task)
            result = ev_.evaluate(candidate, names, references=refs)
    except KeyboardInterrupt:
        console.print("interrupted: the evaluation was stopped and its worker killed; nothing was saved")
        raise typer.Exit(signals.interrupt_status()) from None
    if as_json:
        typer.echo(json.dumps(evaluation_json(result, hardware), indent=2))
    else:
        out = wide_console()
        out.print(evaluation_table(result, title=f"{t.name} · {kernel.name} · {target}"))
        if result.message and not result.status.passed:  # the kernel's own text may be in it: no markup, no escapes
            out.print(f"[bold red]{result.status.value}[/]: {escape(clean(result.message))}", highlight=False)
        for p in result.paired:
            if p.role == "naive" and p.ratio is None and p.note and result.status.passed:
                out.print(f"[yellow]naive kernel: not timed beside it: {escape(clean(p.note))}[/]", highlight=False)
        for fault in result.infra_faults:
            out.print(f"[yellow]{escape(fault)}[/]", highlight=False)
        for line in ceilings_lines(hardware):
            out.print(line, highlight=False)
    if not result.status.passed:
        raise typer.Exit(1)


def _launch_plan(kernel: Path, launch: Path | None, target: str = "cuda") -> dict:
    """The launch plan for a kernel file of a target that takes one: ``launch``, else ``<kernel stem>.launch.yaml``
    beside it, else {} (the target then reports the missing plan). Raises TaskError for an unreadable or
    malformed file (naming the plan's keys: `Target.launch_keys`)."""

    path = launch or kernel.with_name(kernel.name.rsplit(".", 1)[0] + ".launch.yaml")
    if launch is None and not path.is_file():
        return {}
    data = validate.parse_mapping(validate.read_text(path, "launch plan"), f"launch plan {path}", as_json=False)
    if not isinstance(data, dict):
        raise TaskError(f"launch plan {path} must hold one mapping ({get_target(target).launch_keys})")
    return data


def _candidate_in(kernel: Path) -> Path:
    """The file to judge for KERNEL: itself, or for a directory its ``candidate.json`` (a run's ``best/``) or
    ``best/candidate.json`` (a run directory). Raises TaskError for a directory holding neither."""
    if not kernel.is_dir():
        return kernel
    for path in (kernel / "candidate.json", kernel / "best" / "candidate.json"):
        if path.is_file():
            return path
    raise TaskError(f"{kernel} is a directory without a candidate.json (nor best/candidate.json): give a kernel "
                    "source file or a candidate JSON")


def _warn_if_not_the_judged_kernel(kernel: Path, candidate: Candidate, task: str) -> None:
    """Warn (stderr) when KERNEL sits beside a candidate.json that holds it (a run's best/) but builds or launches
    it differently (compile flags, entry point, launch plan, other sources): this evaluation then judges another
    kernel than the one the candidate.json records; that one is judged by ``ksearch eval TASK candidate.json``."""
    beside = kernel.with_name("candidate.json")
    if not beside.is_file():
        return
    try:
        recorded = Candidate.model_validate_json(beside.read_text())
    except (OSError, ValueError):
        return  # not a candidate: nothing to compare with
    if kernel.name not in recorded.sources or recorded.id == candidate.id:
        return
    what = [f"{name} {theirs!r} (here {ours!r})" for name, theirs, ours in (
        ("compile flags", recorded.compile_flags, candidate.compile_flags),
        ("entry point", recorded.entry_point, candidate.entry_point),
        ("launch plan", recorded.launch, candidate.launch)) if theirs != ours]
    if recorded.sources != candidate.sources:
        what.append(f"sources {sorted(recorded.sources)} (here {sorted(candidate.sources)})")
    console.print(f"[yellow]warning: {escape(str(kernel))} sits beside {escape(str(beside))}, which judges it with "
                  f"{escape('; '.join(what))}: this is not the same kernel. To judge that one: "
                  f"[bold]ksearch eval {escape(task)} {escape(str(beside))} --target {recorded.target}[/][/]",
                  highlight=False)
