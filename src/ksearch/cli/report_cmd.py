"""``ksearch report RUN [-o report.html] [--open] [--live]``: a run, a comparison or an ablation as one
self-contained HTML file (`ksearch.report.html`)."""

from __future__ import annotations

import time
import webbrowser
from pathlib import Path

import typer

from ksearch.errors import StoreError
from ksearch.report.html import render_group, render_run, write_html


def report_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory), or the id of a "
                              "`ksearch compare` or `ksearch ablate` result (their runs' curves side by side)."),
    out: Path = typer.Option(None, "-o", "--output", help="The HTML file to write (default: report.html in the "
                             "run's directory, or the comparison's / ablation's)."),
    open_it: bool = typer.Option(False, "--open", help="Open the file in the default web browser."),
    live: bool = typer.Option(False, "--live", help="Watch a run in progress: re-write the file whenever an "
                              "evaluation is committed or the run's status changes (the page reloads itself every "
                              "--every seconds) until the run stops or Ctrl-C."),
    every: float = typer.Option(5.0, "--every", min=1.0, max=86400.0, help="With --live: seconds between looks at the run "
                                "(and between the page's reloads)."),
) -> None:
    """A run's search as one HTML page, viewable offline: best-so-far curves, the world model's tree (click a
    node: its action, kernel, diff, timings, the judge's and the llm's words), roofline per workload, the final
    table."""
    from ksearch.store.runs import open_run

    try:
        store = open_run(run, readonly=True)
    except StoreError as run_error:
        if live:
            _not_a_group(run)
            raise
        path = _group(run, out, run_error)
    else:
        try:
            run_id = store.run()["id"]
            path = Path(out) if out is not None else store.path.parent / "report.html"
            write_html(path, render_run(store, live_s=every if live else None))
        finally:
            store.close()
        typer.echo(f"wrote {path} (run {run_id})")
        if live:
            if open_it:
                webbrowser.open(path.resolve().as_uri())
                open_it = False
            _watch(run, path, every)
    if open_it:
        webbrowser.open(path.resolve().as_uri())


def _state(run: str) -> tuple[int, str, bool]:
    """(evaluations, status, whether a process works on it) of the run now."""
    from ksearch.store.runs import _locked, open_run  # the lock `ksearch runs list` reads too

    store = open_run(run, readonly=True)
    try:
        return store.evaluation_count(), store.run()["status"], _locked(store.path.parent)
    finally:
        store.close()


def _watch(run: str, path: Path, every: float) -> None:
    """Re-render whenever the run's evaluations or status change; a last plain render (no reloading) when it
    stops (no process holds it any more) or on Ctrl-C."""
    from ksearch.store.runs import open_run

    seen = _state(run)
    try:
        while seen[2]:
            time.sleep(every)
            now = _state(run)
            if now[:2] != seen[:2]:
                _render(open_run(run, readonly=True), path, every)
                typer.echo(f"  {now[0]} evaluations, {now[1]}: wrote {path}", err=True)
            seen = now
    except KeyboardInterrupt:
        pass
    _render(open_run(run, readonly=True), path, None)
    status = "stopped" if seen[1] == "running" and not seen[2] else seen[1]  # killed, or its directory removed
    typer.echo(f"the run is {status}: wrote {path} (no longer reloading)")


def _render(store, path: Path, live_s: float | None) -> None:
    try:
        write_html(path, render_run(store, live_s=live_s))
    finally:
        store.close()


def _not_a_group(ident: str) -> None:
    """With --live: a comparison's or an ablation's id is refused saying so (its runs are watched one by one), not
    as "no run"."""
    from ksearch.run.ablate import load

    try:
        ab = load(ident)
    except StoreError:
        return
    kind = "comparison" if ab.variants else "ablation"
    raise StoreError(f"{ident} is a {kind}: --live watches one run (`ksearch report {ident}` draws the {kind}'s runs "
                     "side by side; `ksearch runs list` lists the runs, each watched with --live)")


def _group(ident: str, out: Path | None, run_error: StoreError) -> Path:
    """A comparison's or an ablation's page. Raises the run's StoreError when ``ident`` is neither."""
    from ksearch.run.ablate import ablation_dir, exists, load, refresh
    from ksearch.run.ablate_results import stored_results
    from ksearch.run.compare import stored

    if not exists(ident):
        try:
            ab = load(ident)
        except StoreError:
            raise run_error from None
    else:
        ab = load(ident)
    refresh(ab)
    kind = "comparison" if ab.variants else "ablation"
    bands = {}
    if ab.variants:
        kept = stored(ab)
        result = kept.table if kept is not None else None
        bands = {x.strategy: (x.curve_median, x.curve_min, x.curve_max) for x in (kept.summaries if kept else [])
                 if x.curve_median}
    else:
        result = stored_results(ab)
    groups = {x: x.rsplit("-", 1)[0] for x in ab.variants} if ab.variants else {}
    runs = [(r.label, groups.get(r.label, r.label), r.run_id) for r in ab.runs if r.run_id is not None]
    if not runs:
        raise StoreError(f"{kind} {ab.id} has no run started yet: nothing to draw")
    notes = [] if result is not None else [f"no current results table: `ksearch {'compare' if ab.variants else 'ablate'}"
                                           f" --resume {ab.id}` re-times the runs' best kernels and writes it"]
    notes += [f"{r.label}: not started ({r.error or r.status})" for r in ab.runs if r.run_id is None]
    path = Path(out) if out is not None else ablation_dir(ab.id) / "report.html"
    write_html(path, render_group(f"{kind} {ab.id}: {ab.task} on {ab.config.target}", runs, result, notes, bands))
    typer.echo(f"wrote {path} ({kind} {ab.id}, {len(runs)} runs)")
    return path
