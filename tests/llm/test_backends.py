"""Each backend against its fake: answers and usage, 429 / 500 / timeouts / garbage then success through the
client, truncated replies, final errors; make_backend; API keys."""

import json
import socket

import pytest

from ksearch.errors import ConfigError, LLMError, LLMUnavailable, TransientLLMError
from ksearch.llm import keys
from ksearch.llm.backends import (AnthropicBackend, CommandBackend, OpenAIBackend, QueueBackend, _retry_after,
                                  make_backend, render_plain)
from ksearch.llm.base import Message
from ksearch.llm.client import LLMClient, is_truncated
from ksearch.llm.prices import Prices
from tests.llm.fakes import (Delayed, Fail, Garbage, Hang, Killed, QueueResponder, Reply, ScriptedAnthropicServer,
                             ScriptedOpenAIServer, Status, Truncated, scripted_command)

KEY = "sk-test-SECRET-0123456789abcdef"
MSGS = [Message(role="system", content="You write CUDA kernels."), Message(role="user", content="Make it fast.")]

HTTP = [
    pytest.param(ScriptedOpenAIServer, OpenAIBackend, "gpt-4o", "stop", "length", id="openai"),
    pytest.param(ScriptedAnthropicServer, AnthropicBackend, "claude-haiku-4-5", "end_turn", "max_tokens",
                 id="anthropic"),
]


class Waits(list):
    def __call__(self, s):
        self.append(s)


class NoJitter:
    def random(self):
        return 0.0


def client_for(backend, records, **kw):
    kw.setdefault("sleep", Waits())
    kw.setdefault("rng", NoJitter())
    kw.setdefault("timeout_s", 0.5)
    return LLMClient(backend, prices=Prices.load(), record=records.append, **kw)


# -- OpenAI-compatible and Anthropic -------------------------------------------------------------------------


@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_success_with_usage(server, backend, model, stop, length):
    with server([Reply("__global__ void k() {}", input_tokens=120, output_tokens=30)]) as srv:
        reply = backend(srv.base_url, KEY).complete(MSGS, model=model, max_tokens=256, temperature=0.2,
                                                    timeout_s=5)
        assert reply.text == "__global__ void k() {}"
        assert (reply.usage.input_tokens, reply.usage.output_tokens) == (120, 30)
        assert reply.finish_reason == stop and reply.model == model and reply.latency_s > 0
        body = srv.requests[0]
        assert body["model"] == model and body["max_tokens"] == 256
        assert srv.headers[0].get("authorization") == f"Bearer {KEY}" or srv.headers[0].get("x-api-key") == KEY
        if backend is AnthropicBackend:
            assert body["system"] == [{"type": "text", "text": "You write CUDA kernels.",
                                       "cache_control": {"type": "ephemeral"}}]
            assert body["messages"] == [{"role": "user", "content": "Make it fast."}]
        else:
            assert body["temperature"] == 0.2
            assert [m["role"] for m in body["messages"]] == ["system", "user"]


@pytest.mark.parametrize("step", [Status(429, retry_after=0), Status(500), Status(503), Hang(3), Garbage(),
                                  Garbage(content_type="text/plain")],
                         ids=["429", "500", "503", "timeout", "garbage-json", "garbage-text"])
@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_transient_then_success(server, backend, model, stop, length, step):
    records = []
    with server([step, "ok"]) as srv:
        client = client_for(backend(srv.base_url, KEY), records)
        reply = client.ask("coder", "code:first", MSGS, model=model)
        assert reply.text == "ok" and len(srv.requests) == 2
    assert client.sleep == [0.5]  # one backoff (1 s x jitter 0.5), a Retry-After of 0 does not lengthen it
    (call,) = records
    assert call.attempts == 2 and call.error is None and call.reply == "ok"
    assert call.cost_usd == pytest.approx(Prices.load().lookup(model).cost(reply.usage))


@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_retry_after_is_honoured(server, backend, model, stop, length):
    with server([Status(429, retry_after=7), "ok"]) as srv:
        client = client_for(backend(srv.base_url, KEY), [])
        assert client.ask("planner", "plan:initial", MSGS, model=model).text == "ok"
    assert client.sleep == [7.0]


