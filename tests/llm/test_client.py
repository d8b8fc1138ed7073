"""LLMClient: retries and backoff, the clean stop, budgets, replay, the call record; the price table; no API key
in any record or error."""

import random

import pytest

from ksearch.errors import ConfigError, LLMBudgetExhausted, LLMError, LLMUnavailable, TransientLLMError
from ksearch.llm.backends import AnthropicBackend, OpenAIBackend, call_purpose
from ksearch.llm.base import LLMCall, LLMReply, Message, Usage, prompt_hash
from ksearch.llm.client import Budget, LLMClient, is_truncated
from ksearch.llm.prices import Price, Prices
from tests.llm.fakes import (Garbage, ScriptedAnthropicServer, ScriptedBackend, ScriptedOpenAIServer, Status,
                             Truncated)

MSGS = [Message(role="system", content="sys"), Message(role="user", content="plan the next step")]
KEY = "sk-live-TOPSECRET-9f8e7d6c5b4a"


class Waits(list):
    def __call__(self, s):
        self.append(s)


class FixedRng:
    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def reply(text="ok", inp=1000, out=500, finish="stop", model=""):
    return LLMReply(text=text, usage=Usage(input_tokens=inp, output_tokens=out), model=model,
                    finish_reason=finish)


def make(script, records=None, **kw):
    backend = kw.pop("backend", None) or ScriptedBackend(script, name=kw.pop("name", "openai"))
    kw.setdefault("sleep", Waits())
    kw.setdefault("rng", FixedRng(0.0))
    kw.setdefault("prices", Prices.load())
    return LLMClient(backend, record=(records.append if records is not None else None), **kw), backend


# -- retries ---------------------------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_cap():
    down = [TransientLLMError("HTTP 503")] * 6
    client, backend = make(down + ["ok"], retries=6, backoff_s=1.0, max_backoff_s=10.0)
    assert client.ask("planner", "plan:initial", MSGS, model="gpt-4o").text == "ok"
    assert client.sleep == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]  # 1, 2, 4, 8, 10, 10 s times jitter 0.5
    client, _ = make(down[:3] + ["ok"], rng=FixedRng(1.0))
    client.ask("planner", "plan:initial", MSGS, model="gpt-4o")
    assert client.sleep == [1.0, 2.0, 4.0]  # jitter factor 1.0 at its top


def test_seeded_jitter_is_reproducible():
    waits = []
    for _ in range(2):
        client, _ = make([TransientLLMError("x")] * 3 + ["ok"], rng=random.Random(7))
        client.ask("planner", "p", MSGS, model="gpt-4o")
        waits.append(client.sleep)
    assert waits[0] == waits[1] and all(0.5 * b <= w < b for w, b in zip(waits[0], (1, 2, 4)))


def test_retry_after_lengthens_a_wait_and_a_huge_one_stops_at_once():
    client, _ = make([TransientLLMError("429", retry_after_s=12.0), "ok"])
    client.ask("planner", "p", MSGS, model="gpt-4o")
    assert client.sleep == [12.0]
    records = []
    client, backend = make([TransientLLMError("429 quota", retry_after_s=86400.0), "never"], records)
    with pytest.raises(LLMUnavailable, match="after 1 attempts.*asks to wait 86400 s"):
        client.ask("planner", "p", MSGS, model="gpt-4o")
    assert client.sleep == [] and len(backend.calls) == 1


def test_unavailable_after_the_retries_is_recorded():
    records = []
    client, backend = make([], records, retries=3,
                           backend=ScriptedBackend([TransientLLMError("HTTP 502: bad gateway")] * 4, name="openai"))
    with pytest.raises(LLMUnavailable) as ei:
        client.ask("coder", "code:improve", MSGS, model="gpt-4o", node_id="n7")
    assert str(ei.value) == ("the openai endpoint (gpt-4o) stayed down after 4 attempts: last error: "
                             "HTTP 502: bad gateway")
    assert len(backend.calls) == 4 and client.sleep == [0.5, 1.0, 2.0]
    (call,) = records
    assert call.error == "stayed down after 4 attempts: HTTP 502: bad gateway" and call.reply is None
    assert call.attempts == 4 and call.node_id == "n7" and call.purpose == "code:improve"
    assert call.prompt_hash == prompt_hash(MSGS, "gpt-4o") and call.cost_usd is None


