"""The cpu target: C or C++ kernels compiled by the system compiler, called through ctypes.

ABI: ``void <entry_point>(inputs..., outputs..., axes...)`` with inputs and outputs in definition order as
pointers to row-major contiguous arrays (float32 -> ``float*``, float16 -> ``_Float16*``, bfloat16 ->
``uint16_t*``, int32 -> ``int32_t*``, ...; inputs ``const``), Python-scalar inputs as ``double`` (floats) or
``int64_t`` (ints and bools), then every axis (const and var, definition order) as ``int64_t``.
C++ sources (``.cpp``/``.cc``) must declare the entry point ``extern "C"``.

Flags: ``-O3 -march=native -fopenmp -shared -fPIC`` plus the candidate's ``compile_flags``, each of which must
be on the allow-list `ALLOWED_FLAGS` (checked before any process starts). The compiler, for the build and for
the static checks' preprocessor run (`CpuTarget.expand`), runs in the compile jail (`ksearch.jail.compile_jail`:
no home, no secrets, only the toolchain and the build directory in view, resource limits). Builds are cached
under ``$KSEARCH_HOME/cache/cpu/`` by the hash of the sources, flags and compiler version.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ksearch import config
from ksearch.errors import TargetError
from ksearch.jail import compile_jail
from ksearch.jail.compile_jail import CompilePolicy, JailedRun, unenforced
from ksearch.records import Candidate, Profile
from ksearch.targets.abi_types import C_TYPES, c_params
from ksearch.targets.base import PROMPTS_DIR, CompileResult, naive_from_task
from ksearch.tasks.definition import Definition

if TYPE_CHECKING:
    from ksearch.hardware.spec import HardwareSpec
    from ksearch.tasks.loader import Task

BASE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_CXX_EXT = (".cpp", ".cc", ".cxx")
_SRC_EXT = (".c",) + _CXX_EXT
#: a source's name: letters, digits, ``_+-`` and dots, not first, with a suffix (so never a flag or a path)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+-]*(\.[A-Za-z0-9_+-]+)+")
#: -f flags that only change the generated code (each also as -fno-...)
_CODEGEN = (
    # floating point
    "fast-math", "unsafe-math-optimizations", "associative-math", "reciprocal-math", "finite-math-only",
    "signed-zeros", "trapping-math", "math-errno", "rounding-math", "signaling-nans", "cx-limited-range",
    "single-precision-constant",
    # loops, vectorisation, OpenMP
    "unroll-loops", "unroll-all-loops", "peel-loops", "split-loops", "unswitch-loops", "vectorize",
    "slp-vectorize", "prefetch-loop-arrays", "variable-expansion-in-unroller", "ivopts", "predictive-commoning",
    "version-loops-for-strides", "move-loop-invariants", "openmp", "openmp-simd",
    # inlining, aliasing, scheduling, the rest of -O's switches
    "inline", "inline-functions", "inline-small-functions", "inline-functions-called-once", "early-inlining",
    "strict-aliasing", "strict-overflow", "wrapv", "omit-frame-pointer", "schedule-insns", "schedule-insns2",
    "tracer", "web", "rename-registers", "optimize-sibling-calls", "expensive-optimizations", "peephole",
    "peephole2", "crossjumping", "if-conversion", "if-conversion2", "shrink-wrap", "split-paths",
    "hoist-adjacent-loads", "store-merging", "merge-constants", "ira-loop-pressure", "semantic-interposition",
    "plt", "builtin", "common", "lto", "pic", "PIC", "pie", "PIE", "exceptions", "rtti", "threadsafe-statics",
    "unwind-tables", "asynchronous-unwind-tables", "stack-protector", "stack-protector-strong",
    "stack-protector-all", "stack-clash-protection", "function-sections", "data-sections", "permissive",
)
#: the flags a candidate may add (each must match one pattern whole; `ALLOWED_FLAGS_TEXT` says them in words).
#: Nothing here names a file, a directory, a language, a plug-in or an option for another tool.
ALLOWED_FLAGS = tuple(re.compile(p) for p in (
    r"-O[0-3sgz]?|-Ofast",
    r"-m(no-)?(?!llvm$)[a-z0-9][a-z0-9.-]{1,40}",  # ISA extensions and code-model switches: -mavx2, -mno-fma
    r"-m[a-z0-9][a-z0-9-]{1,40}=[A-Za-z0-9_.,+-]{1,64}",  # -march=, -mtune=, -mprefer-vector-width=: no path
    r"-f(no-)?(" + "|".join(re.escape(f) for f in _CODEGEN) + ")",
    r"-f(no-)?(tree|ipa|loop|sched|sched2|modulo-sched|reorder-blocks|gcse|graphite)(-[a-z0-9]+){0,6}",
    r"-ffp-contract=(off|on|fast|fast-honor-pragmas)",
    r"-f(vect|simd)-cost-model=(unlimited|dynamic|cheap|very-cheap)",
    r"-fexcess-precision=(fast|standard|16)",
    r"-falign-(functions|loops|jumps|labels)(=[0-9:]{1,16})?",
    r"-f(tree-parallelize-loops|inline-limit|max-errors)=[0-9]{1,6}",
    r"-fvisibility=(default|hidden|internal|protected)",
    r"-fdiagnostics-color(=(always|never|auto))?",
    r"--param=[a-z0-9-]{1,64}=[0-9]{1,9}",
    r"-D[A-Za-z_][A-Za-z0-9_]{0,63}(=[A-Za-z0-9_.+*/()-]{0,64})?",
    r"-U[A-Za-z_][A-Za-z0-9_]{0,63}",
    r"-std=(c|gnu|c\+\+|gnu\+\+)[0-9a-z]{1,3}|-std=iso9899:[0-9a-z]{1,6}|-ansi",
    r"-W(no-)?(error=)?[a-z][a-z0-9+-]{1,48}(=[0-9a-z-]{1,16})?",  # warnings (-Wl, -Wa, -Wp: 1 letter: refused)
    r"-w|-pedantic|-pedantic-errors|-g[0-3]?|-pthread",
))
ALLOWED_FLAGS_TEXT = ("-O0..-O3, -Os, -Og, -Oz, -Ofast; -march=, -mtune=, ISA and code-model -m<x> / -mno-<x> / "
                      "-m<x>=<value> (-mavx2, -mfma, -mprefer-vector-width=256, ...); code-generation -f<x> / "
                      "-fno-<x> (fast-math family, unrolling, vectorisation, -fopenmp-simd, -ftree-*, inlining, "
                      "aliasing, ...); -ffp-contract=, -fvect-cost-model=, -fexcess-precision=, -falign-*=; "
                      "--param=<name>=<int>; -D<NAME>[=<number, identifier or arithmetic>], -U<NAME>; -std=; "
                      "-W<warning>, -w, -pedantic, -g")
_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d)*)\s*$')


def refused_flag(flag: str) -> str | None:
    """Why a candidate's compile flag is refused (None: it is on the allow-list `ALLOWED_FLAGS`)."""
    if any(p.fullmatch(flag) for p in ALLOWED_FLAGS):
        return None
    return f"compile flag {flag!r} is not allowed for candidates; allowed: {ALLOWED_FLAGS_TEXT}"


