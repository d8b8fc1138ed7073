"""The null target inside the worker: the candidate module's ``run`` on NumPy arrays, behind the `Runner` contract.

On the controller's clock, as the cpu target (`ksearch.targets.base.Runner`): ``prepare`` (outside the timed
region) maps the arguments, inputs read-only and outputs writable (NumPy memory maps of the controller's files:
what ``run`` writes reaches the file the controller reads back), and evicts them from the caches with the
judge's library (or writes a buffer without it); the judge then times ``go`` (one call) with its own clock.
Imported only in the worker.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ksearch.errors import CandidateError, KernelCompileError, UnsupportedOp
from ksearch.protocol import ArgRef, ArrayRef
from ksearch.targets import host_args
from ksearch.targets.base import ControllerClockRunner


def map_arrays(refs: Sequence[ArgRef]) -> list:
    """Call arguments as the null ABI takes them: an input a read-only NumPy array of the controller's file, an
    output a writable memory map of its file, a scalar by value. Raises OSError (or ValueError) when a file is
    missing or shorter than its shape says."""
    args: list = []
    for ref in refs:
        if not isinstance(ref, ArrayRef):
            args.append(ref.value)
        elif ref.size * np.dtype(ref.dtype).itemsize == 0:
            empty = np.zeros(ref.shape, ref.dtype)
            empty.flags.writeable = ref.writable
            args.append(empty)
        else:
            args.append(np.memmap(ref.path, dtype=ref.dtype, mode="r+" if ref.writable else "r",
                                  shape=tuple(ref.shape)))
    return args


class NullRunner(ControllerClockRunner):
    """A null candidate: its module imported from the artifact, ``entry_point`` called on `map_arrays`' arguments.

    Args:
        artifact: the module `NullTarget.compile` wrote; entry_point: the function's name; source_name: the file
            name the candidate gave it (for messages).
    Raises:
        KernelCompileError: the module does not import (its exception, the candidate's lines), or defines no
            callable ``entry_point`` (a COMPILE_ERROR).
    """

    def __init__(self, artifact: Path, entry_point: str, source_name: str = "kernel.py"):
        self.artifact, self.source_name = Path(artifact), source_name
        name = f"ksearch_null_candidate_{os.getpid()}"
        spec = importlib.util.spec_from_file_location(name, str(self.artifact))
        if spec is None or spec.loader is None:
            raise KernelCompileError(f"{source_name}: cannot be imported from {self.artifact}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:
            raise KernelCompileError(f"{source_name} does not import:\n{self._format(e)}") from None
        fn = getattr(module, entry_point, None)
        if not callable(fn):
            raise KernelCompileError(f"{source_name} defines no function {entry_point!r} (the entry point)")
        self.fn = fn
        self._args: list = []
        self._prepared = False  # a `go` needs a `prepare` since the last untimed call
        self._flush = host_args.FlushBuffer()  # written where there is no eviction library

    def _format(self, e: BaseException, limit: int = 12) -> str:
        """The exception with the candidate's frames only, its file named as the candidate names it."""
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(self.artifact)]
        lines = [f"  {self.source_name}:{f.lineno} in {f.name}: {(f.line or '').strip()}" for f in frames[-limit:]]
        return "\n".join([*lines, "".join(traceback.format_exception_only(type(e), e)).strip()])

    def _run(self) -> None:
        try:
            self.fn(*self._args)
        except Exception as e:  # the candidate's fault: a RUNTIME_ERROR with its line
            raise CandidateError(self._format(e)) from None

    def call(self, args: Sequence[ArgRef]) -> None:
        """One untimed call on ``args``."""
        self._prepared = False
        self._args = map_arrays(args)
        self._run()

    def prepare(self, args: Sequence[ArgRef], flush_bytes: int) -> None:
        """Map ``args`` for the next `go`; ``flush_bytes`` > 0: evict the arrays from every cache level with
        ``evict``, or without it write a buffer of ``flush_bytes``. Raises OSError when a file cannot be mapped."""
        self._prepared = False
        self._args = map_arrays(args)
        arrays = ((a.ctypes.data, a.nbytes) for a in self._args if isinstance(a, np.ndarray) and a.nbytes)
        host_args.evict_caches(self.evict, arrays, flush_bytes, self._flush)
        self._prepared = True

    def go(self) -> None:
        """One call on the prepared arguments. Raises UnsupportedOp without a `prepare` since the last `call`."""
        if not self._prepared:
            raise UnsupportedOp("go before prepare")
        self._run()