def test_final_error_is_recorded_and_not_retried():
    records = []
    client, backend = make([LLMError("HTTP 401: invalid key"), "never"], records)
    with pytest.raises(LLMError, match="401"):
        client.ask("planner", "p", MSGS, model="gpt-4o")
    assert len(backend.calls) == 1 and records[0].error == "HTTP 401: invalid key" and records[0].attempts == 1


def test_the_backend_gets_the_settings_and_sees_the_purpose():
    seen = []

    class Spy(ScriptedBackend):
        def complete(self, messages, **kw):
            seen.append(call_purpose.get())
            return super().complete(messages, **kw)

    client, _ = make([], backend=Spy(["ok"], name="openai"), timeout_s=33.0, temperature=0.7)
    client.ask("coder", "code:debug", MSGS, model="gpt-4o", max_tokens=1234)
    assert seen == ["code:debug"] and call_purpose.get() is None
    call = client.backend.calls[0]
    assert (call["max_tokens"], call["temperature"], call["timeout_s"]) == (1234, 0.7, 33.0)


# -- success, cost, budget ---------------------------------------------------------------------------------


def test_success_is_priced_and_recorded():
    records = []
    client, _ = make([reply(inp=1_000_000, out=100_000)], records)
    out = client.ask("planner", "plan:initial", MSGS, model="gpt-4o")
    assert out.text == "ok"
    (call,) = records
    assert call.cost_usd == pytest.approx(2.50 + 1.00) and call.usage.total == 1_100_000
    assert call.backend == "openai" and call.model == "gpt-4o" and call.messages == MSGS and not call.replayed
    assert client.budget.spent_usd == pytest.approx(3.5) and client.budget.spent_tokens == 1_100_000


def test_unknown_model_counts_tokens_but_no_cost():
    records = []
    client, _ = make([reply(model="my-finetune"), reply(model="gpt-4o-2024-08-06")], records)
    client.ask("planner", "p", MSGS, model="my-finetune")
    assert records[0].cost_usd is None and client.budget.spent_tokens == 1500 and client.budget.spent_usd == 0
    assert client.budget.unpriced_calls == 1
    # an alias the table does not know is priced by the model the provider says answered
    client.ask("planner", "p", MSGS, model="openrouter/auto")
    assert records[1].cost_usd == pytest.approx((1000 * 2.5 + 500 * 10) / 1e6)


def test_truncated_reply_is_returned_and_flagged():
    records = []
    client, _ = make([reply("half a kern", finish="length")], records)
    assert client.ask("coder", "code:first", MSGS, model="gpt-4o").text == "half a kern"
    assert records[0].finish_reason == "length" and is_truncated(records[0].finish_reason)
    assert is_truncated("max_tokens") and not is_truncated("stop") and not is_truncated(None)


def test_a_reply_far_longer_than_asked_is_cut_and_flagged():
    """A command that printed 100 MB (or a 40 MB kernel) was kept whole in every record: a 10-evaluation run
    store grew to 2.6 GB, and the kernel went into later prompts. Now cut at reply_limit, flagged truncated,
    its tokens still counted whole."""
    from ksearch.llm.client import reply_limit

    records = []
    huge = "```c\nvoid run(void) {}\n```\n" + "log line\n" * 200_000
    client, _ = make([reply(huge, inp=0, out=0, finish=None)], records, name="command")  # no usage reported
    got = client.ask("coder", "code:first", MSGS, model="agent", max_tokens=8192)
    assert len(got.text) == reply_limit(8192) == 16 * 8192 and got.text == huge[:16 * 8192]
    assert got.finish_reason == "length" and records[0].finish_reason == "length"
    assert len(records[0].reply) == 16 * 8192
    assert records[0].usage.output_tokens == round(len(huge) / 4)  # what was produced, not what was kept
    client, _ = make(["x" * 70_000], records)
    assert client.ask("planner", "p", MSGS, model="gpt-4o", max_tokens=10).finish_reason == "length"
    assert len(records[-1].reply) == 65_536  # the floor for small limits
    client, _ = make(["short"], records)
    assert client.ask("planner", "p", MSGS, model="gpt-4o", max_tokens=10).finish_reason == "stop"


