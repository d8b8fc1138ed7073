"""Terminal tables and JSON summaries of evaluations."""

from __future__ import annotations

from rich.table import Table

from ksearch.records import Evaluation, Status


def _f(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def paired_text(p, with_rounds: bool = True) -> str:
    """A paired comparison in a few words, e.g. ``1.27x [1.11, 1.45] faster (24 rounds)`` (ratio = reference time /
    candidate time; the interval at the judge's confidence; ``no interval`` with too few rounds)."""
    if p is None or p.ratio is None:
        return "—" if p is None else f"— ({p.note[:60]})" if p.note else "—"
    iv = f" [{p.lo:.3g}, {p.hi:.3g}]" if p.lo is not None and p.hi is not None else ""
    verdict = p.verdict or "no interval"
    return f"{p.ratio:.3g}x{iv} {verdict}" + (f" ({p.n} rounds)" if with_rounds else "")


def evaluation_table(ev: Evaluation, title: str = "") -> Table:
    """One row per workload: status, errors, median time ± spread, GB/s, % of floor, speedup vs naive, and each
    paired comparison (ratio, its interval and verdict), with the load while timing when the machine was busy."""
    table = Table(title=title or f"{ev.task} · {ev.candidate_id}")
    roles = list(dict.fromkeys(p.role for r in ev.workloads for p in r.paired))
    for col, just in (("workload", "left"), ("status", "left"), ("max abs err", "right"), ("max rel err", "right"),
                      ("median ms", "right"), ("spread", "right"), ("GB/s", "right"), ("floor ms", "right"),
                      ("% of floor", "right"), ("vs naive", "right"), *((f"vs {r} (paired)", "right") for r in roles)):
        table.add_column(col, justify=just, no_wrap=col in ("workload", "status"))
    for r in ev.workloads:
        style = "green" if r.status is Status.PASSED else ("dim" if r.status is Status.SKIPPED else "red")
        by_role = {p.role: p for p in r.paired}
        busy = f" [yellow](load {r.load_cores:.1f})[/]" if r.load_cores and r.load_cores > 0.5 else ""
        table.add_row(
            r.workload, f"[{style}]{r.status.value}[/]", _f(r.max_abs_err, ".2e"), _f(r.max_rel_err, ".2e"),
            _f(r.median_ms, ".4g") + busy, "—" if r.spread is None else f"±{100 * r.spread:.1f}%",
            _f(r.achieved_gbs, ".2f"), "—" if r.floor_ms is None else f"{r.floor_ms:.4g} ({r.bound})",
            _f(r.pct_of_floor, ".1f"), "—" if r.speedup_vs_naive is None else f"{r.speedup_vs_naive:.2f}x",
            *(paired_text(by_role.get(role)) for role in roles),
        )
    captions = []
    if ev.paired and len(ev.workloads) > 1:
        captions.append("over the timed workloads: " + "; ".join(f"vs {p.role} {paired_text(p)}" for p in ev.paired))
    sources = list(dict.fromkeys(r.floor_source for r in ev.workloads if r.floor_source))
    if sources:  # the task's cost model, torch's FLOP counter on the reference, or bytes only
        from ksearch.tasks.definition import join_cost_sources

        captions.append("floor from: " + join_cost_sources(sources))
    table.caption = "\n".join(captions) or None
    return table


def ceilings_lines(hw) -> list[str]:
    """Where the roofline floors come from: each measured ceiling and how it was measured."""
    if hw is None:
        return ["roofline: no hardware spec, no floor"]
    lines = [f"roofline floor = max(bytes / bandwidth, FLOPs / peak (FP32, or the tensor-core peak where the task's "
             f"FLOPs can use it), exps / exp rate) on {hw.name} "
             f"({hw.model}, {hw.cores} cores), ceilings from {hw.source}:"]
    m = hw.measured
    rows = [("memory bandwidth", f"{hw.memory_bandwidth_gbs:.1f} GB/s", m.get("memory_bandwidth_gbs")),
            ("peak FP32", f"{hw.peak_flops.get('float32', 0) / 1e9:.1f} GFLOP/s", m.get("peak_flops.float32")
             or m.get("peak_flops")),
            ("exp rate", "—" if not hw.exp_rate_per_s else f"{hw.exp_rate_per_s / 1e9:.2f} G exp/s",
             m.get("exp_rate_per_s"))]
    for label, value, how in rows:
        detail = ""
        if how is not None:
            size = "" if not how.bytes else (f", {how.bytes / 1e6:.0f} MB" if how.bytes >= 1e6
                                             else f", {how.bytes / 1e3:.0f} KB")
            detail = f"  ({how.probe}, {how.threads} threads, best of {how.repeats}{size})"
        lines.append(f"  {label}: {value}{detail}")
    return lines


def evaluation_json(ev: Evaluation, hw=None) -> dict:
    """The evaluation as one JSON-able object: task, target, hardware, and per-workload figures."""
    return {
        "task": ev.task,
        "target": ev.target,
        "hardware": None if hw is None else {
            "name": hw.name, "model": hw.model, "memory_bandwidth_gbs": hw.memory_bandwidth_gbs,
            "peak_flops_fp32": hw.peak_flops.get("float32"), "exp_rate_per_s": hw.exp_rate_per_s,
            "source": hw.source},
        "candidate_id": ev.candidate_id,
        "status": ev.status.value,
        "message": ev.message,
        "workloads": [
            {"name": r.workload, "status": r.status.value, "max_abs_err": r.max_abs_err,
             "max_rel_err": r.max_rel_err, "median_ms": r.median_ms, "spread": r.spread,
             "achieved_gbs": r.achieved_gbs, "floor_ms": r.floor_ms, "bound": r.bound, "floor_source": r.floor_source,
             "pct_of_floor": r.pct_of_floor, "speedup_vs_naive": r.speedup_vs_naive, "message": r.message,
             "median_interval_ms": r.ci_ms, "repeats": r.repeats, "clock": r.clock, "load_cores": r.load_cores,
             "paired": [p.model_dump(mode="json") for p in r.paired]}
            for r in ev.workloads
        ],
        "paired": [p.model_dump(mode="json") for p in ev.paired],
        "infra_faults": ev.infra_faults,
        "sandbox": ev.sandbox,
    }


def wide_console(**kwargs):
    """A rich Console at least 120 columns wide, so tables keep one line per row when piped."""
    import shutil

    from rich.console import Console

    return Console(width=max(120, shutil.get_terminal_size((120, 24)).columns), **kwargs)
