"""``ksearch show RUN``: a run's tree, final table and failures; ``--node ID`` with ``--source`` / ``--diff`` for
one node's kernel; ``--json`` for all of it (evaluations with their kernels and times)."""

from __future__ import annotations

import json

import typer
from rich.markup import escape

from ksearch.errors import StoreError
from ksearch.records import Candidate, FinalReport
from ksearch.report.kernels import candidate_diff, source_text
from ksearch.report.summary import decision_path, summary_table, tree_view, verdict_lines
from ksearch.report.tables import wide_console
from ksearch.store.runs import current_status, open_run

OPEN_HELP = ("Also list the open actions: moves the planner has put in the tree and the search has not tried yet "
             "(each with its rating and confidence, the priors that order them), and the dropped ones. Without it "
             "each node shows only their count ('… 5 open actions').")


def show_command(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or its directory)."),
    node: str = typer.Option("", "--node", help="One node (an id as the tree shows it, e.g. n7): its path from "
                             "the root; with --source its kernel, with --diff the change from its parent's."),
    source: bool = typer.Option(False, "--source", help="With --node: the node's kernel (every source file, its "
                                "entry point, compile flags and launch plan)."),
    diff: bool = typer.Option(False, "--diff", help="With --node: the unified diff from the parent node's kernel "
                              "to this node's (build settings and sources)."),
    show_open: bool = typer.Option(False, "--open", help=OPEN_HELP),
    llm: bool = typer.Option(False, "--llm", help="List the llm proposer's calls: tokens, latency, cost "
                                                   "(with --json: every prompt and reply too)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run, its evaluations (each with its kernel, "
                                 "wall time and load time in s) and tree as JSON."),
) -> None:
    """A run's results and its world model as text."""
    from ksearch.run.controller import load_snapshot, run_config

    if (source or diff) and not node:
        raise StoreError("--source and --diff show one node's kernel: give its id with --node (e.g. --node n7)")
    store = open_run(run, readonly=True)
    try:
        info = store.run()
        info = {**info, "status": current_status(store.path.parent, info["status"])}  # killed: stopped
        cfg = run_config(store)
        notes = [f"{store.path} is damaged (integrity check: {line}): `ksearch runs check {run} --repair`"
                 for line in store.quick_check()[:1]]
        snap = load_snapshot(store, on_skip=notes.append)
        tree = snap[0] if snap else None
        evals = store.evaluations()
        if node:
            _show_node(store, info["id"], tree, node, source, diff, as_json)
            return
        calls = store.llm_calls() if llm else None
        kernels = {e.candidate_id: store.candidate(e.candidate_id) for _, _, e in evals} if as_json else {}
        final, report, damaged = _final(store, info, tree, len(evals), as_json)
    finally:
        store.close()
    if as_json:
        doc = {"run": info, "evaluations": [
            {"seq": s, "node_id": n, "candidate_id": e.candidate_id, "status": e.status.value,
             "message": e.message[:500], "wall_s": e.wall_s, "load_s": e.load_s,
             "kernel": _kernel_json(kernels.get(e.candidate_id))} for s, n, e in evals],
            "tree": json.loads(tree.model_dump_json()) if tree else None, "final": final}
        if calls is not None:
            from ksearch.report.llm import llm_totals

            doc["llm_calls"] = [json.loads(c.model_dump_json()) for c in calls]
            doc["llm_totals"] = llm_totals(calls)
        typer.echo(json.dumps(doc, indent=2))
        return
    if calls is not None:
        from ksearch.report.llm import llm_table

        out = wide_console()
        out.print(llm_table(calls) if calls else f"run {info['id']} made no llm calls (proposer {cfg.proposer})")
        return
    out = wide_console()
    out.print(f"[bold]{info['id']}[/] · {info['task']} · {info['target']} · {info['status']} · "
              f"{len(evals)} of {cfg.budget} evaluations · created {info['created_at']}")
    for line in notes:  # a damaged file, a newest snapshot that does not decode (whole: it names paths)
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    if tree is None:
        out.print("no tree yet")
        return
    if tree.in_flight:
        out.print(f"{len(tree.in_flight)} evaluations were in flight when the run stopped "
                  f"({', '.join(sorted(tree.in_flight))}): `ksearch resume {info['id']}` judges them first",
                  highlight=False, markup=False)
    best = tree.best()
    out.print(tree_view(tree, best.id if best else None, show_open))
    if damaged:
        out.print(damaged, highlight=False, markup=False)
    if report is not None:
        out.print(summary_table(report))
        for line in verdict_lines(report):
            out.print(line, highlight=False)
        if report.reproduce:
            out.print(f"judge the best kernel again exactly: [bold]{escape(report.reproduce)}[/]", highlight=False)
    failures = [(s, n, e) for s, n, e in evals if not e.status.passed]
    if failures:
        out.print(f"\n[bold]{len(failures)} failed evaluations[/]")
        for s, n, e in failures[:20]:
            out.print(f"  [{s}] {n}: {e.status.value}: {e.message.splitlines()[0][:150] if e.message else ''}",
                      highlight=False, markup=False)


