"""Host memory for a call's arguments inside the worker: `ksearch.protocol.ArgRef` s as pointers a native kernel
takes.

Inputs are the controller's files, mapped read-only at a random address on every call (`RandomMap`: a kernel
cannot key a cache on the pointer); outputs are the controller's output files, mapped writable (NumPy memory
maps: what the kernel writes reaches the file the controller reads back). Imported only in the worker, and
with the C library's ``mmap``/``munmap`` bound (`libc`) before the kernel's library loads
(`ksearch.targets.cpu_runtime.CpuRunner`).
"""

from __future__ import annotations

import ctypes
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache

import numpy as np

from ksearch.protocol import ArgRef, ArrayRef


@lru_cache(maxsize=1)
def libc() -> ctypes.CDLL:
    """The C library with ``mmap`` and ``munmap`` typed (bound once)."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


class RandomMap:
    """A read-only shared mapping of a file at a random page offset inside a 16 MiB-larger reservation, so
    that no two calls see their inputs at the same address (a kernel cannot key a cache on the pointer).
    Pre-faulted (MAP_POPULATE), so the timed call pays no page faults the old mapping would not have.

    Args:
        path: the file; nbytes: bytes of it to map (> 0).
    Raises:
        OSError: the reservation or the mapping failed (errno and the path in the message).
    """

    _SLACK_PAGES = 4096

    def __init__(self, path: str, nbytes: int):
        lib = self._libc = libc()
        page = os.sysconf("SC_PAGE_SIZE")
        length = (nbytes + page - 1) // page * page
        self.total = length + self._SLACK_PAGES * page
        self.nbytes = nbytes
        self.base: int | None = None
        prot_none, prot_read, shared, private, fixed, anon, noreserve, populate = 0, 1, 1, 2, 0x10, 0x20, 0x4000, 0x8000
        base = lib.mmap(None, self.total, prot_none, private | anon | noreserve, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"cannot reserve {self.total} bytes for {path}")
        self.base = base
        self.addr: int = base + secrets.randbelow(self._SLACK_PAGES) * page
        fd = os.open(path, os.O_RDONLY)
        try:
            got = lib.mmap(self.addr, length, prot_read, shared | fixed | populate, fd, 0)
        finally:
            os.close(fd)
        if got != self.addr:
            self.close()
            raise OSError(ctypes.get_errno(), f"cannot map {path}")

    def close(self) -> None:
        if self.base is not None:
            self._libc.munmap(self.base, self.total)
            self.base = None


def map_args(refs: Sequence[ArgRef]) -> tuple[list, list[np.memmap], list]:
    """Call arguments from ArgRefs: (ctypes-ready args: scalars by value, arrays as addresses; the writable
    arrays; what to keep alive until the call returned, then `release`). Inputs are mapped read-only at a random
    address (`RandomMap`), outputs as NumPy memory maps, empty arrays as zero-length NumPy arrays.

    Raises:
        OSError: a file cannot be mapped (missing, shorter than its shape says).
    """
    args: list = []
    outputs: list[np.memmap] = []
    keep: list = []
    for ref in refs:
        if not isinstance(ref, ArrayRef):
            args.append(ref.value)
            continue
        nbytes = ref.size * np.dtype(ref.dtype).itemsize
        if nbytes == 0:
            arr = np.zeros(ref.shape, ref.dtype)
            keep.append(arr)
            args.append(arr.ctypes.data)
        elif ref.writable:
            out = np.memmap(ref.path, dtype=ref.dtype, mode="r+", shape=tuple(ref.shape))
            outputs.append(out)
            keep.append(out)
            args.append(out.ctypes.data)
        else:
            m = RandomMap(ref.path, nbytes)
            keep.append(m)
            args.append(m.addr)
    return args, outputs, keep


def buffers(keep: Sequence) -> Iterator[tuple[int, int]]:
    """(address, bytes) of every array argument `map_args` made: the inputs' mappings and the outputs."""
    for m in keep:
        if isinstance(m, RandomMap):
            yield m.addr, m.nbytes
        else:
            yield m.ctypes.data, m.nbytes


def release(keep: Sequence) -> None:
    """Unmap the inputs' mappings of `map_args` (the NumPy arrays go with their last reference)."""
    for m in keep:
        if isinstance(m, RandomMap):
            m.close()


class FlushBuffer:
    """Where the judge's eviction library is missing: a float64 buffer written in full (a new value each time) to
    evict the caches of the core this process runs on, and the shared levels, before a timed call. ``buffer``: the
    array of the last `write` (None before the first)."""

    def __init__(self) -> None:
        self.buffer: np.ndarray | None = None
        self._writes = 0

    def write(self, nbytes: int) -> None:
        """Write ``nbytes`` (rounded down to whole float64s, at least one) of the buffer, made anew when the size
        changes."""
        if self.buffer is None or self.buffer.nbytes != max(nbytes, 8) // 8 * 8:
            self.buffer = np.empty(max(nbytes, 8) // 8, np.float64)
        self._writes += 1
        self.buffer.fill(self._writes)


def evict_caches(evict, buffers: Iterable[tuple[int, int]], flush_bytes: int, fallback: FlushBuffer) -> None:
    """Before a timed call, ``flush_bytes`` > 0: evict each (address, bytes) of ``buffers`` from every cache level
    with the judge's library (``evict``), or without it write ``flush_bytes`` of ``fallback``."""
    if flush_bytes <= 0:
        return
    if evict is None:
        fallback.write(flush_bytes)
        return
    for addr, size in buffers:
        evict(addr, size)
