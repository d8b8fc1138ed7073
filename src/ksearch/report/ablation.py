"""The context ablation's table (``ksearch ablate``): rich for the terminal, Markdown for the results file.

Both render a `ksearch.run.ablate_results.AblationResult` (a pydantic record: the rows and where they were measured).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

if TYPE_CHECKING:
    from ksearch.run.ablate_results import AblationResult, AblationRow

#: the table's columns: the Markdown header, the terminal's (narrower), right-aligned
COLUMNS = (("context", "context", False), ("run id", "run", False), ("evaluations", "evals", True),
           ("best vs naive (re-timed)", "vs naive", True), ("vs {reference}", "vs ref", True),
           ("% of roofline floor", "% floor", True), ("evaluations to 95% of best", "to 95%", True),
           ("LLM calls", "calls", True), ("tokens", "tokens", True), ("cost ($)", "$", True))


def _tokens(row: AblationRow) -> str:
    total = row.input_tokens + row.output_tokens
    if not total:
        return "-"
    return f"{'~' if row.tokens_estimated else ''}{total:,}"


def _cost(row: AblationRow) -> str:
    if row.cost_usd is None:
        return "-"
    return f"{row.cost_usd:.2f}" + ("+" if row.cost_partial else "")


def _vs_naive(row: AblationRow) -> str:
    if row.vs_naive is None:
        return "-" if row.retime_status is None else (row.retime_status or "-")
    iv = f" [{row.vs_naive_lo:.3g}, {row.vs_naive_hi:.3g}]" if row.vs_naive_lo and row.vs_naive_hi else ""
    naive = " (naive)" if row.best_candidate_id is None and row.run_id else ""
    return f"{row.vs_naive:.2f}x{iv}{naive}"


def cells(row: AblationRow) -> list[str]:
    """The row's cells, in `COLUMNS` order; ``-`` where a figure does not exist (no reference, no price, a run
    that never started)."""
    if row.run_id is None:
        return [row.label, "-", "-", f"not started: {row.error or row.status}", "-", "-", "-", "-", "-", "-"]
    status = "" if row.status == "finished" else f" ({row.status})"
    return [row.label, row.run_id + status, str(row.evaluations), _vs_naive(row),
            "-" if row.vs_reference is None else f"{row.vs_reference:.2f}x",
            "-" if row.pct_of_floor is None else f"{row.pct_of_floor:.3g}",
            "-" if row.evaluations_to_95 is None else str(row.evaluations_to_95),
            str(row.llm_calls) if row.llm_calls or row.label != "offline" else "-", _tokens(row), _cost(row)]


def _headers(result: AblationResult, short: bool = False) -> list[str]:
    ref = result.reference_name or "reference"
    return [(s if short else h).format(reference=ref) for h, s, _ in COLUMNS]


def ablation_table(result: AblationResult) -> Table:
    """One row per run (`caption` says how to read it)."""
    t = Table(title=f"{result.task} · {result.target} · budget {result.budget} · seed {result.seed} · ablation "
                    f"{result.ablation_id} · ref: {result.reference_name or 'none'}", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for h, (_, _, right) in zip(_headers(result, short=True), COLUMNS):
        t.add_column(h, justify="right" if right else "left", no_wrap=right or h in ("context", "run"))
    for row in result.rows:
        t.add_row(*cells(row))
    return t


def caption(result: AblationResult) -> str:
    names = ", ".join(result.bench_workloads) or "-"
    return (f"best kernels re-timed side by side in one judge session on {names}: vs naive is paired rounds "
            "against the naive kernel (geometric mean over the workloads, 99.9% interval); % of the roofline floor "
            "and the reference ratio are geometric means; to 95%: evaluations until the run first scored 95% of "
            "its final best, in-run (0: the naive kernel already did); calls: llm calls paid for (replayed ones "
            "not counted); ~: tokens estimated from the text; cost -: unpriced")


def ablation_markdown(result: AblationResult) -> str:
    """The results file: how and where it was measured, the table, per-workload medians, notes."""
    m = result.model
    lines = [f"# `ksearch ablate {result.task}`: context ablation on {result.target}", "",
             f"- date: {result.date}",
             f"- command: `{result.command}`" if result.command else "- command: -",
             f"- ablation: {result.ablation_id}; budget {result.budget} per run, seed {result.seed}, workloads "
             f"{', '.join(result.workloads) if result.workloads else 'all'}",
             f"- model: backend {m.get('backend', '-')}, planner {m.get('planner', '-')}, coder {m.get('coder', '-')}"
             if m else "- model: -",
             f"- machine: {json.dumps(result.machine)}",
             f"- versions: {json.dumps(result.versions)}",
             f"- load: {json.dumps(result.load)}", "",
             caption(result) + ".", "",
             "| " + " | ".join(_headers(result)) + " |", "| " + " | ".join("---" for _ in COLUMNS) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |" for row in result.rows]
    if any(row.workloads for row in result.rows):
        lines += ["", "Medians of the re-time (ms) and the paired ratio over the naive kernel per workload:", "",
                  "| context | workload | naive ms | best ms | "
                  f"{result.reference_name or 'reference'} ms | best vs naive | % of floor |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        f = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
        for row in result.rows:
            for w in row.workloads:
                iv = f" [{w.lo:.3g}, {w.hi:.3g}]" if w.lo and w.hi else ""
                lines.append(f"| {row.label} | {w.workload} | {f(w.naive_ms, '.4g')} | {f(w.best_ms, '.4g')} | "
                             f"{f(w.reference_ms, '.4g')} | {f(w.ratio, '.2f')}x{iv} | {f(w.pct_of_floor, '.3g')} |")
    notes = [*(f"{r.label}: {r.error}" for r in result.rows if r.error), *result.notes, *result.reference_notes]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
