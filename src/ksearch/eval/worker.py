"""The evaluation worker: loads one candidate and calls it on arrays the controller prepared.

Started by the controller as ``python -m ksearch.eval.worker '<policy JSON>'`` in its own session and scratch
directory. Before anything else (NumPy included: the process must still be single-threaded) it enters the
sandbox the policy describes (`ksearch.eval.jail`). It never sees reference outputs: inputs arrive as
read-only memory maps of files, outputs are written to files the controller reads back and compares.
Anything the kernel prints goes to stderr, never into the protocol. Every reply echoes its request's ``id``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _poison(arr) -> None:
    if arr.dtype.kind == "f":
        arr.fill(float("nan"))
    else:
        arr.view("u1").fill(0xA5)


def _map(refs: list[dict]):
    """Call arguments from ArgRefs: (ctypes-ready args, writable arrays, arrays to keep alive)."""
    import numpy as np

    args, outputs, keep = [], [], []
    for ref in refs:
        if ref["kind"] == "scalar":
            args.append(ref["value"])
            continue
        arr = np.memmap(ref["path"], dtype=ref["dtype"], mode="r+" if ref["writable"] else "r",
                        shape=tuple(ref["shape"])) if np.prod(ref["shape"]) > 0 else np.zeros(ref["shape"], ref["dtype"])
        keep.append(arr)
        if ref["writable"]:
            outputs.append(arr)
        args.append(arr.ctypes.data)
    return args, outputs, keep


def _summary(np, outputs) -> list[float]:
    """[non-finite count, sum of |x| over the finite values] of all float outputs (integers: their sum)."""
    bad, total = 0, 0.0
    for out in outputs:
        if out.dtype.kind == "f":
            finite = np.isfinite(out)
            bad += int(out.size - np.count_nonzero(finite))
            total += float(np.abs(out, where=finite, out=np.zeros(out.shape, np.float64)).sum())
        else:
            total += float(np.asarray(out, np.float64).sum())
    return [bad, total]


def _main() -> int:
    from ksearch.eval import jail

    report = jail.enter(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})

    import numpy as np

    # Keep the protocol on private descriptors; give the kernel /dev/null as stdin and stderr as stdout.
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)

    from ksearch.eval.protocol import TimingPlan
    from ksearch.eval.records import Candidate
    from ksearch.targets import get_target
    from ksearch.tasks.definition import Definition

    fn = None
    flush = None

    req: dict = {}

    def reply(obj: dict) -> None:
        replies.write(json.dumps({**obj, "id": req.get("id")}) + "\n")
        replies.flush()

    for line in requests:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "load":
                definition = Definition.model_validate(req["definition"])
                candidate = Candidate.model_validate(req["candidate"])
                fn = get_target(req["target"]).load(req["artifact"], candidate, definition)
                reply({"ok": True, "pid": os.getpid(), "sandbox": report})
            elif op == "call":
                if fn is None:
                    reply({"ok": False, "error": "call before load"})
                    continue
                args, outputs, keep = _map(req["args"])
                plan = TimingPlan.model_validate(req["timing"]) if req.get("timing") else None
                if plan is None:
                    fn(*args)
                    reply({"ok": True})
                    continue
                if flush is None or flush.nbytes != plan.flush_bytes:
                    flush = np.empty(max(plan.flush_bytes, 8) // 8, np.float64)
                # warm up on other inputs (a check's): what the kernel could remember from the warm-up is
                # of no use on the timed inputs, which it has never seen
                warm_args, _, warm_keep = _map(req.get("warmup_args") or req["args"])
                for _ in range(plan.warmup):
                    fn(*warm_args)
                del warm_keep
                times_ms: list[float] = []
                sums: list[list[float]] = []  # per timed call: [non-finite count, sum |x|] of all outputs
                total = 0.0
                while len(times_ms) < plan.max_repeats:
                    for out in outputs:
                        _poison(out)
                    flush.fill(len(times_ms))
                    t0 = time.perf_counter_ns()
                    fn(*args)
                    dt = (time.perf_counter_ns() - t0) * 1e-9
                    times_ms.append(dt * 1e3)
                    sums.append(_summary(np, outputs))
                    total += dt
                    enough = len(times_ms) >= plan.min_repeats and total >= plan.min_time_s
                    out_of_time = total >= plan.max_time_s and len(times_ms) >= 3
                    if enough or out_of_time:
                        break
                reply({"ok": True, "times_ms": times_ms, "sums": sums})
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:  # infrastructure or loading problems: reported, the controller decides
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(_main())