@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_truncated_reply_is_returned_and_flagged(server, backend, model, stop, length):
    records = []
    with server([Truncated("__global__ void k() { for (")]) as srv:
        reply = client_for(backend(srv.base_url, KEY), records).ask("coder", "code:first", MSGS, model=model,
                                                                    max_tokens=10)
    assert reply.text.startswith("__global__") and reply.finish_reason == length and is_truncated(length)
    assert records[0].finish_reason == length and records[0].error is None


@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_garbage_forever_stops_cleanly(server, backend, model, stop, length):
    records = []
    with server([], default=Garbage()) as srv:
        client = client_for(backend(srv.base_url, KEY), records, retries=2)
        with pytest.raises(LLMUnavailable, match="stayed down after 3 attempts: last error: .*garbled"):
            client.ask("coder", "code:first", MSGS, model=model)
        assert len(srv.requests) == 3
    assert records[0].attempts == 3 and "garbled" in records[0].error and records[0].reply is None


@pytest.mark.parametrize("server,backend,model,stop,length", HTTP)
def test_http_final_errors_name_status_and_message(server, backend, model, stop, length):
    records = []
    with server([Status(404, message="model 'nope' does not exist"), Status(400, message="bad")]) as srv:
        client = client_for(backend(srv.base_url, KEY), records)
        with pytest.raises(LLMError, match="HTTP 404: model 'nope' does not exist") as ei:
            client.ask("planner", "plan:initial", MSGS, model="nope")
        assert not isinstance(ei.value, (TransientLLMError, LLMUnavailable))
        assert len(srv.requests) == 1 and client.sleep == []
    assert records[0].attempts == 1 and "HTTP 404" in records[0].error


@pytest.mark.parametrize("backend", [OpenAIBackend, AnthropicBackend])
def test_http_connection_refused_is_transient(backend):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    b = backend(f"http://127.0.0.1:{port}" + ("/v1" if backend is OpenAIBackend else ""), KEY)
    with pytest.raises(TransientLLMError, match="connection failed"):
        b.complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=2)


def test_openai_reasoning_models_get_no_temperature_and_openai_gets_max_completion_tokens():
    with ScriptedOpenAIServer(["a", "b"]) as srv:
        b = OpenAIBackend(srv.base_url, KEY)
        b.complete(MSGS, model="o3-mini", max_tokens=10, temperature=0.2, timeout_s=5)
        b.complete(MSGS, model="openai/gpt-5", max_tokens=10, temperature=0.2, timeout_s=5)
        assert all("temperature" not in r for r in srv.requests)
    assert b._completion_tokens_param == "max_tokens"
    assert OpenAIBackend(None, KEY)._completion_tokens_param == "max_completion_tokens"
    assert OpenAIBackend("https://api.openai.com/v1", KEY)._completion_tokens_param == "max_completion_tokens"


def test_openai_missing_usage_and_null_content_do_not_crash():
    class Bare(ScriptedOpenAIServer):
        def _reply_body(self, n, model, text, inp, out, finish):
            return {"id": "x", "object": "chat.completion", "created": 0, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": None},
                                 "finish_reason": finish}]}

    with Bare(["ignored"]) as srv:
        reply = OpenAIBackend(srv.base_url, KEY).complete(MSGS, model="local", max_tokens=10, temperature=0,
                                                          timeout_s=5)
    assert reply.text == "" and reply.usage.total == 0


def test_openai_empty_choices_is_garbled():
    class Empty(ScriptedOpenAIServer):
        def _reply_body(self, n, model, text, inp, out, finish):
            return {"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": []}

    with Empty(["ignored"]) as srv, pytest.raises(TransientLLMError, match="garbled reply: no choices"):
        OpenAIBackend(srv.base_url, KEY).complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=5)


def test_anthropic_needs_a_user_message():
    with pytest.raises(LLMError, match="at least one user message"):
        AnthropicBackend("http://127.0.0.1:9", KEY).complete([MSGS[0]], model="m", max_tokens=10, temperature=0,
                                                            timeout_s=1)


# -- prompt caching ----------------------------------------------------------------------------------------------


