"""The worker protocol's messages (ksearch.protocol) and the controller's reading of replies
(ksearch.jail.sandbox.parse_reply): no process is started here."""

import math

import pytest
from pydantic import ValidationError

from ksearch.jail.sandbox import ProtocolViolation, WorkerDied, parse_reply
from ksearch.protocol import (REQUEST, ArrayRef, CallRequest, ErrorReply, GoReply, GoRequest, LoadReply, LoadRequest,
                              OkReply, PingReply, PingRequest, PrepareRequest, ScalarRef, TimedReply, TimingPlan,
                              describe, reply_adapter)
from ksearch.records import Candidate

ARGS = [ArrayRef(path="/in.x", dtype="<f4", shape=(2, 3)), ArrayRef(path="/out.y", dtype="<f4", shape=(3,),
                                                                    writable=True), ScalarRef(value=3)]


@pytest.mark.parametrize("msg", [
    PingRequest(), GoRequest(id="abc"), PrepareRequest(args=ARGS, flush_bytes=1 << 20), CallRequest(args=ARGS),
    CallRequest(args=ARGS, warmup_args=ARGS, timing=TimingPlan(warmup=2)),
    LoadRequest(target="cpu", artifact="/k.so", candidate=Candidate(target="cpu", sources={"k.c": "x"}),
                definition={"name": "t"}),
], ids=lambda m: m.op)
def test_every_request_goes_over_the_wire_and_back_as_itself(msg):
    line = msg.model_dump_json()
    assert "\n" not in line
    assert REQUEST.validate_json(line) == msg


def test_arg_refs_are_told_apart_by_kind_and_keep_their_scalar_types():
    back = CallRequest.model_validate_json(CallRequest(args=[*ARGS, ScalarRef(value=0.5), ScalarRef(value=True)])
                                           .model_dump_json()).args
    assert [type(a) for a in back] == [ArrayRef, ArrayRef, ScalarRef, ScalarRef, ScalarRef]
    assert [type(a.value) for a in back[2:]] == [int, float, bool]
    assert back[0].shape == (2, 3) and back[0].size == 6 and not back[0].writable and back[1].writable
    inf = ScalarRef.model_validate_json(ScalarRef(value=math.inf).model_dump_json())  # as json.dumps writes it
    assert inf.value == math.inf


@pytest.mark.parametrize("line, where", [
    ('{"op": "frobnicate"}', "does not match any of the expected tags"),
    ('{"op": "prepare", "args": [{"kind": "array", "path": "/x"}]}', "prepare.args.0.array.dtype"),
    ('{"op": "prepare", "args": [], "flush_bytes": -1}', "flush_bytes"),
    ('{"op": "go", "extra": 1}', "extra"),  # unknown fields are refused
    ('{"op": "call", "args": [{"kind": "tensor"}]}', "kind"),
])
def test_a_malformed_request_fails_validation_and_says_where(line, where):
    with pytest.raises(ValidationError) as e:
        REQUEST.validate_json(line)
    assert where in describe(e.value)


def test_each_request_expects_its_own_reply_type():
    assert PingRequest().expects() is PingReply and GoRequest().expects() is GoReply
    assert CallRequest(args=[]).expects() is OkReply and PrepareRequest(args=[]).expects() is OkReply
    assert CallRequest(args=[], timing=TimingPlan()).expects() is TimedReply
    load = LoadRequest(target="cpu", artifact="", candidate=Candidate(target="cpu", sources={}), definition={})
    assert load.expects() is LoadReply


def test_a_reply_is_its_requests_type_or_an_error():
    timed = reply_adapter(TimedReply).validate_json('{"ok": true, "id": "a", "times_ms": [1.5, NaN], "sums": [[0, 2]]}')
    assert isinstance(timed, TimedReply) and math.isnan(timed.times_ms[1])
    err = reply_adapter(PingReply).validate_json('{"ok": false, "id": "a", "error": "boom", "status": "REJECTED"}')
    assert isinstance(err, ErrorReply) and err.status == "REJECTED"
    load = reply_adapter(LoadReply).validate_json('{"ok": true, "id": "a", "pid": 3, "sandbox": {}, "evict": false, '
                                                  '"clock": "device"}')
    assert load.device


def test_the_controller_reads_a_reply_to_its_request_only():
    assert parse_reply(b'{"ok": true, "id": "r1", "worker_ms": 0.01}', GoRequest(), "r1") == \
        GoReply(id="r1", worker_ms=0.01)
    assert isinstance(parse_reply(b'{"ok": false, "id": "r1", "error": "go before prepare"}', GoRequest(), "r1"),
                      ErrorReply)
    with pytest.raises(ProtocolViolation, match="not of its type.*worker_ms"):  # the right id, the wrong shape
        parse_reply(b'{"ok": true, "id": "r1"}', PingRequest(), "r1")
    with pytest.raises(ProtocolViolation, match="not of its type"):
        parse_reply(b'{"ok": true, "id": "r1", "times_ms": ["fast"], "sums": []}', CallRequest(args=[],
                    timing=TimingPlan()), "r1")
    with pytest.raises(ProtocolViolation, match="answers no request"):  # a forged reply does not know the id
        parse_reply(b'{"ok": true, "times_ms": [0.000001]}', CallRequest(args=[], timing=TimingPlan()), "r1")
    with pytest.raises(ProtocolViolation, match="answers no request"):
        parse_reply(b'{"ok": true, "id": "r0", "worker_ms": 0.01}', GoRequest(), "r1")
    for garbled in (b"hello", b"[1, 2]"):
        with pytest.raises(WorkerDied) as e:
            parse_reply(garbled, GoRequest(), "r1")
        assert "garbled reply" in e.value.stderr_tail
