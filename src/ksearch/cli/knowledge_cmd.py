"""``ksearch knowledge``: the translation layer (concept maps, code patterns, assertions) as data."""

from __future__ import annotations

import json

import typer

from ksearch.knowledge.translation import as_dict, available, load_translation
from ksearch.targets import target_names

app = typer.Typer(help="The translation layer: concept maps, code patterns and assertions.", no_args_is_help=True)


@app.command("show")
def show_command(
    source: str = typer.Option("cuda", "--from", help="The platform the expertise comes from."),
    target: str = typer.Option(..., "--to", help="The target to port to: metal, cpu or triton."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the concept map, code patterns and assertions from one platform to a target."""
    tmap = load_translation(source, target)  # KnowledgeError: one readable message, exit 2
    if as_json:
        typer.echo(json.dumps(as_dict(tmap), indent=2))
        return
    out = [f"# {tmap.title} ({tmap.source} -> {tmap.target})", "", "## Concept map", ""]
    for c in tmap.concepts:
        out.append(f"- {c.concept} -> {c.equivalent}  [{c.source}]")
        for lim in c.limits:
            out.append(f"    limit {lim.name}: {tmap.source} {lim.cuda} | {tmap.target} {lim.target}  [{lim.source}]")
        out.append(f"    naive port: {c.note}")
        if c.check:
            out.append(f"    checked by: static rule {tmap.target}/{c.check}")
    out += ["", "## Code patterns", ""]
    for p in tmap.patterns:
        out.append(f"- {p.id}: {p.title}. {p.description}")
        for side in (tmap.source, tmap.target):
            out.append(f"    {side}:")
            out += [f"      {line}" for line in p.sketches[side].rstrip("\n").split("\n")]
    out += ["", "## Assertions", ""]
    for a in tmap.assertions:
        checks = ", ".join(str(c) for c in a.checks) or "none yet"
        out.append(f"- {a.id}: {a.property} ({a.why}) Checked by: {checks}.")
        if a.note:
            out.append(f"    note: {a.note}")
    out += ["", "## Sources", ""] + [f"- {k}: {v}" for k, v in tmap.sources.items()]
    out += ["", "Other maps: " + ", ".join(f"--from {a} --to {b}" for a, b in available())]
    typer.echo("\n".join(out))


@app.command("render")
def render_command(
    task: str = typer.Argument(..., help="Built-in task name, task directory or definition file."),
    target: str = typer.Option("cpu", help=f"The pack's target: {', '.join(target_names())}."),
    path: str = typer.Option("", "--path", help="Choices and knob values, comma-separated, e.g. "
                                               "'family=flash,exp=exp2,masking=split-diagonal,num_stages=3' "
                                               "(a node's path as `ksearch show` prints it; the rest default)."),
    out: str = typer.Option("", "-o", "--out", help="Write the candidate JSON here (default: stdout)."),
) -> None:
    """Render one path of TASK's knowledge pack into a candidate JSON (what the patterns proposer would judge),
    for `ksearch eval` or a benchmark's --candidate. Choice ids go to their decision, other names are knobs;
    integer-looking values become integers."""
    from pathlib import Path

    from ksearch.errors import KnowledgeError
    from ksearch.knowledge import load_pack
    from ksearch.tasks import load_task
    from ksearch.targets.base import resolve_target

    t = load_task(task)
    pack = load_pack(t.name, resolve_target(target))
    decisions = {d.id for d in pack.decisions} | {"family"}
    choices, knobs = {}, {}
    for item in filter(None, (x.strip() for x in path.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise typer.BadParameter(f"{item!r}: expected NAME=VALUE", param_hint="--path")
        if key in choices or key in knobs:
            raise typer.BadParameter(f"{key!r} given twice", param_hint="--path")
        if key in decisions:
            choices[key] = value
        else:
            knobs[key] = int(value) if value.lstrip("-").isdigit() else value
    kernel = pack.render(t.definition, choices, knobs)  # KnowledgeError: unknown choice/knob, named
    cand = kernel.candidate("knowledge render", task=t.name)
    text = cand.model_dump_json(indent=2)
    if out:
        try:
            Path(out).write_text(text + "\n")
        except OSError as e:
            raise KnowledgeError(f"cannot write {out}: {e.strerror}") from None
        typer.echo(f"wrote {out}: {pack.name} {kernel.family} {kernel.choices} {kernel.knobs}", err=True)
    else:
        typer.echo(text)
