"""The cases a judge checks candidates on: inputs per (workload, seed) as files in shared memory, and the
reference outputs for them, both computed once and kept for later evaluations (LRU, bounded in bytes).

Inputs live in ``/dev/shm/ksearch-inputs-<pid>-*/`` (or the temp directory), mapped read-only into workers;
every file this process writes is remembered with its size and modification time, so that `CaseData.tampered`
finds a file a kernel changed or added behind the sandbox's back (where no mount namespace makes them
read-only). Reference outputs never leave this process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import numpy as np

from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference

#: reference outputs larger than this many elements are cached as float32 (error ~6e-8 relative, far
#: below any task tolerance) to bound the cache's memory
_F32_CACHE_ABOVE = 1 << 20


def shared_base() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def shared_dir(prefix: str = "ksearch-eval-") -> Path:
    """A new directory in shared memory (/dev/shm) when there is one, else in the temp directory, named
    after this process so that `remove_stale_dirs` can clean up after a killed run."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=shared_base()))


def remove_stale_dirs() -> int:
    """Delete judge directories left by ksearch processes that no longer exist (killed runs). Returns how many."""
    removed = 0
    for d in shared_base().glob("ksearch-*-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed


def _nbytes(arrays: dict) -> int:
    return sum(v.nbytes for v in arrays.values() if isinstance(v, np.ndarray))


class CaseData:
    """Inputs and reference outputs of one task's cases, cached; see the module docstring."""

    def __init__(self, definition: Definition, reference_cache_bytes: int, input_cache_bytes: int,
                 progress: Callable[[str], None] | None = None):
        self.definition = definition
        self.reference_cache_bytes, self.input_cache_bytes = reference_cache_bytes, input_cache_bytes
        self.progress = progress or (lambda msg: None)
        self._refs: OrderedDict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
        self._ref_bytes = 0
        self._inputs: OrderedDict[tuple[str, int], tuple[dict, Path]] = OrderedDict()
        self._input_bytes = 0
        self._input_root: Path | None = None
        self._input_stats: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) as this process wrote it

    def reference(self, workload: Workload, seed: int, inputs: dict) -> dict[str, np.ndarray]:
        """Reference outputs for (workload, seed), computed once and cached (LRU, bounded in bytes)."""
        key = (workload.uuid, seed)
        if key in self._refs:
            self._refs.move_to_end(key)
            return self._refs[key]
        self.progress(f"reference {workload.label} seed {seed % 10000:04d}")
        outs = run_reference(self.definition, inputs)
        outs = {k: (v.astype(np.float32) if v.size > _F32_CACHE_ABOVE else v) for k, v in outs.items()}
        self._refs[key] = outs
        self._ref_bytes += sum(v.nbytes for v in outs.values())
        while self._ref_bytes > self.reference_cache_bytes and len(self._refs) > 1:
            _, old = self._refs.popitem(last=False)
            self._ref_bytes -= sum(v.nbytes for v in old.values())
        return outs

    def inputs(self, workload: Workload, seed: int) -> tuple[dict, Path]:
        """Inputs for (workload, seed) and the directory holding them as files (``in.<name>``), made once and
        reused by later evaluations (LRU, bounded in bytes). Each evaluation still runs in a fresh process,
        and the files are verified unchanged after every call."""
        key = (workload.uuid, seed)
        if key in self._inputs:
            self._inputs.move_to_end(key)
            return self._inputs[key]
        if self._input_root is None:
            self._input_root = shared_dir("ksearch-inputs-")
        inputs = make_inputs(self.definition, workload, seed)
        folder = self._input_root / f"{len(self._inputs)}-{seed % 100000}-{workload.uuid[:8]}"
        folder.mkdir()
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                self.write_input(value, folder / f"in.{name}")
        self._inputs[key] = (inputs, folder)
        self._input_bytes += _nbytes(inputs)
        while self._input_bytes > self.input_cache_bytes and len(self._inputs) > 1:
            _, (old, old_dir) = self._inputs.popitem(last=False)
            self._input_bytes -= _nbytes(old)
            shutil.rmtree(old_dir, ignore_errors=True)
            self._input_stats = {p: st for p, st in self._input_stats.items() if not p.startswith(f"{old_dir}/")}
        return inputs, folder

    def write_input(self, value: np.ndarray, path: Path) -> None:
        value.tofile(path)
        st = path.stat()
        self._input_stats[str(path)] = (st.st_size, st.st_mtime_ns)

    def tampered(self) -> str | None:
        """The first file under the input directory that this process did not write as it is now (a kernel
        that escaped its sandbox wrote there), or None. The input cache is dropped when one is found."""
        if self._input_root is None:
            return None
        found = None
        for dirpath, dirnames, filenames in os.walk(self._input_root):
            for f in filenames:
                path = os.path.join(dirpath, f)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if self._input_stats.get(path) != (st.st_size, st.st_mtime_ns):
                    found = path
                    break
            if found:
                break
        if found is None and len(self._input_stats) != sum(1 for _ in self._input_root.rglob("in.*")):
            found = str(self._input_root)  # a file of ours was removed
        if found is not None:
            self.close()
        return found

    def close(self) -> None:
        """Remove the input files (also done at interpreter exit)."""
        if self._input_root is not None:
            shutil.rmtree(self._input_root, ignore_errors=True)
            self._input_root = None
            self._inputs.clear()
            self._input_stats.clear()
            self._input_bytes = 0

    def __del__(self):
        self.close()
