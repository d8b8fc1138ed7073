"""The llm proposer's calls as a table (``ksearch show RUN --llm``): who asked what, tokens (and how many came
from the provider's prompt cache), latency, cost."""

from __future__ import annotations

from rich.table import Table

from ksearch.llm.base import PROVIDER, is_truncated


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
    """Calls, paid tokens (input, output; ``cache_read_tokens`` / ``cache_write_tokens``: the part of the input
    read from / written to the provider's prompt cache), USD (None when no call had a known price), seconds
    waiting, and ``counted_by``: what counted the tokens of calls whose backend reported none (tokenizer names,
    e.g. ["tiktoken:o200k_base"] or ["estimate"]; [] when the provider reported every count)."""
    paid = [c for c in calls if not c.replayed]
    costs = [c.cost_usd for c in paid if c.cost_usd is not None]
    return {"calls": len(calls), "replayed": len(calls) - len(paid), "errors": sum(1 for c in calls if c.error),
            "input_tokens": sum(c.usage.input_tokens for c in paid),
            "output_tokens": sum(c.usage.output_tokens for c in paid),
            "cache_read_tokens": sum(c.usage.cache_read_tokens for c in paid),
            "cache_write_tokens": sum(c.usage.cache_write_tokens for c in paid),
            "cost_usd": sum(costs) if costs else None, "latency_s": sum(c.latency_s for c in paid),
            "counted_by": sorted({c.usage_counted_by for c in paid if c.error is None} - {PROVIDER})}


def _cached(read: int, written: int, writes: bool) -> str:
    """Cache reads, and ``+N w`` (tokens written) in a run where any call wrote to the cache."""
    return f"{read}+{written}w" if writes else str(read)


def llm_table(calls) -> Table:
    """One row per call, oldest first, and a totals row. ``~``: tokens estimated from the text (no tokenizer);
    "cached": the input tokens read from the provider's prompt cache; "cached r+w" (a run where a call wrote to
    the cache) shows ``read+writtenw``."""
    tot = llm_totals(calls)
    writes = tot["cache_write_tokens"] > 0
    counted = [n for n in tot["counted_by"] if n != "estimate"]
    notes = ["~ estimated at ~4 characters a token"] if "estimate" in tot["counted_by"] else []
    if counted:
        notes.append(f"tokens the backend did not report counted by {', '.join(counted)}")
    t = Table(title=f"LLM calls ({len(calls)})", caption="; ".join(notes) or None)
    for col, right in (("#", True), ("role", False), ("purpose", False), ("node", False), ("model", False),
                       ("in tok", True), ("cached r+w" if writes else "cached", True), ("out tok", True), ("s", True),
                       ("USD", True),
                       ("tries", True), ("status", False)):
        t.add_column(col, justify="right" if right else "left", no_wrap=col != "status")
    for i, c in enumerate(calls, 1):
        est = "~" if c.usage_estimated else ""
        t.add_row(str(i), c.role, c.purpose, c.node_id or "", c.model, f"{est}{c.usage.input_tokens}",
                  _cached(c.usage.cache_read_tokens, c.usage.cache_write_tokens, writes),
                  f"{est}{c.usage.output_tokens}", f"{c.latency_s:.1f}",
                  "—" if c.cost_usd is None else f"{c.cost_usd:.4f}", str(c.attempts), call_status(c))
    t.add_section()
    t.add_row("", "total", f"{tot['replayed']} replayed, {tot['errors']} failed", "", "", str(tot["input_tokens"]),
              _cached(tot["cache_read_tokens"], tot["cache_write_tokens"], writes), str(tot["output_tokens"]),
              f"{tot['latency_s']:.1f}", "—" if tot["cost_usd"] is None else f"{tot['cost_usd']:.4f}", "", "")
    return t