def test_budget_by_cost_lets_the_crossing_call_through_then_refuses():
    prices = Prices({"m": Price(1.0, 1.0)})  # $1 per million tokens
    client, backend = make([reply(inp=600_000, out=0), reply(inp=600_000, out=0), "never"], prices=prices,
                           budget=Budget(max_cost_usd=1.0))
    client.ask("planner", "p1", MSGS, model="m")
    client.ask("planner", "p2", MSGS[1:], model="m")  # $0.60 spent before: allowed, crosses to $1.20
    with pytest.raises(LLMBudgetExhausted, match=r"cost limit is reached: \$1.2000 spent of --max-cost \$1"):
        client.ask("planner", "p3", [Message(role="user", content="more")], model="m")
    assert len(backend.calls) == 2


def test_budget_by_tokens():
    client, backend = make([reply(inp=700, out=300), "never"], budget=Budget(max_tokens=1000))
    client.ask("planner", "p", MSGS, model="local-model")
    with pytest.raises(LLMBudgetExhausted, match="token limit is reached: 1000 tokens spent of --max-tokens 1000"):
        client.ask("planner", "p", MSGS[1:], model="local-model")
    assert len(backend.calls) == 1


def test_budget_seeded_from_recorded_calls_refuses_before_calling():
    paid = LLMCall(role="coder", purpose="code:first", backend="openai", model="gpt-4o", messages=MSGS,
                   prompt_hash="h", reply="x", usage=Usage(input_tokens=400, output_tokens=100), cost_usd=0.75)
    free = paid.model_copy(update={"replayed": True, "cost_usd": 0.0})
    budget = Budget.from_calls([paid, paid, free], max_cost_usd=1.5)
    assert budget.spent_usd == pytest.approx(1.5) and budget.spent_tokens == 1000
    client, backend = make(["never"], budget=budget)
    with pytest.raises(LLMBudgetExhausted):
        client.ask("coder", "code:first", MSGS, model="gpt-4o")
    assert backend.calls == []
    assert Budget(max_tokens=10, spent_tokens=10).exhausted() is not None
    assert Budget(max_cost_usd=2.0, spent_usd=1.0).exhausted() is None


def test_max_cost_with_an_unpriced_model_is_a_config_error():
    client, backend = make(["never"], budget=Budget(max_cost_usd=5.0))
    with pytest.raises(ConfigError, match="'my-finetune' has no price.*--prices"):
        client.ask("planner", "p", MSGS, model="my-finetune")
    assert backend.calls == []
    # command and queue backends report no usage: no price needed
    client, _ = make(["fine"], name="command", budget=Budget(max_cost_usd=5.0))
    assert client.ask("planner", "p", MSGS, model="claude-code").text == "fine"


# -- replay ----------------------------------------------------------------------------------------------------


def test_replay_of_a_recorded_call():
    records = []
    client, _ = make([reply("first answer", finish="length")], records)
    client.ask("planner", "plan:initial", MSGS, model="gpt-4o", node_id="n1")
    store = {c.prompt_hash: c for c in records}
    # a resumed run: same question, budget already spent, the backend must not be called
    resumed, backend = make([], records, replay=store.get, budget=Budget(max_tokens=1, spent_tokens=5))
    out = resumed.ask("planner", "plan:initial", MSGS, model="gpt-4o", node_id="n1")
    assert out.text == "first answer" and out.finish_reason == "length" and backend.calls == []
    again = records[-1]
    assert again.replayed and again.cost_usd == 0.0 and again.usage.total == 0 and again.reply == "first answer"
    assert again.prompt_hash == records[0].prompt_hash and again.node_id == "n1"
    assert resumed.budget.spent_tokens == 5
    # another question is not replayed (and here the budget refuses it)
    with pytest.raises(LLMBudgetExhausted):
        resumed.ask("planner", "plan:initial", MSGS, model="gpt-4o-mini")


