"""End to end: `ksearch run --model ...` drives a complete 6-evaluation search of the cpu target through each
llm backend, against a local stand-in for the model (`responder`), with every kind of fault the issue names.

HTTP servers (OpenAI-compatible and Anthropic) add transport faults by request number: a 429, a 500, a hang
past the client's timeout and a garbled body. The responder adds content faults: prose instead of JSON,
truncated JSON, an edit on a node that does not exist, a kernel that does not compile. The run must finish
its 6 evaluations, and every call must be in the run's log with its tokens. (6, not 10: every scripted fault
falls in the first four evaluations and the first 12 requests; four more evaluations exercised nothing new.)
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.llm.client import Budget
from ksearch.store.runs import open_run

from ..llm.fakes import Garbage, Hang, Reply, ScriptedAnthropicServer, ScriptedOpenAIServer, Status
from .responder import Responder

from tests.conftest import fresh_home

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
BUDGET = 6
RUN = ["run", "selective-scan", "-w", "tiny", "--budget", str(BUDGET), "--json"]  # one small workload: the runs test the llm plumbing
FAULTS = {2: Status(429, retry_after=0), 5: Status(500), 8: Hang(3.0), 11: Garbage()}


def _messages(body: dict) -> list[dict]:
    """OpenAI's or Anthropic's request body as [{role, content}] (content blocks joined)."""
    text = lambda c: c if isinstance(c, str) else "".join(b.get("text", "") for b in c)
    msgs = [{"role": m["role"], "content": text(m["content"])} for m in body.get("messages", [])]
    if body.get("system"):
        msgs.insert(0, {"role": "system", "content": text(body["system"])})
    return msgs


def responding(server_cls):
    class Server(server_cls):
        """Answers by content (`Responder`), with the transport faults of FAULTS by request number."""

        def __init__(self, respond, faults):
            super().__init__([])
            self.respond, self.faults = respond, dict(faults)

        def _next(self):
            n = len(self.requests)
            if n in self.faults:
                return self.faults.pop(n)
            msgs = _messages(self.requests[-1])
            text = self.respond(msgs)
            return Reply(text, input_tokens=sum(len(m["content"]) for m in msgs) // 4 + 1,
                         output_tokens=len(text) // 4 + 1)

    return Server


def _run(args, monkeypatch, tmp_path):
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    r = runner.invoke(app, RUN + args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    store = open_run(summary["run_id"])
    try:
        return summary, store.llm_calls(), store.evaluation_count(), store.edit_log()
    finally:
        store.close()


def _check(summary, calls, evaluations, edits):
    assert evaluations == BUDGET and summary["evaluations"] == BUDGET
    assert calls and all(c.error is None or "stayed down" not in c.error for c in calls)
    answered = [c for c in calls if c.error is None]
    assert all(c.usage.input_tokens > 0 and c.usage.output_tokens > 0 for c in answered if not c.replayed)
    purposes = {c.purpose for c in calls}
    assert {"plan:initial", "code:first"} <= purposes and any(p.startswith("plan:") and p != "plan:initial"
                                                              for p in purposes)
    assert any(not e["accepted"] for e in edits) or any("no-such-node" in (c.messages[-1].content if
                                                        len(c.messages) > 2 else "") for c in calls)


@pytest.mark.parametrize("server_cls, flags", [
    (ScriptedOpenAIServer, ["--model", "gpt-4o-mini"]),
    (ScriptedAnthropicServer, ["--model", "claude-3-5-haiku-20241022", "--backend", "anthropic"]),
], ids=["openai", "anthropic"])
def test_a_search_through_an_http_endpoint_with_faults(server_cls, flags, tmp_path, monkeypatch):
    from ksearch.llm import client as llm_client

    init = llm_client.LLMClient.__init__  # retries without their backoff sleeps: every retry still happens
    monkeypatch.setattr(llm_client.LLMClient, "__init__",
                        lambda self, backend, **kw: init(self, backend, **{**kw, "sleep": lambda s: None}))
    respond = Responder(tmp_path / "state.json")
    with responding(server_cls)(respond, FAULTS) as srv:
        summary, calls, evaluations, edits = _run(flags + ["--base-url", srv.base_url, "--llm-timeout", "1"],
                                                  monkeypatch, tmp_path)
    _check(summary, calls, evaluations, edits)
    assert not srv.faults  # every transport fault was served ...
    assert sum(c.attempts for c in calls) >= len(calls) + 4  # ... and retried
    fixes = [c for c in calls if any(m.role == "assistant" for m in c.messages)]
    assert len(fixes) >= 3  # prose, truncated JSON and a bad parent were each sent back


def test_the_command_backend(tmp_path, monkeypatch):
    cmd = f"{sys.executable} -m tests.e2e.responder {tmp_path / 'state.json'}"
    monkeypatch.chdir(ROOT)
    summary, calls, evaluations, edits = _run(["--backend", "command", "--command", cmd], monkeypatch, tmp_path)
    _check(summary, calls, evaluations, edits)
    assert all(c.backend == "command" for c in calls)


def test_the_queue_backend(tmp_path, monkeypatch):
    queue = tmp_path / "queue"
    queue.mkdir()
    respond, stop = Responder(tmp_path / "state.json"), threading.Event()

    def answer():
        seen = set()
        while not stop.is_set():
            for p in sorted(queue.glob("*.json")):
                reply = p.with_name(p.name[:-len(".json")] + ".reply.md")
                if p.name in seen or reply.exists() or not p.with_name(p.name[:-5] + ".prompt.md").exists():
                    continue
                seen.add(p.name)
                tmp = reply.with_name("." + reply.name)
                tmp.write_text(respond(json.loads(p.read_text())["messages"]))
                tmp.rename(reply)
            stop.wait(0.02)

    from ksearch.llm import backends

    # the default 0.5 s poll (a reply counts once unchanged for one poll) made this test ~40 s; the protocol is
    # the same at 0.05 s
    init = backends.QueueBackend.__init__
    monkeypatch.setattr(backends.QueueBackend, "__init__",
                        lambda self, directory, **kw: init(self, directory, **{"poll_s": 0.05, **kw}))
    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        summary, calls, evaluations, edits = _run(["--backend", "queue", "--queue-dir", str(queue)],
                                                  monkeypatch, tmp_path)
    finally:
        stop.set()
        t.join(5)
    _check(summary, calls, evaluations, edits)
    assert all(c.backend == "queue" for c in calls)


def test_a_token_limit_stops_the_run_and_resume_with_a_higher_one_finishes_it(tmp_path, monkeypatch):
    """--max-tokens reached: exit 3, status stopped, nothing lost; `ksearch resume RUN --max-tokens N` goes on
    to the budget, and the spent tokens carry over (the limit is on the whole run)."""
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    respond = Responder(tmp_path / "state.json")
    with responding(ScriptedOpenAIServer)(respond, {}) as srv:
        r = runner.invoke(app, RUN + ["--model", "gpt-4o-mini", "--base-url", srv.base_url,
                                      "--max-tokens", "40000"])
        assert r.exit_code == 3, r.output
        stopped = json.loads(r.output[r.output.index("{"):])
        assert stopped["status"] == "stopped" and "max-tokens" in stopped["reason"].replace("_", "-")
        store = open_run(stopped["run_id"])
        try:
            assert store.run()["status"] == "stopped"
            done, spent = store.evaluation_count(), Budget.from_calls(store.llm_calls()).spent_tokens
        finally:
            store.close()
        assert 0 < done < BUDGET and spent >= 40000
        r = runner.invoke(app, ["resume", stopped["run_id"], "--max-tokens", "10000000", "--json"])
        assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    assert summary["evaluations"] == BUDGET


def test_a_planner_choice_that_looks_like_markup_is_shown_as_written(tmp_path, monkeypatch):
    """A model's choice "[/] [bold]..." crashed `ksearch run` (rich MarkupError at the step line) and was eaten
    by `ksearch show`'s tree."""
    prefix = "[/] [bold]"
    cmd = f"{sys.executable} -m tests.e2e.responder {tmp_path / 'state.json'} '{prefix}'"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    r = runner.invoke(app, ["run", "selective-scan", "-w", "tiny", "--budget", "2", "--backend",
                            "command", "--command", cmd])
    assert r.exit_code == 0, r.output
    assert f"{prefix}family" in r.output
    run_id = r.output.split("run ")[1].split()[0]
    r = runner.invoke(app, ["show", run_id])
    assert r.exit_code == 0, r.output
    assert f"{prefix}family" in r.output


