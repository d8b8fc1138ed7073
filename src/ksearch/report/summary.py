"""A finished run's summary, rendered from its `ksearch.records.FinalReport`: per bench workload, the naive kernel,
the best kernel and the Python reference baseline measured side by side at the end of the run, with speedups and %
of the roofline floor; what the final checks said of the best kernel; the path of decisions that led to the best
kernel; the tree as text."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.tree import Tree as RichTree

from ksearch.records import FinalReport, Status
from ksearch.search.worldmodel import ROOT_ID, NodeStatus, Tree


def verdict_lines(report: FinalReport) -> list[str]:
    """What the final checks said of the best kernel (rich markup): a failure on fresh inputs or on a hidden
    workload, else the hidden workloads it passed (or why none were drawn); then the reference notes."""
    lines = []
    status = report.best_status
    if status is not None and status is not Status.PASSED:
        lines.append(f"[bold red]the best kernel FAILED its final check ({status.value}): "
                     f"{escape(report.best_message or '')}[/]; its speedups above are not to be trusted")
    hidden = report.hidden_workloads
    if hidden is not None and status is Status.PASSED:
        if hidden.status is Status.PASSED:
            shapes = "; ".join(" ".join(f"{k}={v}" for k, v in axes.items()) for axes in hidden.axes)
            lines.append(f"the best kernel also passed {len(hidden.axes)} hidden workloads (sizes drawn with a "
                         f"secret seed): {shapes}")
        else:
            lines.append(f"hidden workloads: {hidden.status.value}: {escape(hidden.message)}")
    lines += [f"[dim]{escape(note[:300])}[/]" for note in report.reference_notes]
    return lines


def summary_table(report: FinalReport) -> Table:
    """The final table: one row per bench workload (times in ms, speedups, % of the roofline floor)."""
    ref = report.reference_baseline
    t = Table(title=f"{report.run_id}: the result: best kernel vs baselines (measured side by side at the end; "
                    f"the best timed beside the naive kernel, paired rounds)")
    for col in ("workload", "naive ms", "best ms", f"{ref} ms", "vs naive (paired, 99.9%)", f"vs {ref}",
                "% of floor", "floor ms"):
        t.add_column(col, justify="left" if col == "workload" else "right", no_wrap=True)

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    for w in report.workloads:
        iv = w.speedup_vs_naive_interval
        spread = f" ±{100 * w.best_spread:.0f}%" if w.best_spread is not None else ""
        t.add_row(w.name, f(w.naive_ms, ".4g"), f(w.best_ms, ".4g") + spread, f(w.reference_ms, ".4g"),
                  (f(w.speedup_vs_naive, ".1f") + "x" + (f" [{iv[0]:.1f}, {iv[1]:.1f}]" if iv else ""))
                  if w.speedup_vs_naive else "—",
                  f(w.speedup_vs_reference, ".1f") + "x" if w.speedup_vs_reference else "—",
                  f(w.pct_of_floor, ".1f"), "—" if w.floor_ms is None else f"{w.floor_ms:.3g} ({w.bound})")
    t.caption = floor_sources(report.workloads)
    return t


def floor_sources(rows) -> str | None:
    """``floor from: <source>; ...``: where the floors' bytes and FLOPs come from (the task's cost model, torch's
    FLOP counter on the reference, or bytes only), each source once; None where no row has a floor. ``rows``:
    anything with a ``floor_source`` (WorkloadTimes, WorkloadResult)."""
    sources = list(dict.fromkeys(r.floor_source for r in rows if getattr(r, "floor_source", None)))
    from ksearch.tasks.definition import join_cost_sources

    return "floor from: " + join_cost_sources(sources) + " (bytes: the cost model's, else inputs + outputs by their " \
        "shapes)" if sources else None


def decision_path(tree: Tree, node_id: str) -> list[str]:
    """One line per step from the root to the node: decision, choice, measured speedup over naive. A step whose
    setting a later step took away (a knob of a choice that a later step replaced: the node's kernel no longer has
    it) says so and names that step: the path then reads as the kernel is, not as the moves were made."""
    path = tree.path(node_id)
    lines = []
    for i, n in enumerate(path):
        score = n.evaluation.score if n.evaluation and n.evaluation.score else None
        what = "naive kernel" if n.id == ROOT_ID else f"{n.decision}: {n.choice}"
        gone = next((m for m in path[i + 1:] if not _holds(m.payload, n.payload.get("step"))), None)
        lost = f"  [not in this kernel: dropped by {gone.id} ({gone.decision}: {gone.choice})]" if gone else ""
        lines.append(f"{n.id:>5}  {what}" + (f"  ({score:.2f}x naive)" if score else "") + lost)
    return lines


def _holds(payload: dict, step: dict | None) -> bool:
    """Whether a node whose payload carries a whole path (``choices``, ``knobs``: the patterns proposer's) still
    has the setting ``step`` made (``{"knob": K, "value": V}``, ``{"decision": D, "choice": C}``); True where
    either is unknown (another proposer's nodes)."""
    if not step or "choices" not in payload:
        return True
    if "knob" in step:
        return payload.get("knobs", {}).get(step["knob"]) == step.get("value")
    if "decision" in step:
        return payload["choices"].get(step["decision"]) == step.get("choice")
    return True


_STYLE = {NodeStatus.SOLVED: "green", NodeStatus.REGRESSED: "yellow", NodeStatus.FAILED: "red",
          NodeStatus.OPEN: "dim", NodeStatus.DROPPED: "dim strike"}


def tree_view(tree: Tree, best_id: str | None = None, show_open: bool = True) -> RichTree:
    """The world model as an indented tree: id, choice, status, rating/confidence, score."""

    def label(n) -> str:
        score = f" {n.evaluation.score:.2f}x" if n.evaluation and n.evaluation.score else ""
        iv = (n.evaluation.intervals or {}).get("parent") if n.evaluation else None
        if iv and n.evaluation.vs_parent:
            span = f" [{iv[1]:.3g}, {iv[2]:.3g}]" if iv[1] is not None and iv[2] is not None else ""
            score += f" [dim]{escape(f'(vs parent {iv[0]:.3g}x{span} {n.evaluation.vs_parent})')}[/]"
        fail = f" {n.evaluation.status}" if n.status == NodeStatus.FAILED and n.evaluation else ""
        star = " ★ best" if n.id == best_id else ""
        style = _STYLE.get(n.status, "")
        text = escape(f"{n.id} {n.decision + ': ' if n.decision and n.id != ROOT_ID else ''}{n.choice}")
        # the star right after the node's name: at the end, a long label wrapped it across two lines
        return (f"[{style}]{text}[/]{star} [{style}]{n.status.value}[/]{score}{fail} "
                f"[dim](rating {n.rating:.1f}, conf {n.confidence:.2f})[/]")

    root = RichTree(label(tree.root))
    todo = [(tree.root, root)]
    while todo:
        node, branch = todo.pop(0)
        kids = tree.children(node.id)
        hidden = {NodeStatus.OPEN: 0, NodeStatus.DROPPED: 0}
        for k in kids:
            if not show_open and k.status in hidden:
                hidden[k.status] += 1
                continue
            todo.append((k, branch.add(label(k))))
        said = [f"{n} {what}" for n, what in ((hidden[NodeStatus.OPEN], "open actions"),
                                              (hidden[NodeStatus.DROPPED], "dropped")) if n]
        if said:
            branch.add(f"[dim]… {', '.join(said)}[/]")
    return root