def test_anthropic_caches_the_system_prompt_and_records_what_it_cached():
    """Every system message is a text block, the last marked cache_control ephemeral (the run's static prefix);
    the cache's reads and writes are part of input_tokens, recorded apart and priced at their own rates."""
    msgs = [Message(role="system", content="role and protocol"), Message(role="system", content="task and pack"),
            Message(role="user", content="refine node a1")]
    writes = {"input_tokens": 50, "output_tokens": 200, "cache_creation_input_tokens": 6000,
              "cache_read_input_tokens": 0}
    reads = {"input_tokens": 70, "output_tokens": 100, "cache_creation_input_tokens": None,
             "cache_read_input_tokens": 6000}
    records = []
    with ScriptedAnthropicServer([Reply("first", usage=writes), Reply("second", usage=reads)]) as srv:
        client = client_for(AnthropicBackend(srv.base_url, KEY), records)
        client.ask("planner", "plan:initial", msgs, model="claude-sonnet-4-5")
        client.ask("planner", "plan:refine", msgs, model="claude-sonnet-4-5")
    for body in srv.requests:
        assert body["system"] == [{"type": "text", "text": "role and protocol"},
                                  {"type": "text", "text": "task and pack", "cache_control": {"type": "ephemeral"}}]
        assert body["messages"] == [{"role": "user", "content": "refine node a1"}]
    first, second = (r.usage for r in records)
    assert (first.input_tokens, first.cache_write_tokens, first.cache_read_tokens) == (6050, 6000, 0)
    assert (second.input_tokens, second.cache_write_tokens, second.cache_read_tokens) == (6070, 0, 6000)
    assert [r.usage_counted_by for r in records] == ["provider", "provider"]
    # claude-sonnet-4-5: input $3, cache reads $0.30, cache writes $3.75, output $15 per million tokens
    assert records[0].cost_usd == pytest.approx((50 * 3 + 6000 * 3.75 + 200 * 15) / 1e6)
    assert records[1].cost_usd == pytest.approx((70 * 3 + 6000 * 0.30 + 100 * 15) / 1e6)


def test_anthropic_without_a_system_prompt_sends_none():
    with ScriptedAnthropicServer(["ok"]) as srv:
        AnthropicBackend(srv.base_url, KEY).complete([Message(role="system", content=""), MSGS[1]], model="m",
                                                     max_tokens=10, temperature=0, timeout_s=5)
    assert "system" not in srv.requests[0]


@pytest.mark.parametrize("details,cached", [
    ({"cached_tokens": 1536, "audio_tokens": 0}, 1536),  # OpenAI's automatic prefix cache
    (None, 0),  # a compatible server that sends null
    ("absent", 0),  # ... or no details at all
    ({"cached_tokens": None}, 0),
    ({}, 0),
    ("not an object", 0),
    ({"cached_tokens": "many"}, 0),
    ({"cached_tokens": 99_999}, 2000),  # never more than the prompt
], ids=["cached", "null", "absent", "null-count", "empty", "string", "nonsense", "too-many"])
def test_openai_cached_tokens_are_read_and_any_shape_is_tolerated(details, cached):
    usage = {"prompt_tokens": 2000, "completion_tokens": 10, "total_tokens": 2010}
    if details != "absent":
        usage["prompt_tokens_details"] = details
    records = []
    with ScriptedOpenAIServer([Reply("ok", usage=usage)]) as srv:
        client = client_for(OpenAIBackend(srv.base_url, KEY), records)
        client.ask("coder", "code:first", MSGS, model="gpt-4.1")
    got = records[0].usage
    assert (got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cache_write_tokens) == \
        (2000, 10, cached, 0)
    # gpt-4.1: input $2, cached input $0.50, output $8 per million tokens
    assert records[0].cost_usd == pytest.approx(((2000 - cached) * 2 + cached * 0.5 + 10 * 8) / 1e6)


def test_retry_after_header_forms():
    assert _retry_after({"retry-after": "3"}) == 3.0
    assert _retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert _retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert _retry_after({"retry-after": "soon"}) is None and _retry_after({}) is None


# -- command ---------------------------------------------------------------------------------------------------


