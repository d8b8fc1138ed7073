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
import traceback


def _poison(arr) -> None:
    from ksearch.tasks.inputs import poison_byte

    if arr.dtype.kind == "f":
        arr.fill(float("nan"))
    else:
        arr.view("u1").fill(poison_byte(arr.dtype))  # uint16 (bfloat16 storage): NaN bits


class _RandomMap:
    """A read-only shared mapping of a file at a random page offset inside a 16 MiB-larger reservation, so
    that no two calls see their inputs at the same address (a kernel cannot key a cache on the pointer).
    Pre-faulted (MAP_POPULATE), so the timed call pays no page faults the old mapping would not have."""

    _SLACK_PAGES = 4096

    def __init__(self, path: str, nbytes: int):
        import ctypes
        import secrets

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._libc = libc
        page = os.sysconf("SC_PAGE_SIZE")
        length = (nbytes + page - 1) // page * page
        self.total = length + self._SLACK_PAGES * page
        prot_none, prot_read, shared, private, fixed, anon, noreserve, populate = 0, 1, 1, 2, 0x10, 0x20, 0x4000, 0x8000
        base = libc.mmap(None, self.total, prot_none, private | anon | noreserve, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"cannot reserve {self.total} bytes for {path}")
        self.base = base
        self.addr = base + secrets.randbelow(self._SLACK_PAGES) * page
        fd = os.open(path, os.O_RDONLY)
        try:
            got = libc.mmap(self.addr, length, prot_read, shared | fixed | populate, fd, 0)
        finally:
            os.close(fd)
        if got != self.addr:
            self.close()
            raise OSError(ctypes.get_errno(), f"cannot map {path}")

    def close(self) -> None:
        if self.base is not None:
            self._libc.munmap(self.base, self.total)
            self.base = None


def _map(refs: list[dict]):
    """Call arguments from ArgRefs: (ctypes-ready args, writable arrays, mappings to close after the call).
    Inputs are mapped read-only at a random address (`_RandomMap`), outputs as NumPy memory maps."""
    import numpy as np

    args, outputs, keep = [], [], []
    for ref in refs:
        if ref["kind"] == "scalar":
            args.append(ref["value"])
            continue
        nbytes = int(np.prod(ref["shape"])) * np.dtype(ref["dtype"]).itemsize
        if nbytes == 0:
            arr = np.zeros(ref["shape"], ref["dtype"])
            keep.append(arr)
            args.append(arr.ctypes.data)
        elif ref["writable"]:
            arr = np.memmap(ref["path"], dtype=ref["dtype"], mode="r+", shape=tuple(ref["shape"]))
            outputs.append(arr)
            keep.append(arr)
            args.append(arr.ctypes.data)
        else:
            m = _RandomMap(ref["path"], nbytes)
            keep.append(m)
            args.append(m.addr)
    return args, outputs, keep


def _release(keep: list) -> None:
    for m in keep:
        if isinstance(m, _RandomMap):
            m.close()


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

    from ksearch.errors import KernelCompileError, KernelRejected
    from ksearch.eval.protocol import TimingPlan
    from ksearch.eval.records import Candidate
    from ksearch.targets import get_target
    from ksearch.tasks.definition import Definition

    fn = None
    runner = None  # a device target's runner (see ksearch.targets.cuda_runtime), None for the cpu
    flush = None
    keep: list = []
    now, dumps = time.perf_counter_ns, json.dumps  # bound before any kernel loads: patching the modules later
    #                                               (from native code, through the C API) changes nothing here

    req: dict = {}

    def reply(obj: dict) -> None:
        replies.write(dumps({**obj, "id": req.get("id")}) + "\n")
        replies.flush()

    for line in requests:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "load":
                definition = Definition.model_validate(req["definition"])
                candidate = Candidate.model_validate(req["candidate"])
                try:
                    fn = get_target(req["target"]).load(req["artifact"], candidate, definition)
                except KernelCompileError as e:  # targets that compile late (cuda: NVRTC in the worker)
                    reply({"ok": False, "status": "COMPILE_ERROR", "error": str(e), "sandbox": report})
                    continue
                runner = fn if getattr(fn, "is_device_runner", False) else None
                reply({"ok": True, "pid": os.getpid(), "sandbox": report})
            elif op == "call":
                if fn is None:
                    reply({"ok": False, "error": "call before load"})
                    continue
                plan = TimingPlan.model_validate(req["timing"]) if req.get("timing") else None
                if runner is not None:  # a device target: it owns buffers, launches and the device clock
                    if plan is None:
                        runner.call(req["args"])
                        reply({"ok": True})
                    else:
                        times_ms, sums = runner.timed(req["args"], req.get("warmup_args"), plan)
                        reply({"ok": True, "times_ms": times_ms, "sums": sums})
                    continue
                _release(keep)
                args, outputs, keep = _map(req["args"])
                if plan is None:
                    fn(*args)
                    reply({"ok": True})
                    continue
                if flush is None or flush.nbytes != plan.flush_bytes:
                    flush = np.empty(max(plan.flush_bytes, 8) // 8, np.float64)
                # warm up on other inputs (a check's): what the kernel could remember from the warm-up is
                # of no use on the timed inputs, which it has never seen
                for _ in range(plan.warmup):
                    warm_args, _, warm_keep = _map(req.get("warmup_args") or req["args"])
                    fn(*warm_args)
                    _release(warm_keep)
                times_ms: list[float] = []
                sums: list[list[float]] = []  # per timed call: [non-finite count, sum |x|] of all outputs
                total = 0.0
                while len(times_ms) < plan.max_repeats:
                    _release(keep)
                    args, outputs, keep = _map(req["args"])  # the inputs at a new address every time
                    for out in outputs:
                        _poison(out)
                    flush.fill(len(times_ms))
                    t0 = now()
                    fn(*args)
                    dt = (now() - t0) * 1e-9
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
        except (KernelCompileError, KernelRejected) as e:  # a device runner's verdict on a call (triton: Triton
            #                                                 compiles at the first call; the torch guard)
            status = "COMPILE_ERROR" if isinstance(e, KernelCompileError) else "REJECTED"
            reply({"ok": False, "status": status, "error": str(e)})
        except Exception as e:  # infrastructure or loading problems: reported, the controller decides
            traceback.print_exc()  # into the worker's stderr file, for whoever debugs the target
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(_main())
