"""``ksearch knowledge``: the translation layer (concept maps, code patterns, assertions) as data."""

from __future__ import annotations

import json

import typer

from ksearch.knowledge.translation import as_dict, available, load_translation

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
