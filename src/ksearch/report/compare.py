"""The strategy comparison's tables and curve (``ksearch compare``): rich for the terminal, Markdown for the
results file, a PNG of the best-so-far curves where matplotlib is installed.

All render a `ksearch.run.compare.CompareResult`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from ksearch.report.ablation import ablation_markdown, caption

if TYPE_CHECKING:
    from ksearch.run.compare import CompareResult, StrategySummary

#: evaluations at which the best-so-far table samples the curves
CHECKPOINTS = (1, 2, 5, 10, 20, 30, 40, 60, 80, 120)


def _x(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}x"


def _spread(s: StrategySummary) -> str:
    if s.vs_naive is None:
        return "-"
    return f"{_x(s.vs_naive)} [{_x(s.vs_naive_min)}, {_x(s.vs_naive_max)}]"


def _to_goal(s: StrategySummary) -> str:
    if not s.reached:
        return f"never (0 of {s.runs})"
    med = s.evaluations_to_goal
    each = ", ".join("-" if e is None else str(e) for e in s.each_to_goal)
    return f"{med:g} ({s.reached} of {s.runs} runs: {each})"


def summary_rows(result: CompareResult) -> list[list[str]]:
    """One row per strategy: runs finished, re-timed vs naive (median [min, max]), in-run final best (median),
    evaluations to the goal."""
    return [[s.strategy, f"{s.finished}/{s.runs}", _spread(s), _x(s.best_score), _to_goal(s)]
            for s in result.summaries]


HEADERS = ("strategy", "runs finished", "best vs naive, re-timed (median [min, max])", "final best in-run (median)",
           "evaluations to 95% of the best any run found (median; each run)")


def checkpoints(result: CompareResult) -> list[int]:
    n = max((len(s.curve_median) for s in result.summaries), default=0)
    return [c for c in CHECKPOINTS if c <= n] + ([n] if n and n not in CHECKPOINTS else [])


def curve_rows(result: CompareResult) -> list[list[str]]:
    """Per strategy, the best so far at each checkpoint: median [min, max] over the repeats."""
    cps = checkpoints(result)
    rows = []
    for s in result.summaries:
        cells = [s.strategy]
        for c in cps:
            i = c - 1
            cells.append(f"{s.curve_median[i]:.3g} [{s.curve_min[i]:.3g}, {s.curve_max[i]:.3g}]"
                         if i < len(s.curve_median) else "-")
        rows.append(cells)
    return rows


def compare_table(result: CompareResult) -> Table:
    t = Table(title=f"{result.table.task} · {result.table.target} · budget {result.table.budget} · "
                    f"{result.repeats} repeats · comparison {result.table.ablation_id}", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for h in HEADERS:
        t.add_column(h)
    for row in summary_rows(result):
        t.add_row(*row)
    return t


def curve_table(result: CompareResult) -> Table:
    t = Table(title="best so far (x the naive kernel, in-run) after N evaluations: median [min, max] over repeats",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("strategy")
    for c in checkpoints(result):
        t.add_column(str(c), justify="right")
    for row in curve_rows(result):
        t.add_row(*row)
    return t


def _md_table(headers: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(r) + " |" for r in rows)]


def compare_markdown(result: CompareResult, png: str | None = None) -> str:
    """The results file: the per-strategy summary, the curves at checkpoints (and the PNG's link), then every run's
    row of the ablation table with where it was measured."""
    t = result.table
    lines = [f"# `ksearch compare {t.task}`: strategies at an equal budget on {t.target}", "",
             f"- date: {t.date}", f"- command: `{t.command}`",
             f"- comparison: {t.ablation_id}; budget {t.budget} per run, {result.repeats} repeats per strategy (repeat "
             f"r: seed {t.seed} + r - 1), workloads {', '.join(t.workloads or ['all'])}",
             f"- machine: {json.dumps(t.machine)}", f"- versions: {json.dumps(t.versions)}",
             f"- load: {json.dumps(t.load)}", "",
             f"The best in-run score any run found: {_x(result.best_any)}; the goal below is 95% of it "
             f"({_x(result.goal)}).", ""]
    lines += _md_table(HEADERS, summary_rows(result))
    lines += ["", "Best so far after N evaluations (the world model's best, x the naive kernel, in-run; median [min, "
              "max] over the repeats):", ""]
    lines += _md_table(["strategy", *map(str, checkpoints(result))], curve_rows(result))
    if png:
        lines += ["", f"![best so far]({png})"]
    lines += ["", "## Every run", ""]
    body = ablation_markdown(t)
    lines += [body[body.index(caption(t)):]]  # the table and its notes, without its header (said above)
    return "\n".join(lines).rstrip() + "\n"


def curves_png(result: CompareResult, path: Path) -> Path | None:
    """The best-so-far curves (median line and min-max band per strategy) as a PNG at ``path``; None (nothing
    written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for s in result.summaries:
        xs = list(range(1, len(s.curve_median) + 1))
        if not xs:
            continue
        line, = ax.plot(xs, s.curve_median, label=f"{s.strategy} (median of {s.runs})")
        ax.fill_between(xs, s.curve_min, s.curve_max, color=line.get_color(), alpha=0.15)
    if result.goal:
        ax.axhline(result.goal, color="grey", linestyle=":", linewidth=1, label="95% of the best any run found")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("best so far (x the naive kernel, in-run)")
    ax.set_title(f"{result.table.task} on {result.table.target}: budget {result.table.budget}, "
                 f"{result.repeats} repeats")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