def test_command_success_renders_the_prompt(tmp_path):
    cmd = scripted_command(tmp_path, ["the reply\n"], extra_args="--model {model}")
    records = []
    client = client_for(CommandBackend(cmd.command), records)
    reply = client.ask("planner", "plan:initial", MSGS, model="my-agent", max_tokens=99)
    # the command reports no tokens: the client estimates them from the text (~4 characters each), flagged
    assert reply.text == "the reply\n" and reply.usage.output_tokens == 2 and reply.usage.input_tokens > 0
    (got,) = cmd.received()
    assert got["prompt"] == render_plain(MSGS)
    assert got["prompt"].startswith("=== system ===\nYou write CUDA kernels.\n\n=== user ===\nMake it fast.")
    assert got["env"] == {"KSEARCH_LLM_MODEL": "my-agent", "KSEARCH_LLM_MAX_TOKENS": "99",
                          "KSEARCH_LLM_PURPOSE": "plan:initial"}
    assert got["argv"] == ["--model", "my-agent"]
    assert records[0].backend == "command" and records[0].usage_estimated and records[0].cost_usd is None


@pytest.mark.parametrize("step", [Hang(5), Killed()], ids=["timeout", "signal"])
def test_command_timeout_and_signal_are_transient(tmp_path, step):
    cmd = scripted_command(tmp_path, [step, "ok"])
    with pytest.raises(TransientLLMError, match="no reply within 0.5 s|killed by SIGKILL"):
        CommandBackend(cmd.command).complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=0.5)
    client = client_for(CommandBackend(cmd.command), [])
    assert client.ask("coder", "code:first", MSGS, model="m").text == "ok"


def test_command_that_prints_nothing_is_asked_again_then_stops(tmp_path):
    """An empty stdout (exit 0) was taken as the model's answer: a run whose command printed nothing ended with 0
    evaluations and exit 0. It is transient now: retried, then LLMUnavailable (the run stops, resumable)."""
    cmd = scripted_command(tmp_path, ["", "  \n", "answer"])
    records = []
    assert client_for(CommandBackend(cmd.command), records).ask("coder", "code:first", MSGS, model="m").text == "answer"
    assert records[0].attempts == 3
    cmd = scripted_command(tmp_path, [""] * 5)
    with pytest.raises(LLMUnavailable, match="printed nothing on stdout"):
        client_for(CommandBackend(cmd.command), [], retries=1).ask("coder", "code:first", MSGS, model="m")


def test_command_nonzero_exit_is_final_with_stderr(tmp_path):
    cmd = scripted_command(tmp_path, [Fail(2, "line one\nfatal: quota exceeded\n")])
    records = []
    with pytest.raises(LLMError, match="exited with status 2; stderr ends: line one\nfatal: quota exceeded"):
        client_for(CommandBackend(cmd.command), records).ask("coder", "code:first", MSGS, model="m")
    assert records[0].attempts == 1 and "quota exceeded" in records[0].error


def test_command_that_prints_without_end_is_stopped_at_the_stdout_cap(monkeypatch):
    """``--command yes`` read every byte into memory (2.5 GB in 2 s, 14 GB in a run) and held the call far past
    --llm-timeout: stdout is read up to a cap, then the program is killed and the call fails (final) saying so."""
    import time

    from ksearch.llm import backends

    monkeypatch.setattr(backends, "_STDOUT_BYTES", 1 << 20)
    t0 = time.monotonic()
    with pytest.raises(LLMError, match=r"yes printed more than 1 MB on stdout \(killed\)"):
        CommandBackend("yes").complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=20)
    assert time.monotonic() - t0 < 3
    # a long stderr is kept as its tail, a long stdout under the cap comes whole
    reply = CommandBackend("sh -c 'yes e | head -c 3000000 >&2; head -c 500000 /dev/zero | tr \"\\0\" x'").complete(
        MSGS, model="m", max_tokens=10, temperature=0, timeout_s=20)
    assert reply.text == "x" * 500000


def test_command_missing_program_and_bad_command(tmp_path):
    # refused when the backend is made (before a run exists), not at the run's first call
    with pytest.raises(ConfigError, match="'no-such-program-ksearch' is not a program that can be run"):
        CommandBackend("no-such-program-ksearch --x")
    script = tmp_path / "agent"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ConfigError, match="not a program"):
        CommandBackend(str(script))  # not executable
    script.chmod(0o755)
    backend = CommandBackend(str(script))
    script.unlink()  # gone during the run: a final error at the call
    with pytest.raises(LLMError, match="cannot start"):
        backend.complete(MSGS, model="m", max_tokens=1, temperature=0, timeout_s=1)
    with pytest.raises(ConfigError, match="empty"):
        CommandBackend("   ")
    with pytest.raises(ConfigError, match="cannot split"):
        CommandBackend("agent 'unclosed")


