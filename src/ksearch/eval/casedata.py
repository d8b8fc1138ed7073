"""The cases a judge checks candidates on: inputs per (workload, seed) as files in shared memory, and the
reference outputs for them, both computed once and kept for later evaluations (bounded in bytes).

A search evaluates every candidate on the same cases in the same order, so the caches are not plain LRU (a
cycle over more cases than fit would miss every time): an evaluation (`CaseData.begin`) evicts only entries it
has not used itself, least recently used first, and a case that still does not fit is served uncached (its
files live until two newer uncached cases were served, or the evaluation ends). What fits stays, and hits in
every later evaluation.

Inputs live in ``/dev/shm/ksearch-inputs-<pid>-*/`` (or the temp directory), mapped read-only into workers;
every file this process writes is remembered with its size and modification time, so that `CaseData.tampered`
finds a file a kernel changed or added behind the sandbox's back (where no mount namespace makes them
read-only). Reference outputs never leave this process.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Callable

import numpy as np

from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.guard import task_code
from ksearch.tasks.inputs import make_inputs
from ksearch.tasks.reference import run_reference
from ksearch.tasks.validate import check_reference_outputs

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


#: bytes of one comparison step in `same_bytes` (a multiple of 8; small enough to stay in the caches)
_COMPARE_CHUNK = 1 << 20


#: a torch reference (a task from elsewhere: a dropout in training mode, an unseeded torch.rand) that runs under
#: this many seconds is run twice on its first case, to refuse a reference no kernel could match
DETERMINISM_CHECK_SECONDS = 2.0


def _same_again(definition: Definition, inputs: dict, outs: dict[str, np.ndarray], case: str) -> None:
    """Raise TaskError where the reference, run again on the same inputs, gives outputs that differ beyond their
    tolerance (``|a - b| <= atol + rtol * |b|``, NaN equal to NaN, at least the tolerance's matched ratio)."""
    from ksearch.errors import TaskError

    again = run_reference(definition, inputs)
    for name, want in outs.items():
        tol = definition.tolerance_for(definition.outputs[name].dtype)
        got = again[name]
        with np.errstate(invalid="ignore", over="ignore"):
            ok = np.isclose(got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        if ok.size and ok.mean() < tol.matched_ratio:
            diff = np.abs(np.nan_to_num(got - want, nan=0.0, posinf=0.0, neginf=0.0))
            raise TaskError(f"the reference of {definition.name!r} is not deterministic: run twice on the same "
                            f"inputs ({case}) its output {name!r} differs in {int((~ok).sum())} of {ok.size} "
                            f"elements beyond atol={tol.atol:g} rtol={tol.rtol:g} (max {diff.max():.3g}), so no "
                            "kernel can match it (a dropout in training mode or an unseeded random op?)")


def _nbytes(arrays: dict) -> int:
    return sum(v.nbytes for v in arrays.values() if isinstance(v, np.ndarray))


def default_input_cache_bytes() -> int:
    """Input bytes to keep between evaluations when the config says nothing: a fifth of the memory available
    now (inputs are held twice, as arrays here and as files in shared memory), at least 3 GiB, at most 64 GiB,
    and no more than half of what the shared-memory file system has free."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    budget = min(max(3 << 30, (avail or 0) // 5), 64 << 30)
    try:
        st = os.statvfs(shared_base())
        budget = min(budget, st.f_bavail * st.f_frsize // 2)
    except OSError:
        pass
    return budget


def same_bytes(path: str | Path, value: np.ndarray) -> bool:
    """Whether the file (not a link) holds exactly ``value``'s bytes (C order), compared through a read-only
    mapping in cache-sized steps: no copy of the file, no full-size temporary."""
    expected = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size != expected.size:
            return False
        if expected.size == 0:
            return True
        mm = mmap.mmap(fd, expected.size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        return _equal_chunks(mm, expected)
    finally:
        mm.close()  # the views into it died with _equal_chunks' frame


def _equal_chunks(buffer, expected: np.ndarray) -> bool:
    got = np.frombuffer(buffer, np.uint8)
    for start in range(0, expected.size, _COMPARE_CHUNK):
        a, b = got[start:start + _COMPARE_CHUNK], expected[start:start + _COMPARE_CHUNK]
        if a.size % 8 == 0:
            a, b = a.view(np.uint64), b.view(np.uint64)
        if not np.array_equal(a, b):
            return False
    return True


class CaseData:
    """Inputs and reference outputs of one task's cases, cached; see the module docstring."""

    #: uncached cases whose files stay valid (a check's inputs serve the warm-up of the timing that follows)
    KEEP_UNCACHED = 2

    def __init__(self, definition: Definition, reference_cache_bytes: int, input_cache_bytes: int,
                 progress: Callable[[str], None] | None = None, task_limit_s: float | None = None):
        self.definition = definition
        #: seconds the task's own code (its reference, its input generator) may take per call (None: unbounded)
        self.task_limit_s = task_limit_s
        self.reference_cache_bytes, self.input_cache_bytes = reference_cache_bytes, input_cache_bytes
        self.progress = progress or (lambda msg: None)
        self._refs: OrderedDict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
        self._ref_seconds: dict[str, float] = {}
        self._ref_bytes = 0
        self._inputs: OrderedDict[tuple[str, int], tuple[dict, Path]] = OrderedDict()
        self._input_bytes = 0
        self._uncached: deque[tuple[dict, Path]] = deque()
        self._input_root: Path | None = None
        self._input_stats: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) as this process wrote it
        #: a foreign file found in a folder as it was dropped mid-evaluation (reported by `tampered`)
        self._foreign: str | None = None
        self._folders = 0
        self._generation = 0  # one per evaluation (`begin`)
        self._used: dict[tuple[str, int], int] = {}  # key -> the generation that last used it
        #: work done, for tests and profiles: inputs made, input files written, references computed
        self.counts = {"inputs": 0, "input_files": 0, "references": 0}
        self._determinism_checked = False  # a torch reference's first outputs computed twice (`_same_again`)

    def begin(self) -> None:
        """An evaluation starts: it may evict only cache entries it has not used itself."""
        self._generation += 1
        self._drop_uncached(0)

    def end(self) -> None:
        """An evaluation ended: files of uncached cases are removed."""
        self._drop_uncached(0)

    def _make_room(self, cache: OrderedDict, size: int, used: int, budget: int, size_of: Callable,
                   drop: Callable) -> tuple[bool, int]:
        """Evict entries of ``cache`` that the current evaluation has not used, least recently used first, until
        ``size`` more bytes fit in ``budget``. Nothing is evicted when that would not be enough. Returns
        (whether ``size`` fits now, the bytes cached after eviction)."""
        if used + size <= budget:
            return True, used
        evictable = [k for k in cache if not (self._generation and self._used.get(k) == self._generation)]
        if size > budget or used - sum(size_of(cache[k]) for k in evictable) + size > budget:
            return False, used
        for key in evictable:
            if used + size <= budget:
                break
            used -= drop(cache.pop(key))
            if key not in self._inputs and key not in self._refs:   # _used holds only cached keys
                self._used.pop(key, None)
        return True, used

    def reference(self, workload: Workload, seed: int, inputs: dict) -> dict[str, np.ndarray]:
        """Reference outputs for (workload, seed), computed once and cached (bounded in bytes; see the module
        docstring for what is evicted)."""
        key = (workload.uuid, seed)
        if key in self._refs:
            self._refs.move_to_end(key)
            self._used[key] = self._generation
            return self._refs[key]
        self.progress(f"reference {workload.label} seed {seed % 10000:04d}")
        t0 = time.perf_counter()
        case = f"on workload {workload.label!r} (seed {seed % 10000:04d})"
        with task_code(f"the reference of {self.definition.name!r} failed {case}:", self.task_limit_s,
                       late=f"the reference of {self.definition.name!r} {case} did not finish"):
            outs = run_reference(self.definition, inputs)
        # a wrong shape is the task's error, never a kernel's INCORRECT_SHAPE
        check_reference_outputs(self.definition, self.definition.axis_values(workload), outs, case)
        self._ref_seconds[workload.uuid] = time.perf_counter() - t0
        self.counts["references"] += 1
        if not self._determinism_checked and self.definition.reference_backend == "torch":
            self._determinism_checked = True
            if self._ref_seconds[workload.uuid] < DETERMINISM_CHECK_SECONDS:
                with task_code(f"the reference of {self.definition.name!r} failed {case}:", self.task_limit_s,
                               late=f"the reference of {self.definition.name!r} {case}, run twice, did not finish"):
                    _same_again(self.definition, inputs, outs, f"{workload.label} seed {seed % 10000:04d}")
        outs = {k: (v.astype(np.float32) if v.size > _F32_CACHE_ABOVE else v) for k, v in outs.items()}
        size = sum(v.nbytes for v in outs.values())
        fits, self._ref_bytes = self._make_room(self._refs, size, self._ref_bytes, self.reference_cache_bytes,
                                                _nbytes, _nbytes)
        if fits:
            self._refs[key] = outs
            self._ref_bytes += size
            self._used[key] = self._generation
        return outs

    def reference_seconds(self, workload: Workload) -> float | None:
        """Wall seconds the last reference computation of this workload took (None: none computed yet)."""
        return self._ref_seconds.get(workload.uuid)

    def inputs(self, workload: Workload, seed: int) -> tuple[dict, Path]:
        """Inputs for (workload, seed) and the directory holding them as files (``in.<name>``), made once and
        reused by later evaluations (bounded in bytes; see the module docstring). Each evaluation still runs in
        a fresh process, and the files are verified unchanged after every call."""
        key = (workload.uuid, seed)
        if key in self._inputs:
            self._inputs.move_to_end(key)
            self._used[key] = self._generation
            return self._inputs[key]
        root = self.root()
        self.progress(f"inputs {workload.label} seed {seed % 10000:04d}")
        with task_code(f"making the inputs of workload {workload.label!r} failed:", self.task_limit_s,
                       late=f"making the inputs of {self.definition.name!r}'s workload {workload.label!r} "
                            f"(seed {seed % 10000:04d}) did not finish"):
            inputs = make_inputs(self.definition, workload, seed)
        self.counts["inputs"] += 1
        size = _nbytes(inputs)
        fits, self._input_bytes = self._make_room(self._inputs, size, self._input_bytes, self.input_cache_bytes,
                                                  lambda entry: _nbytes(entry[0]), self._drop_entry)
        if not fits:
            self._drop_uncached(self.KEEP_UNCACHED - 1)
        self._folders += 1
        folder = root / f"{self._folders}-{seed % 100000}-{workload.uuid[:8]}"
        folder.mkdir()
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                self.write_input(value, folder / f"in.{name}")
        if fits:
            self._inputs[key] = (inputs, folder)
            self._input_bytes += size
            self._used[key] = self._generation
        else:
            self._uncached.append((inputs, folder))
        return inputs, folder

    def root(self) -> Path:
        """The directory under which every input file of this CaseData lies (created on first use): what a
        worker must be able to read, and nothing else of shared memory."""
        if self._input_root is None:
            self._input_root = shared_dir("ksearch-inputs-")
        return self._input_root

    def _foreign_file(self, root: Path) -> str | None:
        """The first file under ``root`` that this process did not write as it is now, or None."""
        for dirpath, _dirnames, filenames in os.walk(root):
            for f in filenames:
                path = os.path.join(dirpath, f)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if self._input_stats.get(path) != (st.st_size, st.st_mtime_ns):
                    return path
        return None

    def _drop_entry(self, entry: tuple[dict, Path]) -> int:
        """Remove an input entry's files (a foreign file there is remembered for `tampered` first); returns its
        bytes."""
        inputs, folder = entry
        if self._foreign is None:
            self._foreign = self._foreign_file(folder)
        shutil.rmtree(folder, ignore_errors=True)
        prefix = f"{folder}/"
        self._input_stats = {p: st for p, st in self._input_stats.items() if not p.startswith(prefix)}
        return _nbytes(inputs)

    def _drop_uncached(self, keep: int) -> None:
        while len(self._uncached) > keep:
            self._drop_entry(self._uncached.popleft())

    def write_input(self, value: np.ndarray, path: Path) -> None:
        """Write an input file (a link or file a kernel put there is removed first, never written through)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        value.tofile(path)
        self.counts["input_files"] += 1
        st = path.stat()
        self._input_stats[str(path)] = (st.st_size, st.st_mtime_ns)

    def tampered(self) -> str | None:
        """The first file under the input directory that this process did not write as it is now (a kernel
        that escaped its sandbox wrote there), or None. The input cache is dropped when one is found."""
        if self._input_root is None:
            return None
        found, self._foreign = self._foreign or self._foreign_file(self._input_root), None
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
            self._uncached.clear()
            self._input_stats.clear()
            self._input_bytes = 0
        self._foreign = None

    def __del__(self):
        self.close()
