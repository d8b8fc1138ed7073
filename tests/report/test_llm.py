"""Tests for ksearch.report.llm (``ksearch show RUN --llm``): the totals and the table, cached tokens and how the
tokens of backends that report none were counted."""

from rich.console import Console

from ksearch.llm.base import LLMCall, Message, Usage
from ksearch.report.llm import llm_table, llm_totals


def _call(inp=0, out=0, read=0, write=0, counted_by="provider", cost=None, replayed=False, error=None) -> LLMCall:
    return LLMCall(role="planner", purpose="plan:refine", backend="anthropic", model="claude-sonnet-4-5",
                   messages=[Message(role="user", content="x")], prompt_hash="h", reply=None if error else "ok",
                   usage=Usage(input_tokens=inp, output_tokens=out, cache_read_tokens=read, cache_write_tokens=write),
                   usage_counted_by=counted_by, cost_usd=cost, replayed=replayed, error=error)


def _text(table) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_totals_carry_cache_reads_and_writes_of_paid_calls():
    calls = [_call(6050, 200, write=6000, cost=0.03), _call(6070, 100, read=6000, cost=0.004),
             _call(6070, 100, read=6000, replayed=True, cost=0.0)]
    tot = llm_totals(calls)
    assert (tot["input_tokens"], tot["output_tokens"]) == (12_120, 300)
    assert (tot["cache_read_tokens"], tot["cache_write_tokens"]) == (6000, 6000)  # the replay paid nothing
    assert tot["counted_by"] == [] and tot["replayed"] == 1


def test_the_table_shows_cached_tokens_with_writes_where_any():
    text = _text(llm_table([_call(6050, 200, write=6000, cost=0.03), _call(6070, 100, read=6000, cost=0.004)]))
    assert "cached r+w" in text
    assert "0+6000w" in text and "6000+0w" in text and "6000+6000w" in text  # the rows and the total
    text = _text(llm_table([_call(2000, 10, read=1536, cost=0.001)]))  # no writes (OpenAI): reads alone
    assert "cached" in text and "r+w" not in text and "1536" in text and "1536+" not in text


def test_the_table_says_how_unreported_tokens_were_counted():
    text = _text(llm_table([_call(12, 5, counted_by="estimate"), _call(14, 10, counted_by="hf:tokenizer.json")]))
    assert "~12" in text and "~5" in text  # ~ still means estimated
    assert "14" in text and "~14" not in text  # a tokenizer's count is not an estimate
    assert "~ estimated at ~4 characters a token" in text and "counted by hf:tokenizer.json" in text
    assert llm_totals([_call(1, 1, counted_by="hf:tokenizer.json")])["counted_by"] == ["hf:tokenizer.json"]
    assert "counted by" not in _text(llm_table([_call(1, 1)]))  # provider counts need no note
