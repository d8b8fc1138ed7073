"""The context ablation's table (``ksearch ablate``, `ksearch.run.ablate`): one `AblationRow` per run.

From each run's store: its evaluations, its final best score, the evaluations it took to first reach 95% of that
(in-run scores, in the store's order), its llm calls, tokens and cost. From the re-time at the end: every run's
best kernel and the naive kernel timed side by side in one judge session (one Evaluator, a fresh secret seed, the
same inputs for all, as a run's final stage does it): the best against the naive kernel (paired rounds, geometric
mean over the bench workloads, with its 99.9% interval), against the task's reference baseline (timed in the same
session), and % of the roofline floor (geometric mean). Written as ``results.json`` (`AblationResult`) and
Markdown (`ksearch.report.ablation`) with the machine, versions, date, load and command line.
"""

from __future__ import annotations

import math
import os
import platform
import secrets
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from ksearch import __version__, config
from ksearch.errors import SearchError, StoreError
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.eval.timing import Reference
from ksearch.records import Candidate, Evaluation, Status
from ksearch.run.ablate import Ablation, ablation_dir, save
from ksearch.run.controller import load_snapshot, score_of
from ksearch.run.session import reference_timings
from ksearch.search.worldmodel import ROOT_ID
from ksearch.store.runs import open_run

#: share of a run's final best whose first reaching is counted (`evaluations_to_reach`)
SHARE = 0.95


def evaluations_to_reach(scores: list[float | None], best: float | None, share: float = SHARE) -> int | None:
    """How many evaluations (in order; ``scores``: each one's score, None where it failed) a run took to first
    reach ``share`` of its final ``best`` score: 0 when the naive kernel (score 1.0) already does; None without a
    best, or when no evaluation reaches it."""
    if best is None:
        return None
    goal = share * best
    if 1.0 >= goal:
        return 0
    return next((i for i, s in enumerate(scores, 1) if s is not None and s >= goal), None)


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


class WorkloadRow(BaseModel):
    """One bench workload of one row, from the re-time: medians in ms, the paired ratio over the naive kernel
    (``ratio``, its interval ``lo``..``hi``), % of the roofline floor."""

    workload: str
    naive_ms: float | None = None
    best_ms: float | None = None
    reference_ms: float | None = None
    ratio: float | None = None
    lo: float | None = None
    hi: float | None = None
    pct_of_floor: float | None = None


class AblationRow(BaseModel):
    """One run in the table.

    From the re-time: ``vs_naive`` (the paired ratio naive time / best time, geometric mean over the bench
    workloads, with its interval ``vs_naive_lo``..``vs_naive_hi`` and ``verdict``), ``vs_reference`` (reference
    median / best median, geometric mean; None without a reference), ``pct_of_floor`` (geometric mean) and
    ``retime_status`` (the best kernel's status on the re-time's fresh inputs). From the store: ``evaluations``,
    ``best_score`` (its final best, in-run), ``evaluations_to_95`` (`evaluations_to_reach`), ``llm_calls`` (calls
    paid for: replayed ones not counted), ``input_tokens`` / ``output_tokens`` (``tokens_estimated``: some were
    estimated from the text, `LLMCall.usage_estimated`; ``cache_read_tokens`` / ``cache_write_tokens``: the part
    of the input read from / written to the provider's prompt cache), ``cost_usd`` (None: no call was priced).
    """

    label: str
    run_id: str | None = None
    status: str = "pending"
    error: str | None = None
    evaluations: int = 0
    best_candidate_id: str | None = None
    best_node_id: str | None = None
    best_score: float | None = None
    evaluations_to_95: int | None = None
    vs_naive: float | None = None
    vs_naive_lo: float | None = None
    vs_naive_hi: float | None = None
    verdict: str | None = None
    vs_reference: float | None = None
    pct_of_floor: float | None = None
    retime_status: str | None = None
    retime_message: str | None = None
    llm_calls: int = 0
    replayed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    tokens_estimated: bool = False
    cost_usd: float | None = None
    cost_partial: bool = False  # some paid calls had no price
    workloads: list[WorkloadRow] = Field(default_factory=list)


def row_from_store(label: str, run_id: str) -> tuple[AblationRow, Candidate | None]:
    """The store's half of a row (evaluations, scores, llm calls) and the run's best kernel (None: nothing beat
    the naive kernel). Raises StoreError for a store that cannot be read."""
    from ksearch.report.llm import llm_totals

    store = open_run(run_id)
    try:
        info = store.run()
        evals = store.evaluations()
        best_score = store.best_score()
        snap = load_snapshot(store)
        node = snap[0].best() if snap else None
        best = store.candidate(node.candidate_id) if node is not None and node.id != ROOT_ID and \
            node.candidate_id else None
        calls = store.llm_calls()
    finally:
        store.close()
    tot = llm_totals(calls)
    paid = [c for c in calls if not c.replayed]
    row = AblationRow(label=label, run_id=run_id, status=info.get("status") or "?", evaluations=len(evals),
                      best_candidate_id=best.id if best else None,
                      best_node_id=node.id if node is not None and best else None, best_score=best_score,
                      evaluations_to_95=evaluations_to_reach([score_of(e) for _, _, e in evals], best_score),
                      llm_calls=len(paid), replayed_calls=tot["replayed"], input_tokens=tot["input_tokens"],
                      output_tokens=tot["output_tokens"], cache_read_tokens=tot["cache_read_tokens"],
                      cache_write_tokens=tot["cache_write_tokens"],
                      tokens_estimated=any(c.usage_estimated for c in paid),
                      cost_usd=tot["cost_usd"],
                      cost_partial=tot["cost_usd"] is not None and any(c.cost_usd is None for c in paid))
    return row, best


