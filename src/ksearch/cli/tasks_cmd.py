"""``ksearch tasks``: list tasks, show one definition, import one from another ecosystem."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from rich.table import Table

from ksearch.cli.options import TASK_HELP, WORKLOADS_FILE_HELP
from ksearch.report.tables import wide_console
from ksearch.tasks import builtin_names, load_task

app = typer.Typer(help="List the built-in tasks, show one, or import one from another ecosystem.",
                  invoke_without_command=True)
console = wide_console()


@app.callback()
def tasks(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the built-in tasks."""
    if ctx.invoked_subcommand is not None:
        return
    from ksearch.targets import base

    alias = base.aliases()
    targets = [base.get_target(n) for n in base.target_names() if n not in alias]
    rows = []
    for name in builtin_names():
        t = load_task(name)
        rows.append({"name": name, "op_type": t.definition.op_type, "workloads": len(t.workloads),
                     # the targets it has a naive kernel for: shipped (naive.<target>.<ext>) or derived (null)
                     "naive": sorted(x.name for x in targets if x.naive_candidate(t) is not None), "dtypes": sorted({s.dtype for s in t.definition.inputs.values()}),
                     "description": (t.definition.description or "").strip()})
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="Built-in tasks")
    for col in ("name", "op_type", "input dtypes", "workloads", "naive kernels"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r["name"], r["op_type"], ", ".join(r["dtypes"]), str(r["workloads"]), ", ".join(r["naive"]))
    console.print(table)


@app.command("show")
def show(task: str = typer.Argument(..., help=TASK_HELP),
         workloads_file: str = typer.Option("", "--workloads-file", "--workloads", help=WORKLOADS_FILE_HELP),
         as_json: bool = typer.Option(False, "--json", help="Print the definition as JSON.")) -> None:
    """Print a task's definition (axes, inputs, outputs, reference, cost model) and its workloads."""
    t = load_task(task, workloads=workloads_file or None)
    data = t.definition.model_dump(mode="json", exclude_none=True)
    if as_json:
        typer.echo(json.dumps({"definition": data, "workloads": [w.model_dump(mode="json") for w in t.workloads]},
                              indent=2))
        return
    reference = data.pop("reference")
    console.print(yaml.safe_dump(data, sort_keys=False, width=110).rstrip(), highlight=False, markup=False)
    console.print("reference: |", highlight=False)
    console.print("\n".join("  " + line for line in reference.rstrip().splitlines()), highlight=False,
                  markup=False)
    table = Table(title=f"Workloads of {t.name} (check: correctness only during a search; bench: also timed)")
    for col in ("name", "purpose", "axes", "bytes (MB)", "GFLOP", "transcendentals (M)"):
        table.add_column(col)
    sources: list[str] = []
    for w in t.workloads:
        c = t.definition.cost_of(w)
        sources += [c.source] if c.source not in sources else []
        table.add_row(w.label, w.purpose, " ".join(f"{k}={v}" for k, v in w.axes.items()), f"{c.bytes / 1e6:.2f}",
                      f"{c.flops / 1e9:.3f}", f"{c.transcendentals / 1e6:.2f}")
    if sources:  # the roofline floor's figures: the task's own cost model, torch's FLOP counter, or bytes only
        from ksearch.tasks.definition import join_cost_sources

        table.caption = "cost model: " + join_cost_sources(sources)
    console.print(table)


@app.command("import")
def import_(src: str = typer.Argument(..., help="What to import: " + TASK_HELP.removeprefix(
                "Built-in task name, task folder, ") + " Other registered sources too (ksearch.tasks.importers)."),
            out: Path = typer.Option(..., "--out", "-o", help="The task folder to write (created; must be empty "
                                     "unless --force)."),
            workloads_file: str = typer.Option("", "--workloads-file", "--workloads", help=WORKLOADS_FILE_HELP),
            kind: str = typer.Option("", help="The source's kind when it is not detected (e.g. flashinfer-bench)."),
            force: bool = typer.Option(False, "--force", help="Overwrite the files of a non-empty folder.")) -> None:
    """Write SRC as ksearch's own task folder (definition.json, workloads.jsonl, safetensors blobs copied under
    blob/), to edit and load back as a task; add naive.<target>.<ext> to search it with `ksearch run`."""
    from ksearch.tasks.importers import import_task, write_task_dir

    t = import_task(src, workloads_file or None, kind or None) if kind else load_task(src, workloads_file or None)
    folder = write_task_dir(t, out, force=force)
    typer.echo(f"wrote task {t.name!r} ({len(t.workloads)} workloads) to {folder}; load it with "
               f"`ksearch tasks show {folder}`")
