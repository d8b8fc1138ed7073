"""The cpu target: C or C++ kernels compiled by the system compiler, called through ctypes.

ABI: ``void <entry_point>(inputs..., outputs..., axes...)`` with inputs and outputs in definition order as
pointers to row-major contiguous arrays (float32 -> ``float*``, float16 -> ``_Float16*``, bfloat16 ->
``uint16_t*``, int32 -> ``int32_t*``, ...; inputs ``const``), Python-scalar inputs as ``double`` (floats) or
``int64_t`` (ints and bools), then every axis (const and var, definition order) as ``int64_t``.
C++ sources (``.cpp``/``.cc``) must declare the entry point ``extern "C"``.

Flags: ``-O3 -march=native -fopenmp -shared -fPIC`` plus the candidate's ``compile_flags``. Builds are cached
under ``$KSEARCH_HOME/cache/cpu/`` by the hash of the sources, flags and compiler version.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from ksearch import config
from ksearch.errors import TargetError
from ksearch.eval.records import Candidate
from ksearch.targets.base import CompileResult
from ksearch.tasks.definition import Definition

BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_CXX_EXT = (".cpp", ".cc", ".cxx")
_SRC_EXT = (".c",) + _CXX_EXT
#: flags a candidate may not pass: they would change what is loaded, what is included, or where files go
_FORBIDDEN_FLAG_PREFIXES = ("-o", "-B", "-wrapper", "-fplugin", "-specs", "@", "-Wl,", "-l", "-L", "--sysroot",
                            "-I", "-i", "--include", "-X", "-z", "-T", "-fprofile", "-fauto-profile", "-fdump",
                            "-fcoverage", "--coverage", "-save-temps", "-fdebug-prefix-map", "-fmacro-prefix-map")
_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d)*)\s*$')


@lru_cache(maxsize=4)
def compiler_version(compiler: str) -> str:
    """First line of ``<compiler> --version``. Raises TargetError when the compiler is missing."""
    path = shutil.which(compiler)
    if path is None:
        raise TargetError(f"C compiler {compiler!r} not found on PATH (set CC to another compiler)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else path


class CpuTarget:
    name = "cpu"

    def available(self) -> str | None:
        try:
            compiler_version(config.c_compiler())
        except TargetError as e:
            return str(e)
        return None

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Build the candidate into a shared library (cached).

        Returns a CompileResult with ok=False and the compiler's message for a bad kernel; raises TargetError
        only when the toolchain itself is missing.
        """
        t0 = time.perf_counter()
        srcs = {n: s for n, s in candidate.sources.items() if n.endswith(_SRC_EXT)}
        if not srcs:
            return CompileResult(False, None, f"no C/C++ source among {sorted(candidate.sources)} "
                                 f"(expected a file ending in {', '.join(_SRC_EXT)})", 0.0)
        refused = self._refused(candidate)
        if refused:
            return CompileResult(False, None, refused, 0.0)
        is_cxx = any(n.endswith(_CXX_EXT) for n in srcs)
        compiler = config.cxx_compiler() if is_cxx else config.c_compiler()
        version = compiler_version(compiler)
        flags = BASE_FLAGS + list(candidate.compile_flags)
        key = hashlib.sha256(f"{candidate.id}|{compiler}|{version}|{' '.join(flags)}".encode()).hexdigest()[:24]
        cache_dir = config.home_dir() / "cache" / "cpu"
        cache_dir.mkdir(parents=True, exist_ok=True)
        artifact = cache_dir / f"{key}.so"
        if artifact.is_file():
            return CompileResult(True, artifact, "(cached)", time.perf_counter() - t0, cached=True)
        with tempfile.TemporaryDirectory(prefix="ksearch-cc-") as tmp:
            for name, text in candidate.sources.items():
                (Path(tmp) / name).write_text(text)
            out = Path(tmp) / "kernel.so"
            cmd = [compiler, *flags, "-o", str(out), *sorted(srcs), "-lm"]
            try:
                proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return CompileResult(False, None, f"compiler timed out after {timeout_s:g} s", time.perf_counter() - t0)
            log = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0 or not out.is_file():
                return CompileResult(False, None, log or f"compiler exited with {proc.returncode}",
                                     time.perf_counter() - t0)
            partial = artifact.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
            shutil.copyfile(out, partial)
            partial.replace(artifact)  # atomic: a concurrent build of the same key is harmless
        return CompileResult(True, artifact, log, time.perf_counter() - t0)

    def expand(self, candidate: Candidate, timeout_s: float = 60.0):
        """The candidate's own lines after the C preprocessor, for the static checks.

        Returns ``(lines, includes)``: ``{file: [(line, text), ...]}`` for every line that comes from one of
        the candidate's files (macros expanded), and ``{file: [(line, path)]}`` for files it includes that
        are neither its own nor system headers; None when the preprocessor fails (the compile reports it).
        """
        srcs = sorted(n for n in candidate.sources if n.endswith(_SRC_EXT))
        if not srcs or self._refused(candidate):
            return None
        compiler = config.cxx_compiler() if any(n.endswith(_CXX_EXT) for n in srcs) else config.c_compiler()
        lines: dict[str, list[tuple[int, str]]] = {}
        includes: dict[str, list[tuple[int, str]]] = {}
        with tempfile.TemporaryDirectory(prefix="ksearch-cpp-") as tmp:
            for name, text in candidate.sources.items():
                (Path(tmp) / name).write_text(text)
            for src in srcs:
                try:
                    proc = subprocess.run([compiler, *BASE_FLAGS, *candidate.compile_flags, "-E", src], cwd=tmp,
                                          capture_output=True, text=True, timeout=timeout_s)
                except (OSError, subprocess.TimeoutExpired):
                    return None
                if proc.returncode != 0:
                    return None
                _own_lines(proc.stdout, set(candidate.sources), tmp, lines, includes)
        return lines, includes

    @staticmethod
    def _refused(candidate: Candidate) -> str | None:
        for flag in candidate.compile_flags:
            if flag.startswith(_FORBIDDEN_FLAG_PREFIXES):
                return f"compile flag {flag!r} is not allowed for candidates"
        for name in candidate.sources:
            if "/" in name or name.startswith(".") or ".." in name:
                return f"source name {name!r} must be a plain file name"
        return None

    def load(self, artifact: Path, candidate: Candidate, definition: Definition):
        """Inside the worker: the entry point with ctypes argument types set from the definition.

        Raises:
            TargetError: the library does not load or has no such entry point (reported as RUNTIME_ERROR).
        """
        try:
            lib = ctypes.CDLL(str(artifact), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise TargetError(f"cannot load the built kernel: {e}") from None
        try:
            fn = getattr(lib, candidate.entry_point)
        except AttributeError:
            raise TargetError(f"the kernel defines no function {candidate.entry_point!r} "
                              "(C++ sources need extern \"C\")") from None
        argtypes = []
        for spec in list(definition.inputs.values()) + list(definition.outputs.values()):
            if spec.shape is None:
                argtypes.append(ctypes.c_double if spec.dtype.startswith("float") else ctypes.c_int64)
            else:
                argtypes.append(ctypes.c_void_p)
        argtypes += [ctypes.c_int64] * len(definition.axes)
        fn.argtypes = argtypes
        fn.restype = None
        return fn


def _own_lines(output: str, own: set[str], tmp: str, lines: dict, includes: dict) -> None:
    """Split ``cc -E`` output by its line markers into the candidate's own lines and foreign includes."""
    current, line = None, 0
    stack: list[tuple[str | None, int]] = []
    for text in output.split("\n"):
        m = _MARKER.match(text)
        if m is None:
            if current is not None:
                lines.setdefault(current, []).append((line, text))
            line += 1
            continue
        path, flags = m.group(2), m.group(3).split()
        name = path[len(tmp) + 1:] if path.startswith(tmp + "/") else path
        if "1" in flags:  # entering an included file from `current`
            stack.append((current, line - 1))
            if name not in own and "3" not in flags and not name.startswith("<") and stack[-1][0] is not None:
                includes.setdefault(stack[-1][0], []).append((stack[-1][1], path))
        elif "2" in flags and stack:  # back in the includer
            stack.pop()
        current, line = (name if name in own else None), int(m.group(1))
