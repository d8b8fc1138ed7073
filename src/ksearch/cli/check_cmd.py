"""``ksearch runs check RUN [--repair]``: is a run's store intact (SQLite's integrity check, every row a resume
reads decodes), and its rebuild from what is (`ksearch.store.check`)."""

from __future__ import annotations

import json
import shlex

import typer

from ksearch.errors import StoreError
from ksearch.report.tables import wide_console


def check_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory)."),
    repair: bool = typer.Option(False, "--repair", help="Rebuild a damaged store from every row that still reads "
                                "and decodes (the damaged file is kept beside it as run.sqlite.damaged-<time>); "
                                "a resume then goes on from the newest intact snapshot, reusing the evaluations "
                                "committed after it."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check a run's store; exit 0 when it is intact (or was repaired), 1 when it is damaged (and not repaired)."""
    from ksearch.store.check import CheckReport, check, repair as rebuild
    from ksearch.store.runs import find_run

    path = find_run(run)
    unreadable = None
    try:
        found = check(path)
    except StoreError as e:  # not an SQLite file any more (truncated, overwritten from the start): damaged too
        found, unreadable = CheckReport(path, problems=[str(e)]), str(e)
    fixed = aside = None
    if not found.ok and repair and unreadable is None:
        fixed, aside = rebuild(path)
    final = fixed or found
    again = shlex.quote(run)  # the run as given: a path outside KSEARCH_HOME is not found by its directory's name
    if as_json:
        typer.echo(json.dumps({"run": path.parent.name, "path": str(path), "ok": found.ok, "problems": found.problems,
                               "repaired": fixed is not None, "damaged_copy": str(aside) if aside else None,
                               "rows": final.rows, "newest_snapshot": final.newest_snapshot}, indent=2))
    else:
        out = wide_console(soft_wrap=True)  # paths and commands whole on one line each, to copy
        name = path.parent.name
        if found.ok:
            out.print(f"run {name}: intact ({_rows(found)})", highlight=False, markup=False)
        else:
            out.print(f"run {name}: damaged", highlight=False, markup=False)
            for line in found.problems:
                out.print(f"  {line}", highlight=False, markup=False)
            if unreadable is not None:
                out.print("SQLite does not open it: --repair cannot rebuild it (a backup of the run's directory can "
                          "be checked the same way: `ksearch runs check DIR`)", highlight=False, markup=False)
            elif fixed is None:
                out.print(f"`ksearch runs check {again} --repair` rebuilds it from what is intact",
                          highlight=False, markup=False)
            else:
                out.print(f"repaired: {_rows(fixed)}; the damaged file is kept as {aside}; `ksearch resume {again}` "
                          f"goes on from snapshot {fixed.newest_snapshot}", highlight=False, markup=False)
    if not final.ok:
        raise typer.Exit(1)


def _rows(report) -> str:
    r = report.rows
    return (f"{r.get('evaluations', 0)} evaluations, {r.get('candidates', 0)} candidates, {r.get('snapshots', 0)} "
            f"snapshots (newest intact: {report.newest_snapshot}), {r.get('llm_calls', 0)} llm calls")