def test_a_failed_call_is_not_replayed():
    failed = LLMCall(role="planner", purpose="p", backend="openai", model="gpt-4o", messages=MSGS,
                     prompt_hash=prompt_hash(MSGS, "gpt-4o"), error="stayed down")
    records = []
    client, backend = make(["fresh"], records, replay=lambda h: failed if h == failed.prompt_hash else None)
    assert client.ask("planner", "p", MSGS, model="gpt-4o").text == "fresh"
    assert len(backend.calls) == 1 and not records[0].replayed


# -- prices ----------------------------------------------------------------------------------------------------


def test_price_lookup():
    p = Prices.load()
    assert p.lookup("gpt-4o") == Price(2.50, 10.00, "openai", cached_input_per_mtok=1.25)
    assert p.lookup("gpt-4o-2024-08-06").input_per_mtok == 2.50
    assert p.lookup("gpt-4o-2024-05-13").input_per_mtok == 5.00  # exact beats prefix
    assert p.lookup("gpt-4o-mini-2024-07-18").input_per_mtok == 0.15  # longest prefix
    assert p.lookup("claude-sonnet-4-20250514").output_per_mtok == 15.00
    assert p.lookup("claude-opus-4-1-20250805").output_per_mtok == 75.00
    assert p.lookup("claude-3-5-sonnet-latest").input_per_mtok == 3.00
    assert p.lookup("anthropic/claude-3.5-sonnet").input_per_mtok == 3.00
    assert p.lookup("models/gemini-2.0-flash").input_per_mtok == 0.10
    assert p.lookup("google/gemini-2.5-pro").output_per_mtok == 10.00
    assert p.lookup("gpt-4-0613").input_per_mtok == 30.00
    # a newer or different model is unknown rather than priced like an older one
    for name in ("claude-opus-4-6", "gpt-5.1", "gpt-4o-audio-preview", "gpt-4.5", "llama3:8b", "qwen2.5-coder"):
        assert p.lookup(name) is None, name
    assert p.cost("gpt-4o-mini", Usage(input_tokens=2_000_000, output_tokens=1_000_000)) == pytest.approx(0.9)
    assert p.cost("nope", Usage(input_tokens=5)) is None
    assert "2025" in p.as_of


def test_price_override_merges_over_the_builtin(tmp_path):
    f = tmp_path / "prices.yaml"
    f.write_text("models:\n  gpt-4o: {input: 1, output: 2, source: contract}\n  qwen2.5-coder: {input: 0, "
                 "output: 0}\n")
    p = Prices.load(f)
    assert p.lookup("gpt-4o") == Price(1.0, 2.0, "contract")
    assert p.lookup("qwen2.5-coder:32b") == Price(0.0, 0.0, str(f))
    assert p.lookup("gpt-4o-mini").input_per_mtok == 0.15  # the rest of the built-in table stays
    (tmp_path / "bare.yaml").write_text("my-model: {input: 3, output: 4}\n")
    assert Prices.load(tmp_path / "bare.yaml").lookup("my-model") == Price(3.0, 4.0, str(tmp_path / "bare.yaml"))


