"""The cpu target inside the worker: the built library's entry point behind the `Runner` contract.

On the controller's clock (`ksearch.targets.base.Runner`): the judge sends ``prepare`` (outside the timed region:
the inputs mapped at a new address, `ksearch.targets.host_args`, then they and the outputs, which the controller
has just poisoned, evicted from every cache level line by line with the judge's library, or, without it, a
buffer written in this process: the caches of the core the worker runs on), then times ``go`` (one call) with its
own clock. Imported only in the worker.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path


from ksearch.errors import TargetError, UnsupportedOp
from ksearch.protocol import ArgRef
from ksearch.targets import host_args
from ksearch.targets.base import ControllerClockRunner
from ksearch.tasks.definition import Definition


class CpuRunner(ControllerClockRunner):
    """A built cpu kernel: ``void entry(inputs..., outputs..., axes...)`` through ctypes (argument types from the
    definition: arrays as pointers, float scalars as ``double``, other scalars and axes as ``int64_t``).

    Args:
        artifact: the shared library `CpuTarget.compile` built; entry_point: the function's name;
        definition: the task (the ABI's order and scalar types).
    Raises:
        TargetError: the library does not load or has no such entry point (reported as RUNTIME_ERROR).
    """

    def __init__(self, artifact: Path, entry_point: str, definition: Definition):
        host_args.libc()  # mmap and munmap bound before the kernel's library loads
        try:
            lib = ctypes.CDLL(str(artifact), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise TargetError(f"cannot load the built kernel: {e}") from None
        try:
            fn = getattr(lib, entry_point)
        except AttributeError:
            raise TargetError(f"the kernel defines no function {entry_point!r} "
                              "(C++ sources need extern \"C\")") from None
        argtypes: list = []
        for spec in list(definition.inputs.values()) + list(definition.outputs.values()):
            if spec.shape is None:
                argtypes.append(ctypes.c_double if spec.dtype.startswith("float") else ctypes.c_int64)
            else:
                argtypes.append(ctypes.c_void_p)
        argtypes += [ctypes.c_int64] * len(definition.axes)
        fn.argtypes = argtypes
        fn.restype = None
        self.fn = fn
        self._args: list = []  # the mapped arguments of the last prepare (or call)
        self._keep: list = []  # what keeps them alive (`host_args.map_args`)
        self._prepared = False  # a `go` needs a `prepare` since the last untimed call
        self._flush = host_args.FlushBuffer()  # written where there is no eviction library

    def _map(self, args: Sequence[ArgRef]) -> None:
        """The previous call's mappings released, ``args`` mapped (the inputs at a new address every time)."""
        host_args.release(self._keep)
        self._args, self._keep = [], []  # nothing released stays callable if mapping fails
        self._args, _outputs, self._keep = host_args.map_args(args)

    def call(self, args: Sequence[ArgRef]) -> None:
        """One untimed call on ``args``."""
        self._prepared = False
        self._map(args)
        self.fn(*self._args)

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        """Map ``args`` for the next `go`; ``flush_bytes`` > 0: evict them from every cache level with ``evict``
        (their own bytes, line by line), or without it write a buffer of ``flush_bytes`` (the caches of the core
        this process runs on, and the shared ones).

        Raises:
            OSError: an argument's file cannot be mapped.
        """
        self._prepared = False
        self._map(args)
        host_args.evict_caches(self.evict, host_args.buffers(self._keep), flush_bytes, self._flush)
        self._prepared = True

    def go(self) -> None:
        """One call on the prepared arguments. Raises UnsupportedOp without a `prepare` since the last `call`."""
        if not self._prepared:
            raise UnsupportedOp("go before prepare")
        self.fn(*self._args)