class AblationResult(BaseModel):
    """What ``ksearch ablate`` writes (``results.json``) and prints: the rows, the naive kernel's and the
    reference's re-timed medians, and where and how it was measured (``machine``, ``versions``, ``load``: the
    1-minute load average before and after the re-time and the most busy cores seen while timing, ``date``,
    ``command``)."""

    ablation_id: str
    task: str
    target: str
    budget: int
    seed: int
    workloads: list[str] | None = None
    bench_workloads: list[str] = Field(default_factory=list)
    model: dict[str, str] = Field(default_factory=dict)
    reference_name: str | None = None
    reference_notes: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    rows: list[AblationRow]
    date: str
    command: str = ""
    machine: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    load: dict[str, float | None] = Field(default_factory=dict)


def _workload_rows(names: list[str], naive: Evaluation, ev: Evaluation | None,
                   reference: dict) -> list[WorkloadRow]:
    rows = []
    for w in names:
        n = naive.result(w)
        b = ev.result(w) if ev is not None else n
        ref = reference.get(w)
        p = next((x for x in b.paired if x.role == "naive" and x.ratio), None) if b is not None and ev else None
        best_ms = b.median_ms if b is not None else None
        ratio = p.ratio if p else (1.0 if ev is None else (n.median_ms / best_ms) if n and n.median_ms and best_ms
                                   else None)
        rows.append(WorkloadRow(workload=w, naive_ms=n.median_ms if n else None, best_ms=best_ms,
                                reference_ms=ref.median_ms if ref is not None and ref.status is Status.PASSED
                                else None, ratio=ratio, lo=p.lo if p else None, hi=p.hi if p else None,
                                pct_of_floor=b.pct_of_floor if b is not None else None))
    return rows


def retime(ab: Ablation, rows: list[tuple[AblationRow, Candidate | None]],
           progress: Callable[[str], None] = lambda m: None) -> tuple[list[str], str | None, list[str], list[str],
                                                                      float | None]:
    """Re-time every row's best kernel beside the naive kernel in one judge session (one Evaluator, a fresh
    secret seed, the same inputs for all), and the task's reference baseline on the same inputs, as a run's final
    stage does (`Session._final_measurements`); fills each row's re-time fields. A row without a best kernel is
    the naive kernel (1.0x). Returns (bench workload names, the reference's name, its notes, other notes, the most
    busy cores seen while timing)."""
    from ksearch.targets.base import spec_for_run
    from ksearch.tasks import load_task

    cfg = ab.config
    task = load_task(cfg.task, workloads=cfg.workloads_file)
    stored = None
    for row, _ in rows:
        if row.run_id:
            try:
                store = open_run(row.run_id)
                try:
                    stored = store.hardware()
                finally:
                    store.close()
                break
            except StoreError:
                continue
    hardware = spec_for_run(cfg.target, stored)
    ecfg = EvalConfig(seeds=[secrets.randbits(62)], timeout_s=cfg.timeout_s, timing=cfg.timing)
    ev = Evaluator(task, cfg.target, hardware, ecfg, progress)
    notes: list[str] = []
    try:
        selected = task.select(cfg.workloads)
        bench = [w for w in selected if w.purpose == "bench"] or selected
        names = [w.name or w.uuid for w in bench]
        progress("re-time: the naive kernel on fresh inputs")
        naive = ev.measure_naive(bench)
        if naive.status is not Status.PASSED:
            raise SearchError(f"the naive kernel failed the re-time's check: {naive.message}")
        done: dict[str, Evaluation] = {}
        for row, best in rows:
            if best is None or best.id in done:
                continue
            progress(f"re-time: {row.label}'s best kernel {best.id}, beside the naive kernel")
            done[best.id] = ev.evaluate(best, names, timing=True,
                                        references=[Reference("naive", ev.naive_candidate())])
        ref_name, reference, ref_notes = reference_timings(task, names, ecfg.seeds[0], progress, cfg.target,
                                                           cases=ev, plan=cfg.timing)
    finally:
        ev.close()
    loads = [r.load_cores for e in [naive, *done.values()] for r in e.workloads if r.load_cores is not None]
    for row, best in rows:
        if row.run_id is None:
            continue
        e = done.get(best.id) if best is not None else None
        row.workloads = _workload_rows(names, naive, e, reference)
        if best is None:
            row.vs_naive, row.retime_status = 1.0, Status.PASSED.value
            row.retime_message = "nothing beat the naive kernel: the row is the naive kernel"
        else:
            p = next((x for x in e.paired if x.role == "naive"), None)
            row.retime_status, row.retime_message = e.status.value, e.message or None
            if e.status is Status.PASSED:
                row.vs_naive = p.ratio if p and p.ratio else geomean([w.ratio for w in row.workloads])
                row.vs_naive_lo, row.vs_naive_hi = (p.lo, p.hi) if p else (None, None)
                row.verdict = p.verdict if p else None
            else:
                notes.append(f"{row.label}: the best kernel {best.id} {e.status.value} in the re-time: "
                             f"{(e.message or '').splitlines()[0][:200] if e.message else ''}")
        if row.retime_status == Status.PASSED.value:
            row.pct_of_floor = geomean([w.pct_of_floor for w in row.workloads])
            row.vs_reference = geomean([w.reference_ms / w.best_ms for w in row.workloads
                                        if w.reference_ms and w.best_ms]) if reference else None
    return names, ref_name, ref_notes, notes, max(loads) if loads else None


