"""Strategies compared at an equal budget (``ksearch compare``): for each strategy (``worldmodel``, ``evolve``,
``random``: `ksearch.search.strategy`) and each repeat, one ordinary run with the same task, target, workloads,
proposer, judge and budget; repeat ``r`` of every strategy has seed ``seed + r`` (the strategies meet the same
correctness inputs and tie breaks in each repeat).

A comparison is an ablation manifest whose runs are variants (`ksearch.run.ablate.Ablation.variants`, labels
``<strategy>-<repeat>``): it starts, resumes (``--resume``), runs ``--jobs`` at once and re-times every run's best
kernel beside the naive kernel in one judge session exactly as ``ksearch ablate`` does
(`ksearch.run.ablate_results`). On top of that table, per strategy (`StrategySummary`): the re-timed speedups
over the naive kernel (median, min, max over the repeats), the best-so-far curve (the world model's best after each
evaluation, from the run's snapshots: median, min and max over the repeats at each evaluation), and how many
evaluations each run took to reach 95% of the best score any run found (in-run scores).
"""

from __future__ import annotations

import os
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from ksearch.errors import SearchError
from ksearch.run.ablate import Ablation, AblationRun, ablation_dir, save
from ksearch.run.ablate_results import SHARE, AblationResult, results, still_current
from ksearch.run.controller import RunConfig
from ksearch.search.strategy import STRATEGIES
from ksearch.store.runs import new_run_id, open_run