def test_an_endpoint_that_refuses_stops_the_run_resumably(tmp_path, monkeypatch):
    """A 401 (or 404, 400: what no retry cures) ended the run with `error:` (exit 2) and status interrupted, no
    word of resuming; it is a clean stop like a dead endpoint: exit 3, status stopped, `ksearch resume RUN`."""
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    with ScriptedOpenAIServer([], default=Status(401, message="invalid api key")) as srv:
        r = runner.invoke(app, RUN + ["--model", "gpt-4o-mini", "--base-url", srv.base_url])
    assert r.exit_code == 3, r.output
    stopped = json.loads(r.output[r.output.index("{"):])
    assert stopped["status"] == "stopped" and "HTTP 401: invalid api key" in stopped["reason"]
    assert f"continue with ksearch resume {stopped['run_id']}" in " ".join(r.output.split())
    store = open_run(stopped["run_id"])
    try:
        assert store.run()["status"] == "stopped"
    finally:
        store.close()


def test_a_coder_reply_without_a_kernel_is_not_called_a_kernel_judged_before(tmp_path, monkeypatch):
    """The step line of a node whose coder reply held no kernel said "(same kernel as before, not re-run)"."""
    from ..llm.fakes import scripted_command

    fam = lambda i: {"op": "insert", "parent_id": "root", "id": f"fam{i}", "decision": "kernel family",
                     "choice": f"family {i}", "rating": 6, "confidence": 0.5,
                     "action": {"title": f"family {i}", "description": "rows of the scan split another way"}}
    cmd = scripted_command(tmp_path, [json.dumps([fam(1), fam(2)]), "I would rather not write code today.", "[]"])
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    r = runner.invoke(app, ["run", "selective-scan", "-w", "tiny", "--budget", "2", "--command", cmd.command])
    assert r.exit_code == 3, r.output  # the script then runs out: the command fails, the run stops
    line = next(x for x in r.output.splitlines() if "COMPILE_ERROR" in x)
    assert "(no kernel: nothing judged)" in line and "same kernel" not in line, r.output


