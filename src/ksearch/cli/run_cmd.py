"""``ksearch run``, ``ksearch resume``, ``ksearch runs list`` and ``ksearch show``."""

from __future__ import annotations

import json

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ksearch.cli.options import positive_seconds
from ksearch.report.summary import decision_path, summary_table, tree_view, verdict_lines
from ksearch.report.tables import wide_console
from ksearch.search.controller import RunConfig, StepReport
from ksearch.search.session import Session
from ksearch.search.strategy import StrategyConfig
from ksearch.store.runs import list_runs, open_run

err = wide_console(stderr=True)


def _drive(session: Session, as_json: bool) -> None:
    """Run the search to its end with a progress bar, then print (or emit as JSON) the summary."""
    c = session.controller
    quiet = as_json
    with Progress(TextColumn("[bold]{task.fields[phase]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), TextColumn("{task.fields[now]}"),
                  console=err, disable=quiet, transient=False) as bar:
        job = bar.add_task("search", total=session.cfg.budget, phase="search", best="—", now="")

        def progress(msg: str) -> None:
            bar.update(job, now=msg[:70])

        session.progress = progress
        session.evaluator.progress = progress
        c.progress = progress
        if not quiet:
            err.print(f"run [bold]{session.run_id}[/] · task {session.cfg.task} · target {session.cfg.target} · "
                      f"proposer {session.cfg.proposer} · budget {session.cfg.budget} · seed {session.cfg.seed}")

        def on_step(r: StepReport) -> None:
            bar.update(job, completed=c.evaluations, best=_best(c))
            if not quiet:
                score = f"{r.score:.2f}x" if r.score else r.evaluation.status.value
                note = " (same kernel as before, not re-run)" if r.reused else ""
                why = r.decision.reason.split(";")[0]
                bar.console.print(f"  [{r.seq:>3}] {r.node_id:<5} {r.label[:26]:<26} {r.node_status:<9} {score:>8}"
                                  f"{note}  [dim]{why[:60]}[/]", highlight=False)

        try:  # Ctrl-C anywhere: the naive baseline, the search or the final measurements
            c.start()
            bar.update(job, completed=c.evaluations, best=_best(c))
            c.run(on_step)
            bar.update(job, phase="final", now="measuring naive, best and reference side by side")
            summary = session.finish()
        except KeyboardInterrupt:
            session.store.set_status("interrupted")
            err.print(f"\ninterrupted after {c.evaluations} evaluations; continue with "
                      f"[bold]ksearch resume {session.run_id}[/]")
            raise typer.Exit(130) from None
        bar.update(job, now="done")
    _print_summary(session, summary, as_json)


def _best(c) -> str:
    s = c.state.best_score
    return "—" if s is None else f"{s:.2f}x ({c.state.best_node_id})"


def _print_summary(session: Session, summary: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    out = wide_console()
    out.print(summary_table(summary))
    for line in verdict_lines(summary):
        out.print(line, highlight=False)
    tree = session.controller.tree
    if summary["best_node_id"]:
        out.print("\n[bold]Path to the best kernel[/]")
        for line in decision_path(tree, summary["best_node_id"]):
            out.print("  " + line, highlight=False)
        out.print(f"\nbest kernel source: [bold]{summary['best_source']}[/]")
    else:
        out.print("[yellow]no candidate beat the naive kernel[/]")
    out.print(f"{summary['evaluations']} evaluations · run {summary['run_id']} · "
              f"`ksearch show {summary['run_id']}` for the whole tree")


def run_command(
    task: str = typer.Argument("selective-scan", help="Built-in task name, task directory or definition file."),
    target: str = typer.Option("cpu", help="Where kernels run: cpu, cuda (CUDA C++ on an NVIDIA GPU, through "
                                            "CuPy) or triton (Triton kernels on an NVIDIA GPU, through torch)."),
    budget: int = typer.Option(40, min=1, help="Candidate evaluations to spend (the naive baseline not counted)."),
    seed: int = typer.Option(0, help="Seed of the strategy's tie breaks and the correctness inputs."),
    proposer: str = typer.Option("patterns", help="Who writes edits and kernels: patterns (offline)."),
    timeout: float = typer.Option(60.0, help="Seconds one kernel call may take before it is killed.",
                                  callback=positive_seconds),
    workloads: str = typer.Option("", "--workloads", "-w", help="Comma-separated workload names (default: all)."),
    stagnation: int = typer.Option(5, min=1, help="Evaluations without a new best before backing off to "
                                                   "a competing branch."),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as one JSON object."),
) -> None:
    """Search for a faster kernel for TASK, guided by the world model; resumable with `ksearch resume`."""
    names = [n.strip() for n in workloads.split(",") if n.strip()] or None
    cfg = RunConfig(task=task, target=target, budget=budget, seed=seed, proposer=proposer, timeout_s=timeout,
                    workloads=names,
                    strategy=StrategyConfig(seed=seed, stagnation_window=stagnation))
    with Session.create(cfg) as session:
        _drive(session, as_json)


def resume_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory)."),
    budget: int | None = typer.Option(None, min=1, help="Raise the run's budget (evaluations in total)."),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as one JSON object."),
) -> None:
    """Continue an interrupted run where its last committed evaluation left off."""
    with Session.resume(run, budget=budget) as session:
        if not as_json:
            err.print(f"resuming {session.run_id} at {session.store.evaluation_count()} of {session.cfg.budget} "
                      "evaluations")
        _drive(session, as_json)


