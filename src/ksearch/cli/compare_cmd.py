"""``ksearch compare``: strategies at an equal budget, each over repeats (`ksearch.run.compare`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.markup import escape

from ksearch.cli.ablate_cmd import err, run_runs, unfinished_exit
from ksearch.cli.options import TIME_LIMIT_HELP, positive_seconds, refuse, targets_help, workload_names
from ksearch.errors import SearchError
from ksearch.report.compare import compare_table, curve_table
from ksearch.report.tables import wide_console
from ksearch.run import ablate, compare
from ksearch.run.controller import RunConfig
from ksearch.search.strategy import StrategyConfig
from ksearch.targets import resolve_target
from ksearch.tasks import builtin_names, load_task


def compare_command(
    task: str = typer.Argument(None, help="Built-in task name, task directory or definition file (not with "
                                          "--resume)."),
    strategies: str = typer.Option("worldmodel,evolve,random", help="Strategies, comma-separated (worldmodel, "
                                                                    "evolve, random: see `ksearch run --strategy`)."),
    budget: int = typer.Option(40, min=1, help="Candidate evaluations per run."),
    repeats: int = typer.Option(3, min=1, help="Runs per strategy; repeat r has seed SEED + r - 1."),
    target: str = typer.Option("cpu", help=f"Where kernels run: {targets_help()}."),
    workloads: str | None = typer.Option(None, "--workloads", "-w",
                                         help="Comma-separated workload names (default: all)."),
    seed: int = typer.Option(0, help="Seed of the first repeat (strategy draws, correctness inputs)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed.",
                                  callback=positive_seconds),
    stagnation: int = typer.Option(5, min=1, help="worldmodel: evaluations without a new best before backing off."),
    time_limit: float | None = typer.Option(None, "--time-limit", min=1.0, help="Per run: " + TIME_LIMIT_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Runs at once (each in its own process)."),
    name: str = typer.Option("", help="The comparison's id (default: <task>-compare-<date>-<hex>); an existing one "
                                      "with the same settings is resumed."),
    resume: str = typer.Option("", help="Resume comparison ID: unfinished runs are resumed, finished ones kept."),
    output: Path | None = typer.Option(None, "--output", "-o", help="The results' Markdown file (a .json and the "
                                                                    "curves' .png beside it); default: under the "
                                                                    "comparison's directory."),
) -> None:
    """The same search with each strategy, REPEATS times (the offline patterns proposer: no model needed); at
    the end every run's best kernel re-timed beside the naive kernel in one judge session, a table per strategy,
    the best-so-far curves and the evaluations each run took to reach 95% of the best any run found."""
    if resume:
        if task is not None:
            refuse("--resume takes the saved task and settings: give no TASK")
        ab = ablate.load(resume)
        if not ab.variants:
            refuse(f"{ab.id} is a context ablation: resume it with `ksearch ablate --resume {ab.id}`")
    else:
        if task is None:
            refuse("give TASK (or --resume ID)")
        try:
            kinds = compare.parse_strategies(strategies)
        except SearchError as e:
            refuse(str(e))
        names = workload_names(workloads)
        load_task(task).select(names)  # a bad task or workload now, not in every run
        path = task if task in builtin_names() else str(Path(task).resolve())
        cfg = RunConfig(task=path, target=resolve_target(target), budget=budget, seed=seed, proposer="patterns",
                        timeout_s=timeout, workloads=names,
                        strategy=StrategyConfig(seed=seed, stagnation_window=stagnation))
        cmdline = "ksearch " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] \
            else "ksearch compare " + shlex.quote(task)
        ab = compare.new_comparison(cfg, kinds, repeats, name or None, command=cmdline)
        if name and ablate.exists(name):
            old = ablate.load(name)
            if old.variants != ab.variants:
                refuse(f"comparison {name} exists with other settings: resume it with --resume {name}, or give "
                       "another --name")
            ab = old
    held = ablate.lock(ab.id)
    try:
        again = f"ksearch compare --resume {ab.id}"
        todo = run_runs(ab, jobs, time_limit, again)
        result = compare.stored(ab) if not todo else None
        if result is None:
            try:
                with err.status("re-timing every run's best kernel beside the naive kernel", spinner="dots") as st:
                    result = compare.compare_results(ab, lambda m: st.update(escape(m[:100])))
            except SearchError as e:  # the naive kernel failed the re-time's check: the runs are kept
                refuse(f"{e}; the runs are kept: `{again}` re-times them")
        md, js, png = compare.write(ab, result, output)
    finally:
        held.close()
    out = wide_console()
    out.print(compare_table(result))
    out.print(curve_table(result))
    out.print(f"results: {md}, {js.name}" + (f" and {png.name}" if png else " (no curve image: pip install "
                                                                             "matplotlib)"), highlight=False)
    unfinished_exit(result.table, again)