# -- queue -----------------------------------------------------------------------------------------------------


def test_queue_round_trip(tmp_path):
    q = tmp_path / "q"
    records = []
    with QueueResponder(q, ["first answer", "second answer"]) as responder:
        client = client_for(QueueBackend(q, poll_s=0.01), records, timeout_s=5)
        assert client.ask("planner", "plan:initial", MSGS, model="human").text == "first answer"
        assert client.ask("coder", "code:debug", MSGS[1:], model="human").text == "second answer"
    names = sorted(p.name for p in q.iterdir())
    assert names == ["0001-plan-initial.json", "0001-plan-initial.prompt.md", "0001-plan-initial.reply.md",
                     "0002-code-debug.json", "0002-code-debug.prompt.md", "0002-code-debug.reply.md"]
    doc = json.loads((q / "0001-plan-initial.json").read_text())
    assert doc["messages"][0] == {"role": "system", "content": "You write CUDA kernels."}
    assert doc["purpose"] == "plan:initial" and doc["consumed"] is True and doc["model"] == "human"
    assert doc["reply_file"] == "0001-plan-initial.reply.md"
    prompt = responder.prompts[0][1]
    assert "0001-plan-initial.reply.md" in prompt and "=== user ===\nMake it fast." in prompt
    assert [r.backend for r in records] == ["queue", "queue"]


def test_queue_timeout_then_reply_reuses_the_prompt(tmp_path):
    q = tmp_path / "q"
    records = []
    with QueueResponder(q, [Delayed("late but fine", 0.7)]):
        client = client_for(QueueBackend(q, poll_s=0.01), records, timeout_s=0.4)
        assert client.ask("planner", "plan:initial", MSGS, model="human").text == "late but fine"
    assert records[0].attempts == 2
    assert len(list(q.glob("*.prompt.md"))) == 1


def test_queue_unanswered_stops_cleanly_and_resume_picks_up_the_reply(tmp_path):
    q = tmp_path / "q"
    with QueueResponder(q, [None]):
        client = client_for(QueueBackend(q, poll_s=0.01), [], timeout_s=0.2, retries=1)
        with pytest.raises(LLMUnavailable, match="stayed down after 2 attempts: last error: queue: no reply"):
            client.ask("planner", "plan:initial", MSGS, model="human")
    # the person answers while the run is stopped; the resumed run asks the same question
    (q / "0001-plan-initial.reply.md").write_text("answered offline")
    client = client_for(QueueBackend(q, poll_s=0.01), [], timeout_s=2)
    assert client.ask("planner", "plan:initial", MSGS, model="human").text == "answered offline"
    # a new question gets the next number
    with QueueResponder(q, ["next"]):
        assert client.ask("coder", "code:first", MSGS[1:], model="human").text == "next"
    assert (q / "0002-code-first.reply.md").exists()


def test_queue_directory_that_cannot_be_written(tmp_path, monkeypatch):
    """A read-only queue directory was a traceback (OSError from the first prompt's write), after the run had
    been created: now a ConfigError when the backend is made, and an LLMError if it turns read-only later."""
    from ksearch.llm import backends

    q = tmp_path / "q"
    late = QueueBackend(q, poll_s=0.01)

    def read_only(path, text):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(backends, "_atomic_write", read_only)
    with pytest.raises(ConfigError, match=r"queue backend: .*q is not writable: Read-only file system"):
        QueueBackend(q)
    with pytest.raises(LLMError, match="queue: cannot write the prompt in .*: Read-only file system") as e:
        late.complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=1)
    assert not isinstance(e.value, TransientLLMError)
    assert not list(q.iterdir())  # no probe left behind


def test_queue_waits_for_a_non_empty_stable_reply(tmp_path):
    q = tmp_path / "q"
    backend = QueueBackend(q, poll_s=0.01)
    ticks = iter(range(1000))
    polls = []

    def sleep(s):
        polls.append(s)
        reply = q / "0001-call.reply.md"
        if len(polls) == 2:
            reply.write_text("")  # created, still empty
        elif len(polls) == 4:
            reply.write_text("done")

    backend._sleep, backend._clock = sleep, lambda: next(ticks) * 0.01
    reply = backend.complete(MSGS, model="m", max_tokens=10, temperature=0, timeout_s=10)
    assert reply.text == "done" and len(polls) == 5  # seen once, then unchanged for one poll