@lru_cache(maxsize=4)
def compiler_version(compiler: str) -> str:
    """First line of ``<compiler> --version``. Raises TargetError when the compiler is missing."""
    path = shutil.which(compiler)
    if path is None:
        raise TargetError(f"C compiler {compiler!r} not found on PATH (set CC to another compiler)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).splitlines()[0] if (out.stdout or out.stderr) else path


class CpuTarget:
    """The cpu target. ``jail``: what the compile jail enforces on the compiler (`compile_jail`)."""

    name = "cpu"
    summary = "C or C++ compiled by the system compiler, called through ctypes"
    source_suffixes = _SRC_EXT
    fence_langs = {".c": "c", ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp"}
    fence_files = {"c": "kernel.c", "cpp": "kernel.cpp", "c++": "kernel.cpp", "cxx": "kernel.cpp", "cc": "kernel.cpp"}
    fence_lang = "c"
    naive_file = "kernel.c"
    takes_launch = False
    launch_keys = ""
    ctypes = C_TYPES
    hardware_kind = "cpu"
    needs_gpu = False
    gpu_devices: tuple[str, ...] = ()
    gpu_env: tuple[str, ...] = ()
    spare_workers = True
    rule_family = "cpu"
    limit_family = "cpu"
    translation_map = "cpu"
    torch_device = "cpu"
    runs_mlx = False
    checks_without_device = None
    prompt_template = PROMPTS_DIR / "cpu.j2"
    flags_help = ALLOWED_FLAGS_TEXT
    reply_format = ("one ```c block (kernel.c; or one ```cpp block for C++, kernel.cpp, with the entry point "
                    "`extern \"C\"`)")

    def __init__(self, jail: CompilePolicy | None = None):
        self.jail = jail or CompilePolicy()

    def abi(self, definition: Definition) -> str:
        """``void run(inputs..., outputs..., axes...);`` in the C dialect (see the module docstring)."""
        return f"void run({', '.join(c_params(definition, self.ctypes, 'int64_t'))});"

    def naive_candidate(self, task: Task) -> Candidate | None:
        return naive_from_task(self, task)

    def hardware_spec(self) -> HardwareSpec:
        """The local CPU's spec: measured once, then cached (`ksearch.hardware.cache.load_or_measure`)."""
        from ksearch.hardware.cache import load_or_measure

        return load_or_measure()

    def launch_problem(self, candidate: Candidate, definition: Definition, axes: dict[str, int]) -> str | None:
        return None

    def available(self) -> str | None:
        try:
            compiler_version(config.c_compiler())
        except TargetError as e:
            return str(e)
        return None

    def compile(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> CompileResult:
        """Build the candidate into a shared library (cached), the compiler in the compile jail.

        Returns a CompileResult with ok=False and the compiler's message for a bad kernel (a refused flag or
        file name: before any process starts; a limit of the jail: named first); raises TargetError only
        when the toolchain itself is missing or the jail's launcher cannot start.
        """
        t0 = time.perf_counter()
        srcs = {n: s for n, s in candidate.sources.items() if n.endswith(_SRC_EXT)}
        if not srcs:
            return CompileResult(False, None, f"no C/C++ source among {sorted(candidate.sources)} "
                                 f"(expected a file ending in {', '.join(_SRC_EXT)})", 0.0)
        refused = self._refused(candidate)
        if refused:
            return CompileResult(False, None, refused, 0.0)
        compiler, version, flags, key = self._build_key(candidate, srcs)
        cache_dir = config.home_dir() / "cache" / "cpu"
        cache_dir.mkdir(parents=True, exist_ok=True)
        artifact = cache_dir / f"{key}.so"
        if artifact.is_file():
            return CompileResult(True, artifact, "(cached)", time.perf_counter() - t0, cached=True)
        run, built = self._build(candidate.sources, [compiler, *flags, *sorted(srcs), "-lm"], artifact, timeout_s)
        log = _log(run)
        if not built:
            return CompileResult(False, None, log or f"compiler exited with {run.returncode}", time.perf_counter() - t0)
        return CompileResult(True, artifact, log, time.perf_counter() - t0)

    @staticmethod
    def _build_key(candidate: Candidate, srcs: dict[str, str]) -> tuple[str, str, list[str], str]:
        """(compiler, its version, flags, the build's cache key). Raises TargetError without the compiler."""
        compiler = config.cxx_compiler() if any(n.endswith(_CXX_EXT) for n in srcs) else config.c_compiler()
        version = compiler_version(compiler)
        flags = BASE_FLAGS + list(candidate.compile_flags)
        key = hashlib.sha256(f"{candidate.id}|{compiler}|{version}|{' '.join(flags)}".encode()).hexdigest()[:24]
        return compiler, version, flags, key

    def compile_report(self, candidate: Candidate, definition: Definition, timeout_s: float = 120.0) -> Profile | None:
        """The vectorizer's report on the candidate (`ksearch.targets.cpu_vecreport.build_report`: GCC's
        ``-fopt-info-vec``, Clang's ``-Rpass=loop-vectorize``, from a build like `compile`'s in the compile jail)."""
        from ksearch.targets.cpu_vecreport import build_report

        return build_report(self, candidate, timeout_s)

    def profiler(self) -> None:
        """No profiler runs a cpu kernel (the machine has no counters the judge reads: the roofline's bound is in
        each workload's result instead)."""
        return None

    def _build(self, sources: dict[str, str], argv: list[str], artifact: Path, timeout_s: float) -> tuple[JailedRun, bool]:
        """Write ``sources`` to a fresh directory, run ``argv -o out.so`` there in the compile jail and, when it
        built, move the library to ``artifact`` (atomically: a concurrent build of the same key is harmless)."""
        with tempfile.TemporaryDirectory(prefix="ksearch-cc-") as tmp:
            build = Path(tmp).resolve()
            for name, text in sources.items():
                (build / name).write_text(text)
            run = self._jailed([*argv, "-o", "out.so"], build, timeout_s)
            out = build / "out.so"
            if run.returncode != 0 or run.timed_out or not out.is_file():
                return run, False
            artifact.parent.mkdir(parents=True, exist_ok=True)
            partial = artifact.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
            shutil.copyfile(out, partial)
            partial.replace(artifact)
        return run, True

    def evict_library(self, timeout_s: float = 60.0) -> Path | None:
        """The judge's cache-eviction library (``ksearch/targets/native/evict.c``: CLFLUSHOPT/CLFLUSH on x86-64,
        DC CIVAC on AArch64), built in the compile jail once per compiler and cached beside the kernels. The
        worker loads it before the kernel and evicts the inputs and outputs of every timed call with it, at a cost
        proportional to the workload's bytes rather than to the last-level cache (a VM's CPU may report its host's
        whole L3: 480 MB seen). None when it cannot be built: the worker then writes a buffer."""
        src = Path(__file__).resolve().parent / "native" / "evict.c"
        try:
            compiler = config.c_compiler()
            version = compiler_version(compiler)
        except TargetError:
            return None
        text = src.read_text()
        key = hashlib.sha256(f"{text}|{compiler}|{version}|{platform.machine()}".encode()).hexdigest()[:24]
        lib = config.home_dir() / "cache" / "cpu" / f"evict-{key}.so"
        if lib.is_file():
            return lib
        try:
            _, built = self._build({"evict.c": text}, [compiler, "-O2", "-shared", "-fPIC", "evict.c"], lib, timeout_s)
        except (TargetError, OSError):  # no jail, or a home that cannot be written: the worker writes its buffer
            return None
        return lib if built else None

    def expand(self, candidate: Candidate, timeout_s: float = 20.0):
        """The candidate's own lines after the C preprocessor (run in the compile jail), for the static checks.

        Returns ``(lines, includes)``: ``{file: [(line, text), ...]}`` for every line that comes from one of
        the candidate's files (macros expanded), and ``{file: [(line, path)]}`` for files it includes that
        are neither its own nor system headers. When the preprocessor stops at an include it cannot find (a
        host file outside the jail's view, or a typo), that include is reported and the lines are the
        source's own, unexpanded. None when the preprocessor fails otherwise (the compile reports it).
        Results are kept in memory by content (sources, flags, compiler), so a candidate evaluated again
        costs no second run.
        """
        srcs = sorted(n for n in candidate.sources if n.endswith(_SRC_EXT))
        if not srcs or self._refused(candidate):
            return None
        compiler = config.cxx_compiler() if any(n.endswith(_CXX_EXT) for n in srcs) else config.c_compiler()
        try:
            key = f"{candidate.id}|{compiler}|{compiler_version(compiler)}|{self.jail.model_dump_json()}"
        except TargetError:
            return None
        if key in _EXPANDED:
            _EXPANDED.move_to_end(key)
            return _EXPANDED[key]
        lines: dict[str, list[tuple[int, str]]] = {}
        includes: dict[str, list[tuple[int, str]]] = {}
        with tempfile.TemporaryDirectory(prefix="ksearch-cpp-") as tmp:
            build = _write_sources(candidate, tmp)
            for i, src in enumerate(srcs):
                out = build / f".expanded-{i}.i"
                try:
                    run = self._jailed([compiler, *BASE_FLAGS, *candidate.compile_flags, "-E", "-o", out.name, src],
                                       build, timeout_s)
                except TargetError:
                    return None
                if run.returncode == 0 and not run.timed_out and out.is_file():
                    _own_lines(out.read_text(errors="replace"), set(candidate.sources), str(build), lines, includes)
                    continue
                missing = _missing_includes(run.log, set(candidate.sources), str(build))
                if not missing:
                    return None
                for name, found in missing.items():
                    includes.setdefault(name, []).extend(found)
                lines = {n: list(enumerate(s.split("\n"), 1)) for n, s in candidate.sources.items()
                         if n.endswith(_SRC_EXT + _HEADER_EXT)}
                break
        _EXPANDED[key] = (lines, includes)
        while len(_EXPANDED) > _EXPANDED_KEEP:
            _EXPANDED.popitem(last=False)
        return lines, includes

    def _jailed(self, argv: list[str], build: Path, timeout_s: float) -> JailedRun:
        try:
            return compile_jail.run(argv, build, timeout_s, self.jail)
        except FileNotFoundError:
            raise TargetError(f"C compiler {argv[0]!r} not found on PATH (set CC to another compiler)") from None
        except OSError as e:
            raise TargetError(f"cannot start the compile jail ({e})") from None

    @staticmethod
    def _refused(candidate: Candidate) -> str | None:
        for flag in candidate.compile_flags:
            why = refused_flag(flag)
            if why:
                return why
        for name in candidate.sources:
            if not _NAME.fullmatch(name):
                return (f"source name {name!r} must be a plain file name: letters, digits, '_', '+', '-' and a "
                        "suffix (e.g. kernel.c)")
        return None

    def load(self, artifact: Path, candidate: Candidate, definition: Definition):
        """Inside the worker: a `ksearch.targets.cpu_runtime.CpuRunner` (the entry point through ctypes, on the
        controller's clock).

        Raises:
            TargetError: the library does not load or has no such entry point (reported as RUNTIME_ERROR).
        """
        from ksearch.targets.cpu_runtime import CpuRunner

        return CpuRunner(artifact, candidate.entry_point, definition)


#: the targets this module provides (`ksearch.targets.base.get_target`) and where they are listed
TARGETS = {"cpu": CpuTarget}
ORDER = 0

#: `CpuTarget.expand` results by content, most recent last
_EXPANDED: OrderedDict[str, tuple[dict, dict]] = OrderedDict()
_EXPANDED_KEEP = 256
_HEADER_EXT = (".h", ".hh", ".hpp", ".hxx", ".inc", ".inl")
#: the preprocessor's message for an include it cannot find (GCC, then Clang)
_NOT_FOUND = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+):\d+: fatal error: "
                        r"(?:(?P<gcc>[^\n]+): No such file or directory|'(?P<clang>[^'\n]+)' file not found)$",
                        re.MULTILINE)


def _write_sources(candidate: Candidate, tmp: str) -> Path:
    build = Path(tmp).resolve()
    for name, text in candidate.sources.items():
        (build / name).write_text(text)
    return build


def _missing_includes(log: str, own: set[str], build: str) -> dict[str, list[tuple[int, str]]]:
    """{candidate file: [(line, path)]} of the includes the preprocessor could not find, from its message."""
    out: dict[str, list[tuple[int, str]]] = {}
    for m in _NOT_FOUND.finditer(log):
        name = m.group("file")
        name = name[len(build) + 1:] if name.startswith(build + "/") else name
        if name in own:
            out.setdefault(name, []).append((int(m.group("line")), m.group("gcc") or m.group("clang")))
    return out


def _log(run: JailedRun) -> str:
    """The compiler's message as kept: a limit of the jail that stopped it named first, a cut said, and the
    layers of the jail the system refused said last."""
    parts = []
    limit = run.limit_hit()
    if limit:
        parts.append(f"the compile hit a limit of the compile jail: {limit}"
                     + (" (compiler timed out)" if run.timed_out else ""))
    parts.append(run.log.strip())
    if run.truncated:
        parts.append(f"[compiler output cut at {run.policy.log_bytes >> 10} KiB]")
    missing = unenforced(run.report)
    if missing:
        parts.append(missing)
    return "\n".join(p for p in parts if p)


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