def test_price_of_cache_reads_and_writes():
    """Uncached input at input, cache reads at cached_input, cache writes at cache_write, output at output; a
    rate the price does not give is charged as input."""
    usage = Usage(input_tokens=10_000, cache_read_tokens=6_000, cache_write_tokens=3_000, output_tokens=500)
    assert usage.uncached_input_tokens == 1_000
    full = Price(3.0, 15.0, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75)
    assert full.cost(usage) == pytest.approx((1_000 * 3.0 + 6_000 * 0.3 + 3_000 * 3.75 + 500 * 15.0) / 1e6)
    reads_only = Price(2.0, 8.0, cached_input_per_mtok=0.5)
    assert reads_only.cost(usage) == pytest.approx((4_000 * 2.0 + 6_000 * 0.5 + 500 * 8.0) / 1e6)
    plain = Price(2.0, 8.0)
    assert plain.cost(usage) == pytest.approx((10_000 * 2.0 + 500 * 8.0) / 1e6)
    assert plain.cost(Usage(input_tokens=10_000, output_tokens=500)) == plain.cost(usage)
    # the built-in table: Anthropic reads 0.1x and writes 1.25x input; OpenAI per model; Gemini 2.5 25%
    p = Prices.load()
    sonnet = p.lookup("claude-sonnet-4-5-20250929")
    assert (sonnet.cached_input_per_mtok, sonnet.cache_write_per_mtok) == (pytest.approx(0.3), pytest.approx(3.75))
    assert p.lookup("gpt-4o").cached_input_per_mtok == 1.25 and p.lookup("gpt-4.1").cached_input_per_mtok == 0.5
    assert p.lookup("gpt-5").cached_input_per_mtok == 0.125 and p.lookup("gpt-5").cache_write_per_mtok is None
    assert p.lookup("gemini-2.5-flash").cached_input_per_mtok == 0.075
    assert p.lookup("gpt-4-turbo").cached_input_per_mtok is None  # no discount: charged as input
    for name, price in p.table.items():
        for rate in (price.cached_input_per_mtok, price.cache_write_per_mtok):
            assert rate is None or 0 <= rate, name
        assert price.cached_input_per_mtok is None or price.cached_input_per_mtok < price.input_per_mtok, name


def test_cached_tokens_are_part_of_the_input():
    with pytest.raises(ValueError, match="part of input_tokens"):
        Usage(input_tokens=100, cache_read_tokens=80, cache_write_tokens=30)
    assert Usage(input_tokens=100, cache_read_tokens=70, cache_write_tokens=30).uncached_input_tokens == 0


def test_cache_rates_from_a_price_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("models:\n  my-model: {input: 1, cached_input: 0.1, cache_write: 1.25, output: 2}\n"
                 "  claude-sonnet-4-5: {input: 2, output: 10}\n")
    p = Prices.load(f)
    assert p.lookup("my-model") == Price(1.0, 2.0, str(f), 0.1, 1.25)
    assert p.lookup("claude-sonnet-4-5").cached_input_per_mtok is None  # an override replaces the entry whole
    usage = Usage(input_tokens=1_000_000, cache_read_tokens=1_000_000)
    assert p.cost("my-model", usage) == pytest.approx(0.1) and p.cost("claude-sonnet-4-5", usage) == 2.0


@pytest.mark.parametrize("text,match", [("models:\n  m: {input: 1}\n", "needs `input` and `output`"),
                                        ("models:\n  m: {input: x, output: 1}\n", "must be numbers"),
                                        ("models:\n  m: {input: -1, output: 1}\n", "negative"),
                                        ("models:\n  m: {input: 1, output: 1, cached_input: -1}\n", "negative"),
                                        ("models:\n  m: {input: 1, output: 1, cache_write: x}\n",
                                         "must be numbers.*cache_write='x'"),
                                        ("models:\n  m: {input: 1, output: 1, cache_read: 0.1}\n",
                                         "unknown key.*cache_read"),
                                        ("models: [1, 2]\n", "must map model names"),
                                        ("models: {a: [\n", "not valid YAML")])
def test_bad_price_files(tmp_path, text, match):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Prices.load(f)
    with pytest.raises(ConfigError, match="cannot be read"):
        Prices.load(tmp_path / "missing.yaml")


# -- the key never leaks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("server,backend,model", [(ScriptedOpenAIServer, OpenAIBackend, "gpt-4o"),
                                                  (ScriptedAnthropicServer, AnthropicBackend, "claude-haiku-4-5")])