runs_app = typer.Typer(help="Runs kept under $KSEARCH_HOME/runs.", no_args_is_help=True)


@runs_app.command("list")
def runs_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List runs, newest first."""
    rows = list_runs()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table(title="Runs")
    for col in ("id", "task", "target", "status", "evaluations", "best", "updated"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        best = r.get("best_score")
        t.add_row(r["id"], r.get("task", ""), r.get("target", ""), r.get("status", ""), str(r.get("evaluations", "")),
                  "—" if best is None else f"{best:.2f}x", r.get("updated_at", ""))
    out = wide_console()
    out.print(t)
    for r in rows:
        if r.get("error"):
            out.print(f"{r['id']}: {r['error']}", highlight=False, markup=False)


def show_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory)."),
    show_open: bool = typer.Option(False, "--open", help="Also list the open (untried) actions."),
    as_json: bool = typer.Option(False, "--json", help="Print the run, its evaluations and tree as JSON."),
) -> None:
    """A run's results and its world model as text."""
    from ksearch.search.controller import load_snapshot, run_config

    store = open_run(run)
    try:
        info = store.run()
        cfg = run_config(store)
        snap = load_snapshot(store)
        tree = snap[0] if snap else None
        evals = store.evaluations()
        final = store.baseline("final")
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"run": info, "evaluations": [
            {"seq": s, "node_id": n, "candidate_id": e.candidate_id, "status": e.status.value,
             "message": e.message[:500]} for s, n, e in evals],
            "tree": json.loads(tree.model_dump_json()) if tree else None, "final": final}, indent=2))
        return
    out = wide_console()
    out.print(f"[bold]{info['id']}[/] · {info['task']} · {info['target']} · {info['status']} · "
              f"{len(evals)} of {cfg.budget} evaluations · created {info['created_at']}")
    if tree is None:
        out.print("no tree yet")
        return
    best = tree.best()
    out.print(tree_view(tree, best.id if best else None, show_open))
    if final and final.get("naive"):
        from ksearch.eval.records import Evaluation
        from ksearch.report.summary import final_summary

        summary = final_summary(info, len(evals), best.id if best else None, final.get("best_candidate_id"),
                                Evaluation.model_validate(final["naive"]),
                                Evaluation.model_validate(final["best"]) if final.get("best") else None,
                                final["reference"], final["reference_name"], None, final.get("hidden"))
        out.print(summary_table(summary))
        for line in verdict_lines(summary):
            out.print(line, highlight=False)
    failures = [(s, n, e) for s, n, e in evals if not e.status.passed]
    if failures:
        out.print(f"\n[bold]{len(failures)} failed evaluations[/]")
        for s, n, e in failures[:20]:
            out.print(f"  [{s}] {n}: {e.status.value}: {e.message.splitlines()[0][:150] if e.message else ''}",
                      highlight=False, markup=False)
