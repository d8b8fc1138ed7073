"""The evaluation worker: loads one candidate and calls it on arrays the controller prepared.

Started by the controller as ``python -m ksearch.eval.worker '<policy JSON>'`` in its own session and scratch
directory. Before anything else (NumPy included: the process must still be single-threaded) it enters the
sandbox the policy describes (`ksearch.jail.jail`). It never sees reference outputs: inputs arrive as
read-only memory maps of files, outputs are written to files the controller reads back and compares.
Anything the kernel prints goes to stderr, never into the protocol. Every reply echoes its request's ``id``.

The cpu target's timed calls are ``prepare`` (map the inputs at a new address, evict them and the outputs from the
caches with the judge's library, or write a buffer in this process where it is missing) then ``go`` (one call): the controller poisons the
outputs before and times ``go`` with its own clock; the ``worker_ms`` each ``go`` reports is only a cross-check
(see `ksearch.protocol`). Device targets time blocks of repeats with
the device's events (``call`` with a timing plan).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback


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
        self.nbytes = nbytes
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


def _buffers(keep: list):
    """(address, bytes) of every array argument `_map` made: the inputs' mappings and the outputs."""
    for m in keep:
        if isinstance(m, _RandomMap):
            yield m.addr, m.nbytes
        else:
            yield m.ctypes.data, m.nbytes


def _release(keep: list) -> None:
    for m in keep:
        if isinstance(m, _RandomMap):
            m.close()


#: libgomp spins before an idle OpenMP thread sleeps (see the "load" request); about 10-50 us
SPIN_COUNT = "10000"


def _main() -> int:
    from ksearch.jail import jail

    report = jail.enter(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})

    # one BLAS thread: the worker never multiplies matrices, and idle threads of its own would only make the
    # judge's runqueue accounting count it as oversubscribed (see `ksearch.eval.timing`)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy  # imported before the kernel loads (`_map` and the flush use it)

    # Keep the protocol on private descriptors; give the kernel /dev/null as stdin and stderr as stdout.
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)

    from ksearch.errors import KernelCompileError, KernelRejected
    from ksearch.protocol import TimingPlan
    from ksearch.records import Candidate
    from ksearch.targets import get_target
    from ksearch.tasks.definition import Definition

    fn = None
    args: list = []
    flush, flushes = None, 0
    evict = None  # the judge's ksearch_evict (native/evict.c), loaded before the kernel
    null = ctypes.CDLL(None).getpid  # an empty native call, for `ping`
    runner = None  # a device target's runner (see ksearch.targets.cuda_runtime), None for the cpu
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
                # OpenMP threads spin for a while after a parallel region (libgomp: 300,000 spins, milliseconds)
                # before they sleep: on a machine with few cores that spin holds the core the judge's own
                # process needs to take the call's reply, and the next kernel of a paired round starts beside it.
                # A short spin (microseconds) keeps back-to-back regions inside one call fast. Read by libgomp
                # when the kernel's library loads it; a user's own setting wins.
                os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
                definition = Definition.model_validate(req["definition"])
                candidate = Candidate.model_validate(req["candidate"])
                if req.get("evict"):  # before the kernel's library: what it does at load cannot reach this
                    try:
                        lib = ctypes.CDLL(req["evict"], mode=ctypes.RTLD_LOCAL)
                    except OSError:  # a damaged or foreign build: the flush buffer instead (the reply says so)
                        lib = None
                    if lib is not None and lib.ksearch_evict_supported():
                        evict = lib.ksearch_evict
                        evict.argtypes, evict.restype = [ctypes.c_void_p, ctypes.c_size_t], None
                try:
                    fn = get_target(req["target"]).load(req["artifact"], candidate, definition)
                except KernelCompileError as e:  # targets that compile late (cuda: NVRTC in the worker)
                    reply({"ok": False, "status": "COMPILE_ERROR", "error": str(e), "sandbox": report})
                    continue
                runner = fn if getattr(fn, "is_device_runner", False) else None
                reply({"ok": True, "pid": os.getpid(), "sandbox": report, "device": runner is not None,
                       "evict": evict is not None})
            elif op == "ping":  # the cost of a timed `go` without the kernel: the same steps around a null call
                t0 = now()
                null()
                reply({"ok": True, "worker_ms": (now() - t0) * 1e-6})
            elif op == "prepare":
                if fn is None or runner is not None:
                    reply({"ok": False, "error": "prepare needs a loaded cpu kernel"})
                    continue
                _release(keep)
                args, outputs, keep = _map(req["args"])  # the inputs at a new address every time
                nbytes = int(req.get("flush_bytes") or 0)
                if nbytes > 0 and evict is not None:  # the call's own buffers out of every cache level
                    for addr, size in _buffers(keep):
                        evict(addr, size)
                elif nbytes > 0:  # evict the caches of the core this process runs on (and the shared ones)
                    if flush is None or flush.nbytes != nbytes:
                        flush = numpy.empty(max(nbytes, 8) // 8, numpy.float64)
                    flushes += 1
                    flush.fill(flushes)
                reply({"ok": True})
            elif op == "go":
                if fn is None or runner is not None or not args:
                    reply({"ok": False, "error": "go before prepare"})
                    continue
                t0 = now()
                fn(*args)
                reply({"ok": True, "worker_ms": (now() - t0) * 1e-6})
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
                if plan is not None:
                    reply({"ok": False, "error": "the cpu target is timed by prepare and go, not by a timed call"})
                    continue
                _release(keep)
                args, outputs, keep = _map(req["args"])
                fn(*args)
                args = []  # a `go` needs its own `prepare`
                reply({"ok": True})
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