def test_a_model_that_never_gives_usable_edits_ends_saying_nothing_was_judged(tmp_path, monkeypatch):
    """A planner answering prose forever ended its run with "no candidate beat the naive kernel" under 0
    evaluations, as if candidates had been judged and lost."""
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    with ScriptedOpenAIServer([], default="I would think about it some more.") as srv:
        r = runner.invoke(app, ["run", "selective-scan", "-w", "tiny", "--budget", "2", "--model", "gpt-4o-mini",
                                "--base-url", srv.base_url])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "no candidate was judged: the proposer gave none to judge (its calls: ksearch show" in text
    assert "no candidate beat" not in text


def test_an_endpoint_that_trickles_is_cut_at_the_llm_timeout_and_the_run_stops_resumably(tmp_path, monkeypatch):
    """An endpoint writing one byte a second held a call 200 s against --llm-timeout 20 (the SDK's timeout is per
    read) and nothing was said meanwhile. Each attempt is cut at --llm-timeout, the run stops with exit 3 (resumable)
    and the call is in the run's log, announced as it started."""
    import time

    from ksearch.llm import client as llm_client

    from ..llm.fakes import Trickle

    init = llm_client.LLMClient.__init__  # one retry, no backoff: the test is about each attempt's deadline
    monkeypatch.setattr(llm_client.LLMClient, "__init__",
                        lambda self, backend, **kw: init(self, backend, **{**kw, "retries": 1,
                                                                           "sleep": lambda s: None}))
    from ksearch.targets import get_target

    from ..targets.test_null import SPEC

    monkeypatch.setattr(type(get_target("null")), "hardware_spec", lambda self: SPEC)  # no probing of this machine
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    with ScriptedOpenAIServer([], default=Trickle(interval=1.0)) as srv:
        t0 = time.monotonic()
        r = runner.invoke(app, ["run", "selective-scan", "-w", "tiny", "--budget", "2", "--json", "--target", "null",
                                "--model", "gpt-4o-mini", "--base-url", srv.base_url, "--llm-timeout", "2"])
        took = time.monotonic() - t0
    assert r.exit_code == 3, r.output
    stopped = json.loads(r.output[r.output.index("{"):])
    assert stopped["status"] == "stopped" and "no complete reply within 2 s" in stopped["reason"]
    assert took < 30, took  # the naive kernel, then two attempts of 2 s; not minutes of trickle
    store = open_run(stopped["run_id"])
    try:
        calls = store.llm_calls()
    finally:
        store.close()
    assert len(calls) == 1 and calls[0].purpose == "plan:initial" and calls[0].attempts == 2
    assert "no complete reply within 2 s" in calls[0].error
