"""The worker's request loop (ksearch.eval.worker) over the wire: what it does with lines that are no valid request,
and with ops its runner's clock does not support. One sandboxed worker for the module."""

import json

import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import (CallRequest, ErrorReply, GoRequest, LoadReply, LoadRequest, PingReply, PingRequest,
                              PrepareRequest, TimingPlan)
from ksearch.tasks import load_task


@pytest.fixture(scope="module")
def judge():
    ev = Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[1]))
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def worker(judge, tmp_path_factory):
    cand = judge.naive_candidate()
    built = judge.target.compile(cand, judge.definition)
    assert built.ok, built.log
    w = judge.start_worker(tmp_path_factory.mktemp("worker"), built.artifact, 1)
    yield w, cand, built.artifact
    w.close()


def raw(w, line: str | bytes) -> dict:
    """Write ``line`` to the worker as it is and read its reply line."""
    w.proc.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
    w.proc.stdin.flush()
    return json.loads(w.proc.stdout.readline())


def test_lines_that_are_no_request_get_an_error_reply_and_the_worker_reads_on(worker):
    w, _, _ = worker
    garbage = raw(w, "not json")
    assert garbage["ok"] is False and garbage["id"] is None and "not JSON" in garbage["error"]
    assert "not an object" in raw(w, "[1, 2]")["error"]
    unknown = raw(w, '{"op": "frobnicate", "id": "f1"}')
    assert unknown["id"] == "f1" and not unknown["ok"] and "unknown op 'frobnicate'" in unknown["error"]
    bad = raw(w, '{"op": "prepare", "id": "p1", "args": [{"kind": "array", "path": "/x"}], "flush_bytes": 0}')
    assert bad["id"] == "p1" and not bad["ok"] and "malformed prepare request" in bad["error"]
    assert "args.0.array.dtype" in bad["error"]
    assert "unknown op" in raw(w, '{"id": "n1"}')["error"]
    assert "UnicodeDecodeError" in raw(w, b'{"op": "ping", "id": "\xff"}')["error"]  # not UTF-8
    assert "RecursionError" in raw(w, "[" * 100_000)["error"]  # deeper than the JSON parser goes
    assert isinstance(w.request(PingRequest(), 10), PingReply)  # still answering


def test_ops_before_load_are_refused(worker):
    w, _, _ = worker
    for msg, what in ((GoRequest(), "go before load"), (PrepareRequest(args=[]), "prepare before load"),
                      (CallRequest(args=[]), "call before load")):
        reply = w.request(msg, 10)
        assert isinstance(reply, ErrorReply) and reply.error == what


def test_a_runner_asked_for_what_its_clock_does_not_do_says_so(judge, worker):
    w, cand, artifact = worker
    reply = w.request(LoadRequest(target="cpu", artifact=str(artifact), candidate=cand,
                                  definition=judge.definition.model_dump(mode="json")), 60)
    assert isinstance(reply, LoadReply) and reply.clock == "controller" and not reply.device
    timed = w.request(CallRequest(args=[], timing=TimingPlan()), 10)
    assert isinstance(timed, ErrorReply) and "controller's clock" in timed.error and timed.status is None
    early = w.request(GoRequest(), 10)
    assert isinstance(early, ErrorReply) and early.error == "go before prepare"
    wrong = w.request(CallRequest(args=[]), 10)  # the runner's own error, reported, the worker alive
    assert isinstance(wrong, ErrorReply)
    assert isinstance(w.request(PingRequest(), 10), PingReply)
