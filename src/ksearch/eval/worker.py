"""The evaluation worker: loads one candidate and calls it on arrays the controller prepared.

Started by the controller as ``python -m ksearch.eval.worker '<policy JSON>'`` in its own session and scratch
directory. Before anything else (NumPy included: the process must still be single-threaded) it enters the
sandbox the policy describes (`ksearch.jail.jail`). It never sees reference outputs: inputs arrive as
read-only files, outputs are written to files the controller reads back and compares.
Anything the kernel prints goes to stderr, never into the protocol.

It reads one request a line (`ksearch.protocol`), validates it into its type (a malformed line or an unknown op
gets an error reply; the worker reads on) and answers it, echoing its ``id``. The worker knows no target: ``load``
asks the named target for the candidate's `ksearch.targets.base.Runner` and every later op is that runner's
(``call``; ``prepare`` then ``go`` on the controller's clock; a timed ``call`` on the device's). The judge's
eviction library is loaded before the kernel (what the kernel does at load cannot reach it) and handed to the
runner. ``go`` is read with the worker's clock only as a cross-check: the controller times it with its own
(see `ksearch.protocol`).

The clock, the JSON encoder and the ping's empty native call are bound before any kernel loads: patching their
modules later (from native code, through the C API) changes nothing here. Replies are plain objects written by
that encoder (no class a kernel could patch takes part in a reply); the controller validates them.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ksearch.targets.base import Runner

#: libgomp spins before an idle OpenMP thread sleeps (see the "load" request); about 10-50 us
SPIN_COUNT = "10000"


def _evict_function(path: str):
    """``ksearch_evict`` of the judge's eviction library at ``path``, or None where the library is damaged, foreign
    or reports that this CPU cannot evict (the runner then writes a buffer; the load reply says so)."""
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError:
        return None
    try:
        if not lib.ksearch_evict_supported():
            return None
        evict = lib.ksearch_evict
    except AttributeError:
        return None
    evict.argtypes, evict.restype = [ctypes.c_void_p, ctypes.c_size_t], None
    return evict


def _request_id(line: bytes):
    """The ``id`` of a request line that did not validate, where it has one (for the error reply)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the parser's depth
        return None
    return obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else None


def _malformed(line: bytes, e: ValidationError) -> str:
    """Why a request line did not validate: an unknown op by name, else the fields that are wrong."""
    from ksearch.protocol import OPS, describe

    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as err:
        return f"malformed request (not JSON: {type(err).__name__}: {str(err)[:200]})"
    if not isinstance(obj, dict):
        return f"malformed request (not an object: {line[:80]!r})"
    if obj.get("op") not in OPS:
        return f"unknown op {obj.get('op')!r} (known: {', '.join(OPS)})"
    return f"malformed {obj['op']} request: {describe(e)}"


def _main() -> int:
    from ksearch.jail import jail

    report = jail.enter(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})

    # one BLAS thread: the worker never multiplies matrices, and idle threads of its own would only make the
    # judge's runqueue accounting count it as oversubscribed (see `ksearch.eval.timing`)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy  # noqa: F401  imported before the kernel loads (the cpu runner's argument mapping uses it)

    # Keep the protocol on private descriptors; give the kernel /dev/null as stdin and stderr as stdout.
    requests = os.fdopen(os.dup(0), "rb")  # bytes: a line that is not UTF-8 is a malformed request, not a crash
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)

    from pydantic import ValidationError

    from ksearch.errors import KernelCompileError, KernelRejected, UnsupportedOp
    from ksearch.protocol import REQUEST, CallRequest, GoRequest, LoadRequest, PingRequest, PrepareRequest
    from ksearch.targets import get_target
    from ksearch.tasks.definition import Definition

    runner: Runner | None = None  # the candidate's, once loaded
    evict = None  # the judge's ksearch_evict (native/evict.c), loaded before the kernel
    null = ctypes.CDLL(None).getpid  # an empty native call, for `ping`
    now, dumps = time.perf_counter_ns, json.dumps  # bound before any kernel loads: patching the modules later
    #                                               (from native code, through the C API) changes nothing here
    validate = REQUEST.validate_json
    rid = None

    def reply(obj: dict) -> None:
        obj["id"] = rid
        replies.write(dumps(obj) + "\n")
        replies.flush()

    for line in requests:
        try:
            req = validate(line)
        except ValidationError as e:
            rid = _request_id(line)
            reply({"ok": False, "error": _malformed(line, e)})
            continue
        rid = req.id
        try:
            if isinstance(req, GoRequest):  # first: the timed op
                if runner is None:
                    reply({"ok": False, "error": "go before load"})
                    continue
                t0 = now()
                runner.go()
                reply({"ok": True, "worker_ms": (now() - t0) * 1e-6})
            elif isinstance(req, PingRequest):  # the cost of a timed `go` without the kernel: the same steps
                t0 = now()
                null()
                reply({"ok": True, "worker_ms": (now() - t0) * 1e-6})
            elif isinstance(req, PrepareRequest):
                if runner is None:
                    reply({"ok": False, "error": "prepare before load"})
                    continue
                runner.prepare(req.args, req.flush_bytes)
                reply({"ok": True})
            elif isinstance(req, CallRequest):
                if runner is None:
                    reply({"ok": False, "error": "call before load"})
                    continue
                if req.timing is None:
                    runner.call(req.args)
                    reply({"ok": True})
                else:
                    times_ms, sums = runner.timed(req.args, req.warmup_args, req.timing)
                    reply({"ok": True, "times_ms": times_ms, "sums": sums})
            elif isinstance(req, LoadRequest):
                # OpenMP threads spin for a while after a parallel region (libgomp: 300,000 spins, milliseconds)
                # before they sleep: on a machine with few cores that spin holds the core the judge's own
                # process needs to take the call's reply, and the next kernel of a paired round starts beside it.
                # A short spin (microseconds) keeps back-to-back regions inside one call fast. Read by libgomp
                # when the kernel's library loads it; a user's own setting wins.
                os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
                definition = Definition.model_validate(req.definition)
                if req.evict:  # before the kernel's library: what it does at load cannot reach this
                    evict = _evict_function(req.evict)
                try:
                    loaded = get_target(req.target).load(Path(req.artifact), req.candidate, definition)
                except KernelCompileError as e:  # targets that compile late (cuda: NVRTC in the worker)
                    reply({"ok": False, "status": "COMPILE_ERROR", "error": str(e), "sandbox": report})
                    continue
                loaded.evict = evict
                runner = loaded
                reply({"ok": True, "pid": os.getpid(), "sandbox": report, "clock": runner.clock,
                       "evict": evict is not None})
        except UnsupportedOp as e:  # the judge asked for what this runner's clock does not do
            reply({"ok": False, "error": str(e)})
        except (KernelCompileError, KernelRejected) as e:  # a runner's verdict on a call (triton: Triton
            #                                                 compiles at the first call; the torch guard)
            status = "COMPILE_ERROR" if isinstance(e, KernelCompileError) else "REJECTED"
            reply({"ok": False, "status": status, "error": str(e)})
        except Exception as e:  # infrastructure or loading problems: reported, the controller decides
            traceback.print_exc()  # into the worker's stderr file, for whoever debugs the target
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(_main())