def results(ab: Ablation, progress: Callable[[str], None] = lambda m: None) -> AblationResult:
    """The ablation's table: each run's row from its store, then the re-time (`retime`). A run that never
    started has a row with its error and nothing else."""
    rows: list[tuple[AblationRow, Candidate | None]] = []
    for r in ab.runs:
        if r.run_id is None:
            rows.append((AblationRow(label=r.label, status=r.status, error=r.error), None))
            continue
        row, best = row_from_store(r.label, r.run_id)
        row.error = r.error
        rows.append((row, best))
    load_before = _loadavg()
    names, ref_name, ref_notes, notes, busy = retime(ab, rows, progress) if any(r.run_id for r, _ in rows) \
        else ([], None, [], [], None)
    llm = ab.config.llm
    model = {"backend": llm.backend, "planner": llm.planner, "coder": llm.coder} if llm else {}
    return AblationResult(ablation_id=ab.id, task=ab.task, target=ab.config.target, budget=ab.config.budget,
                          seed=ab.config.seed, workloads=ab.config.workloads, bench_workloads=names, model=model,
                          reference_name=ref_name, reference_notes=ref_notes, notes=notes,
                          rows=[r for r, _ in rows], date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          command=ab.command, machine=machine(), versions=versions(),
                          load={"loadavg_1m_before": load_before, "loadavg_1m_after": _loadavg(),
                                "max_busy_cores_while_timing": busy})


def write_results(ab: Ablation, result: AblationResult, out: Path | None = None) -> tuple[Path, Path]:
    """``out`` (default ``<ablation dir>/results.md``) and the JSON beside it (same name, ``.json``); the manifest
    records the JSON's path."""
    from ksearch.report.ablation import ablation_markdown

    md = Path(out) if out is not None else ablation_dir(ab.id) / "results.md"
    md = md if md.suffix == ".md" else md.with_name(md.name + ".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    js = md.with_suffix(".json")
    md.write_text(ablation_markdown(result))
    js.write_text(result.model_dump_json(indent=2))
    ab.results = str(js.resolve())
    save(ab)
    return md, js


def stored_results(ab: Ablation) -> AblationResult | None:
    """The results last written, when their rows are still the ablation's runs as they are now (same run ids,
    evaluations and status); else None."""
    if not ab.results:
        return None
    try:
        result = AblationResult.model_validate_json(Path(ab.results).read_text())
    except (OSError, ValidationError):
        return None
    return result if still_current(ab, result) else None


def still_current(ab: Ablation, result: AblationResult) -> bool:
    """Whether ``result``'s rows are the ablation's runs as they are now (same run ids, evaluations, status)."""
    now = {r.label: r.run_id for r in ab.runs}
    if {r.label: r.run_id for r in result.rows} != now or any(r.run_id is None for r in result.rows):
        return False
    for r in result.rows:
        try:
            store = open_run(r.run_id)  # type: ignore[arg-type]
            try:
                same = store.evaluation_count() == r.evaluations and store.run().get("status") == r.status
            finally:
                store.close()
        except StoreError:
            return False
        if not same:
            return False
    return True


# -- where it was measured ----------------------------------------------------------------------------------------


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """The CPU model, cores and platform (as bench/results record them)."""
    info: dict[str, Any] = {"platform": platform.platform(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info.setdefault("cpu", platform.processor() or platform.machine())
    return info


def versions() -> dict[str, str]:
    """ksearch (and its commit when run from a checkout), Python, NumPy, the C compiler."""
    import numpy

    out = {"ksearch": __version__, "python": sys.version.split()[0], "numpy": numpy.__version__}
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here,
                                timeout=10)
        if commit.returncode == 0 and commit.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, cwd=here, timeout=10)
            out["commit"] = commit.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        cc = subprocess.run([config.c_compiler(), "--version"], capture_output=True, text=True, timeout=10)
        if cc.stdout:
            out["cc"] = cc.stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return out