def _final(store, info: dict, tree, evaluations: int, as_json: bool) -> tuple[object, FinalReport | None, str]:
    """The final stage's row as stored (for --json), the run's report (None: not finished, or with --json) and a
    line saying what of the final measurements or report cannot be shown ('' when all can): a damaged row is said,
    never a traceback, and the rest of the run is shown."""
    notes = []
    try:
        final = store.baseline("final")
    except StoreError as e:
        final = None
        notes.append(f"the final measurements do not decode: {e}")
    if as_json:
        return final, None, "; ".join(notes)
    measured = report = None
    if isinstance(final, dict) and final.get("naive"):
        try:
            measured = store.final()
        except StoreError as e:
            notes.append(f"the final measurements do not decode: {e}")
    elif final is not None and not isinstance(final, dict):
        notes.append(f"the final measurements do not decode: {json.dumps(final)[:80]} is not an object")
    if final is not None or notes:
        try:
            report = store.report()
        except StoreError as e:
            notes.append(f"the final report does not decode: {e}")
    # the report kept when the run finished; rebuilt from the final measurements for a run finished before reports
    # were kept (or killed between the two writes)
    if measured is not None and (report is None or report.best_candidate_id != measured.best_candidate_id):
        best_node = tree.best() if tree else None
        report = FinalReport.build(info, evaluations, best_node.id if best_node else None, measured)
    return final, report, "; ".join(notes)


def _kernel_json(c: Candidate | None) -> dict | None:
    """What builds an evaluation's kernel: sources by file name, entry point, compile flags, launch plan."""
    if c is None:
        return None
    return {"sources": c.sources, "entry_point": c.entry_point, "compile_flags": c.compile_flags,
            "launch": c.launch}


def _kernel_of(store, node) -> Candidate | None:
    """The kernel a node holds: its judged candidate, the root's from the naive baseline (kept apart from the
    judged candidates); None for a node with none."""
    if node is None or not node.candidate_id:
        return None
    found = store.candidate(node.candidate_id)
    naive = (store.baseline("naive") or {}).get("candidate") if found is None else None
    return Candidate.model_validate(naive) if naive else found


def _show_node(store, run_id: str, tree, node_id: str, source: bool, diff: bool, as_json: bool) -> None:
    """``--node ID``: the path to the node, then its kernel (``--source``) and/or the diff from its parent's
    (``--diff``). Raises StoreError for a node the tree lacks or one with no kernel yet (open, or failed before
    a kernel existed)."""
    if tree is None or node_id not in tree:
        known = ", ".join(n.id for n in tree) if tree else "none yet"
        raise StoreError(f"run {run_id} has no node {node_id!r} (its nodes: {known[:300]})")
    n = tree[node_id]
    parent = tree[n.parent_id] if n.parent_id else None
    mine, theirs = _kernel_of(store, n), _kernel_of(store, parent)
    if (source or diff) and mine is None:
        raise StoreError(f"node {node_id} of run {run_id} has no kernel ({n.status.value}: nothing was judged)")
    if as_json:
        typer.echo(json.dumps({"node": json.loads(n.model_dump_json()), "kernel": _kernel_json(mine),
                               "parent_kernel": _kernel_json(theirs)}, indent=2))
        return
    if not (source or diff):
        for line in decision_path(tree, node_id):
            typer.echo(line)
        return
    if source:
        typer.echo(source_text(mine), nl=False)
    if diff:
        if parent is None:
            typer.echo(f"{node_id} is the root (the naive kernel): no parent to diff against")
        else:
            text = candidate_diff(theirs, mine, parent.id, node_id)
            typer.echo(text or f"{node_id} builds the same kernel as its parent {parent.id}", nl=not text)