# -- make_backend and keys ---------------------------------------------------------------------------------


@pytest.fixture
def no_keys(monkeypatch, tmp_path):
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENROUTER_API_KEY",
                "MY_KEY"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "config.toml"
    monkeypatch.setenv("KSEARCH_CONFIG", str(cfg))
    return cfg


def test_make_backend_kinds_and_missing_settings(no_keys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert isinstance(make_backend("openai"), OpenAIBackend)
    assert isinstance(make_backend("anthropic", base_url="http://localhost:8080", api_key="x"), AnthropicBackend)
    assert isinstance(make_backend("command", command="cat -u"), CommandBackend)  # a program that exists
    assert isinstance(make_backend("queue", queue_dir=tmp_path / "q"), QueueBackend)
    with pytest.raises(ConfigError, match="needs a command"):
        make_backend("command")
    with pytest.raises(ConfigError, match="needs a directory"):
        make_backend("queue")
    with pytest.raises(ConfigError, match="unknown llm backend 'gpt'.*openai, anthropic, command, queue"):
        make_backend("gpt")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        make_backend("anthropic")
    assert KEY not in repr(make_backend("openai"))


def test_keys_from_the_environment(no_keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k-openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k-anthropic")
    monkeypatch.setenv("GEMINI_API_KEY", "k-gemini")
    monkeypatch.setenv("OPENROUTER_API_KEY", "k-openrouter")
    monkeypatch.setenv("MY_KEY", "k-mine")
    assert keys.resolve_api_key("openai", None) == "k-openai"
    assert keys.resolve_api_key("openai", "https://api.openai.com/v1") == "k-openai"
    assert keys.resolve_api_key("anthropic", None) == "k-anthropic"
    assert keys.resolve_api_key("openai", "https://generativelanguage.googleapis.com/v1beta/openai/") == "k-gemini"
    assert keys.resolve_api_key("openai", "https://openrouter.ai/api/v1") == "k-openrouter"
    assert keys.resolve_api_key("openai", None, api_key_env="MY_KEY") == "k-mine"
    with pytest.raises(ConfigError, match="UNSET_VAR .*not set"):
        keys.resolve_api_key("openai", None, api_key_env="UNSET_VAR")


def test_keys_from_the_config_file(no_keys):
    no_keys.write_text('[keys]\nopenai = "cfg-openai"\nanthropic = "cfg-anthropic"\n'
                       '"api.together.xyz" = "cfg-together"\n')
    assert keys.resolve_api_key("openai", None) == "cfg-openai"
    assert keys.resolve_api_key("anthropic", None) == "cfg-anthropic"
    assert keys.resolve_api_key("openai", "https://api.together.xyz/v1") == "cfg-together"


def test_keys_local_dummy_and_errors(no_keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k-openai")
    # a local endpoint gets a dummy key, never the OpenAI key
    for url in ("http://localhost:8000/v1", "http://127.0.0.1:11434/v1", "http://[::1]:8080/v1"):
        assert keys.resolve_api_key("openai", url) == keys.LOCAL_DUMMY_KEY
    # an unknown remote host is not sent the OpenAI key either
    with pytest.raises(ConfigError, match=r'--api-key-env, or add "api.groq.com" = "..." under \[keys\]'):
        keys.resolve_api_key("openai", "https://api.groq.com/openai/v1")
    with pytest.raises(ConfigError, match="set GEMINI_API_KEY or GOOGLE_API_KEY.*config.toml"):
        keys.resolve_api_key("openai", "https://generativelanguage.googleapis.com/v1beta/openai/")
    with pytest.raises(ConfigError, match="set OPENROUTER_API_KEY"):
        keys.resolve_api_key("openai", "https://openrouter.ai/api/v1")
    with pytest.raises(ConfigError, match="takes no API key"):
        keys.resolve_api_key("queue", None)
    no_keys.write_text("[keys\nbroken")
    with pytest.raises(ConfigError, match="not valid TOML"):
        keys.resolve_api_key("anthropic", None)
