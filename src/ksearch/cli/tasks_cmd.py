"""``ksearch tasks``: list tasks and show one definition."""

from __future__ import annotations

import json

import typer
import yaml
from rich.table import Table

from ksearch.report.tables import wide_console
from ksearch.tasks import builtin_names, load_task

app = typer.Typer(help="List the built-in tasks or show one.", invoke_without_command=True)
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
def show(task: str = typer.Argument(..., help="Built-in task name, task directory or definition file."),
         as_json: bool = typer.Option(False, "--json", help="Print the definition as JSON.")) -> None:
    """Print a task's definition (axes, inputs, outputs, reference, cost model) and its workloads."""
    t = load_task(task)
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
    for w in t.workloads:
        c = t.definition.cost_of(w)
        table.add_row(w.label, w.purpose, " ".join(f"{k}={v}" for k, v in w.axes.items()), f"{c.bytes / 1e6:.2f}",
                      f"{c.flops / 1e9:.3f}", f"{c.transcendentals / 1e6:.2f}")
    console.print(table)