def test_no_record_or_error_contains_the_api_key(server, backend, model):
    records, errors = [], []
    script = ["fine", Truncated("cut"), Garbage(body=f"<html>{KEY}</html>", content_type="text/html"),
              Status(500, message=f"upstream rejected key {KEY}"), Status(500, message=f"still {KEY}")]
    with server(script) as srv:
        b = backend(srv.base_url, KEY)
        client, _ = make([], records, backend=b, retries=2, timeout_s=5)
        for i in range(3):
            try:
                client.ask("planner", f"p{i}", [Message(role="user", content=f"q{i}")], model=model)
            except LLMError as e:
                errors.append(e)
        assert all(h.get("authorization") == f"Bearer {KEY}" or h.get("x-api-key") == KEY for h in srv.headers)
    assert len(records) == 3 and [type(e) for e in errors] == [LLMUnavailable]
    texts = [c.model_dump_json() for c in records] + [str(e) for e in errors] + [repr(e) for e in errors] + \
        [repr(b), repr(client.budget)]
    assert any("[api key]" in t for t in texts)
    for t in texts:
        assert KEY not in t
    with server([Status(401, message=f"Incorrect API key provided: {KEY}")]) as srv:
        with pytest.raises(LLMError) as ei:
            backend(srv.base_url, KEY).complete(MSGS, model=model, max_tokens=5, temperature=0, timeout_s=5)
    assert "HTTP 401" in str(ei.value) and KEY not in str(ei.value) and ei.value.__cause__ is None


# -- the whole call bounded ------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers"])
def test_an_endpoint_that_trickles_is_cut_at_the_timeout_not_per_read(headers):
    """A server writing one byte a second answers every read in time: the SDKs' per-read timeouts held such a call
    200 s against a 20 s --llm-timeout. Each attempt ends at the timeout (body or headers trickled), its connection
    closed, and every attempt is announced as it starts. (The anthropic backend is cut the same way: `bounded` and
    its ``abort`` are the openai backend's; its SDK takes ~5 s to import here.)"""
    import time

    from tests.llm.fakes import Trickle

    started, records = [], []
    with ScriptedOpenAIServer([], default=Trickle(interval=0.5, headers=headers)) as srv:
        client, _ = make([], records, backend=OpenAIBackend(srv.base_url, KEY), timeout_s=1.0, retries=1,
                         on_start=started.append)
        t0 = time.monotonic()
        with pytest.raises(LLMUnavailable, match="no complete reply within 1 s"):
            client.ask("planner", "plan:refine", MSGS, model="gpt-4o")
        took = time.monotonic() - t0
        deadline = time.monotonic() + 3
        while srv.hung_up < 1 and time.monotonic() < deadline:  # the cut connection is closed, not left trickling
            time.sleep(0.05)
        assert srv.hung_up >= 1
    assert 2.0 <= took < 3.5  # two attempts of 1 s (no backoff here), not the minutes the body would take
    assert len(started) == 2 and "plan:refine" in started[0] and "attempt 2" in started[1]
    assert len(records) == 1 and records[0].attempts == 2 and "no complete reply" in records[0].error


def test_a_backend_that_bounds_its_own_call_is_not_put_in_a_thread():
    """The command and queue backends end their calls themselves (a killed program, a file wait): their timeout
    message is theirs, and their errors arrive as they raise them."""
    from ksearch.llm.backends import CommandBackend, QueueBackend
    from ksearch.llm.client import bounded

    assert CommandBackend.bounds_total_time and QueueBackend.bounds_total_time
    backend = ScriptedBackend([TransientLLMError("queue: no reply in x.reply.md within 0.1 s")])
    backend.bounds_total_time = True
    with pytest.raises(TransientLLMError, match="queue: no reply"):
        bounded(backend, MSGS, model="m", max_tokens=5, temperature=0, timeout_s=0.1)
    threaded = ScriptedBackend([LLMError("HTTP 401"), "ok"])
    with pytest.raises(LLMError, match="HTTP 401"):  # an error in the helper thread is raised in the caller's
        bounded(threaded, MSGS, model="m", max_tokens=5, temperature=0, timeout_s=5)
    token = call_purpose.set("code:debug")
    try:  # the call's purpose reaches a backend in the helper thread
        seen = []
        probe = ScriptedBackend(["ok"])
        probe.complete = lambda *a, **k: seen.append(call_purpose.get()) or reply()
        bounded(probe, MSGS, model="m", max_tokens=5, temperature=0, timeout_s=5)
    finally:
        call_purpose.reset(token)
    assert seen == ["code:debug"]
