"""The llm proposer's calls as a table (``ksearch show RUN --llm``): who asked what, tokens, latency, cost."""

from __future__ import annotations

from rich.table import Table

from ksearch.llm.base import is_truncated


def call_status(call) -> str:
    """ok | replayed | truncated | error: <first line>."""
    if call.error:
        return "error: " + call.error.splitlines()[0][:60]
    if call.replayed:
        return "replayed"
    if is_truncated(call.finish_reason):
        return "truncated"
    return "ok"


def llm_totals(calls) -> dict:
    """Calls, paid tokens (input, output), USD (None when no call had a known price), seconds waiting."""
    paid = [c for c in calls if not c.replayed]
    costs = [c.cost_usd for c in paid if c.cost_usd is not None]
    return {"calls": len(calls), "replayed": len(calls) - len(paid), "errors": sum(1 for c in calls if c.error),
            "input_tokens": sum(c.usage.input_tokens for c in paid),
            "output_tokens": sum(c.usage.output_tokens for c in paid),
            "cost_usd": sum(costs) if costs else None, "latency_s": sum(c.latency_s for c in paid)}


def llm_table(calls) -> Table:
    """One row per call, oldest first, and a totals row (``~``: tokens estimated from the text)."""
    t = Table(title=f"LLM calls ({len(calls)})")
    for col, right in (("#", True), ("role", False), ("purpose", False), ("node", False), ("model", False),
                       ("in tok", True), ("out tok", True), ("s", True), ("USD", True), ("tries", True),
                       ("status", False)):
        t.add_column(col, justify="right" if right else "left", no_wrap=col != "status")
    for i, c in enumerate(calls, 1):
        est = "~" if c.usage_estimated else ""
        t.add_row(str(i), c.role, c.purpose, c.node_id or "", c.model, f"{est}{c.usage.input_tokens}",
                  f"{est}{c.usage.output_tokens}", f"{c.latency_s:.1f}",
                  "—" if c.cost_usd is None else f"{c.cost_usd:.4f}", str(c.attempts), call_status(c))
    tot = llm_totals(calls)
    t.add_section()
    t.add_row("", "total", f"{tot['replayed']} replayed, {tot['errors']} failed", "", "", str(tot["input_tokens"]),
              str(tot["output_tokens"]), f"{tot['latency_s']:.1f}",
              "—" if tot["cost_usd"] is None else f"{tot['cost_usd']:.4f}", "", "")
    return t