def parse_strategies(text: str) -> list[str]:
    """``worldmodel,evolve,random`` as a list. Raises SearchError for an unknown or repeated one, or none."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    for x in names:
        if x not in STRATEGIES:
            raise SearchError(f"unknown strategy {x!r} in --strategies: the strategies are {', '.join(STRATEGIES)}")
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise SearchError(f"--strategies names {', '.join(twice)} more than once")
    if not names:
        raise SearchError("--strategies names none: give e.g. worldmodel,evolve,random")
    return names


def label(strategy: str, repeat: int) -> str:
    return f"{strategy}-{repeat + 1}"


def new_comparison(cfg: RunConfig, strategies: list[str], repeats: int, name: str | None = None,
                   command: str = "") -> Ablation:
    """A manifest (not yet saved): ``repeats`` runs of ``cfg`` per strategy, repeat ``r`` with seed
    ``cfg.seed + r`` (the run's and the strategy's). Raises SearchError for no strategy, fewer than one repeat or
    a bad name."""
    if not strategies or repeats < 1:
        raise SearchError("a comparison needs at least one strategy and one repeat")
    task_name = Path(cfg.task).name if os.sep in cfg.task else cfg.task
    ab_id = name or new_run_id(f"{task_name}-compare")
    if not ab_id or "/" in ab_id or ab_id.startswith("."):
        raise SearchError(f"--name must be a plain directory name, not {ab_id!r}")
    variants: dict[str, RunConfig] = {}
    for r in range(repeats):
        for s in strategies:
            seed = cfg.seed + r
            variants[label(s, r)] = cfg.model_copy(update={
                "seed": seed, "strategy": cfg.strategy.model_copy(update={"kind": s, "seed": seed})})
    return Ablation(id=ab_id, created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=command,
                    task=cfg.task, contexts=[], config=cfg, runs=[AblationRun(label=x) for x in variants],
                    variants=variants, strategies=list(strategies), repeats=repeats)


def best_so_far(run_id: str) -> list[float]:
    """The run's best score (the world model's `Tree.best`, 1.0 before anything beat the naive kernel) after each
    of its evaluations, in the store's order, from the snapshot written with each (`curve_points`' scores).
    Raises StoreError."""
    from ksearch.report.html_data import curve_points

    store = open_run(run_id)
    try:
        return [p["score"] for p in curve_points(store)]
    finally:
        store.close()


class StrategySummary(BaseModel):
    """One strategy over its repeats. ``vs_naive``: the re-timed best over the naive kernel (median, min, max of
    the repeats that finished the re-time); ``best_score``: the in-run final best (median); ``reached``: runs that
    reached 95% of the best final in-run score any run found (``goal``) and stayed there to the end (a best later
    revised below the goal by a re-time did not reach it), ``evaluations_to_goal``: the evaluations they took (median; one value per run in ``each_to_goal``, None where it never did); ``curve_*``: the best-so-far
    after each evaluation, median / min / max over the repeats (a run shorter than the budget keeps its last
    value)."""

    strategy: str
    runs: int
    finished: int
    vs_naive: float | None = None
    vs_naive_min: float | None = None
    vs_naive_max: float | None = None
    best_score: float | None = None
    reached: int = 0
    evaluations_to_goal: float | None = None
    each_to_goal: list[int | None] = Field(default_factory=list)
    curve_median: list[float] = Field(default_factory=list)
    curve_min: list[float] = Field(default_factory=list)
    curve_max: list[float] = Field(default_factory=list)


class CompareResult(BaseModel):
    """What ``ksearch compare`` writes: the ablation table of every run (``table``), the best in-run score any run
    found (``best_any``) and the goal (``goal``: `SHARE` of it), each run's curve (label -> best so far after each
    evaluation) and a summary per strategy."""

    table: AblationResult
    strategies: list[str]
    repeats: int
    best_any: float | None = None
    goal: float | None = None
    curves: dict[str, list[float]] = Field(default_factory=dict)
    summaries: list[StrategySummary] = Field(default_factory=list)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(ab: Ablation, table: AblationResult, curves: dict[str, list[float]]) -> CompareResult:
    """Per-strategy figures from the table and the curves (see `StrategySummary`)."""
    best_any = max((c[-1] for c in curves.values() if c), default=None)
    goal = SHARE * best_any if best_any else None
    rows = {r.label: r for r in table.rows}
    out = CompareResult(table=table, strategies=ab.strategies, repeats=ab.repeats, best_any=best_any, goal=goal,
                        curves=curves)
    budget = ab.config.budget
    for s in ab.strategies:
        labels = [label(s, r) for r in range(ab.repeats)]
        mine = [rows[x] for x in labels if x in rows]
        done = [r for r in mine if r.vs_naive is not None]
        vs = [r.vs_naive for r in done if r.vs_naive is not None]
        each: list[int | None] = []
        for x in labels:
            c = curves.get(x, [])
            # reached and held: a score read high on a busy machine and revised down by a later re-time is no goal
            each.append(next((i for i in range(1, len(c) + 1) if goal is not None and min(c[i - 1:]) >= goal), None))
        padded = [c + [c[-1]] * (budget - len(c)) for x in labels if (c := curves.get(x))]
        n = max((len(c) for c in padded), default=0)
        cols = [[c[i] for c in padded if i < len(c)] for i in range(n)]
        out.summaries.append(StrategySummary(
            strategy=s, runs=len(mine), finished=sum(1 for r in mine if r.status == "finished"),
            vs_naive=_median(vs), vs_naive_min=min(vs) if vs else None, vs_naive_max=max(vs) if vs else None,
            best_score=_median([r.best_score for r in mine if r.best_score is not None]),
            reached=sum(1 for e in each if e is not None), each_to_goal=each,
            evaluations_to_goal=_median([float(e) for e in each if e is not None]),
            curve_median=[statistics.median(col) for col in cols], curve_min=[min(col) for col in cols],
            curve_max=[max(col) for col in cols]))
    return out


def compare_results(ab: Ablation, progress: Callable[[str], None] = lambda m: None) -> CompareResult:
    """The ablation table (every run's best re-timed beside the naive kernel in one judge session), the curves
    and the per-strategy summaries."""
    table = results(ab, progress)
    curves = {r.label: best_so_far(r.run_id) for r in ab.runs if r.run_id is not None}
    return summarize(ab, table, curves)


def stored(ab: Ablation) -> CompareResult | None:
    """The results last written, when their runs are still the comparison's as they are now; else None."""
    if not ab.results:
        return None
    try:
        result = CompareResult.model_validate_json(Path(ab.results).read_text())
    except (OSError, ValueError):
        return None
    return result if still_current(ab, result.table) else None


def write(ab: Ablation, result: CompareResult, out: Path | None = None) -> tuple[Path, Path, Path | None]:
    """``out`` (default ``<comparison dir>/results.md``), the JSON beside it, and the curves as a PNG beside it
    when matplotlib is installed (else None); the manifest records the JSON's path."""
    from ksearch.report.compare import compare_markdown, curves_png

    md = Path(out) if out is not None else ablation_dir(ab.id) / "results.md"
    md = md if md.suffix == ".md" else md.with_name(md.name + ".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    js = md.with_suffix(".json")
    png = curves_png(result, md.with_suffix(".png"))
    md.write_text(compare_markdown(result, png.name if png else None))
    js.write_text(result.model_dump_json(indent=2))
    ab.results = str(js.resolve())
    save(ab)
    return md, js, png
