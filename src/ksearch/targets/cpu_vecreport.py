"""The cpu target's compiler report: what the vectorizer did with each loop of a candidate, for the prompts.

GCC writes it with ``-fopt-info-vec-optimized-missed=<file>`` (`GCC_FLAGS`), Clang on stderr with the
``-Rpass*=loop-vectorize`` remarks (`CLANG_FLAGS`). The report comes from a build of its own, whose library is
discarded (`build_report`), so the flags cannot touch what the judge runs; they do not change the code either:
with GCC 12.2 and 13.3 the library built with and without them is byte-identical
(tests/targets/test_cpu_vecreport.py); with Clang 14 the instructions are the same but the remarks turn on source
locations, which OpenMP's location strings then carry (";kernel.c;run;7;5;;" for ";unknown;unknown;0;0;;"), so
the data and the addresses of those strings move. `parse_gcc` and `parse_clang` turn either into the metrics and notes of a `Profile`:

- metrics: ``loops_vectorized`` and ``loops_not_vectorized`` (distinct source locations; a loop GCC vectorized
  twice, main body and epilogue, counts once), ``max_vector_bytes`` (GCC) or ``max_vector_width`` (Clang: lanes),
  ``loops_versioned`` (GCC: a run-time alias or alignment check guards the vector loop) and
  ``blocks_slp_vectorized`` (GCC: straight-line code vectorized);
- notes: at most `MAX_NOTES` lines of at most `NOTE_CHARS` characters, the loops vectorized (with their vector
  size) and not (with the vectorizer's first reasons), then the most common reasons over the loops not listed.

Source locations are the candidate's own (``kernel.c:41:5``); its text appears in them (GIMPLE statements in
GCC's reasons): a prompt fences the notes as untrusted.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections import Counter
from typing import TYPE_CHECKING

from ksearch import config
from ksearch.errors import TargetError
from ksearch.records import Candidate, Profile

if TYPE_CHECKING:
    from ksearch.targets.cpu import CpuTarget

#: GCC: the vectorizer's successes and failures into a file in the build directory
GCC_REPORT = "vec-report.txt"
GCC_FLAGS = (f"-fopt-info-vec-optimized-missed={GCC_REPORT}",)
#: Clang: the loop vectorizer's remarks, on stderr (the compile log)
CLANG_FLAGS = ("-Rpass=loop-vectorize", "-Rpass-missed=loop-vectorize", "-Rpass-analysis=loop-vectorize",
               "-fno-caret-diagnostics")
#: notes kept, and the characters of each
MAX_NOTES = 8
NOTE_CHARS = 160
#: the most a report is read (a kernel of many loops and templates writes megabytes)
READ_BYTES = 1 << 20

_GCC_LINE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+:\d+): (?P<kind>optimized|missed|note): (?P<msg>.*)$")
_CLANG_LINE = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+:\d+): remark: (?P<msg>.*?) "
                         r"\[-Rpass(?P<kind>|-missed|-analysis)=loop-vectorize\]$")


def dialect(version: str) -> str | None:
    """``gcc`` or ``clang`` from a compiler's ``--version`` line (`ksearch.targets.cpu.compiler_version`), None
    for another compiler (no report)."""
    low = version.lower()
    if "clang" in low:
        return "clang"
    if "gcc" in low or "g++" in low or "free software foundation" in low or re.match(r"^(cc|c\+\+) \(", low):
        return "gcc"
    return None


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS - 3] + "..."


def _loc(loc: str, build: str) -> str:
    return loc[len(build) + 1:] if build and loc.startswith(build + "/") else loc


def _reason(msg: str) -> str:
    """A missed line's reason without the vectorizer's prefix (``not vectorized: ``) and its trailing dot."""
    for prefix in ("not vectorized: ", "loop not vectorized: "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    msg = msg.rstrip(".; ")
    # GCC names a call by its GIMPLE statement ("_26 = expf (_24)"): the function is what matters
    return re.sub(r"^statement clobbers memory: (?:[\w.]+ = )?([\w.]+) \(.*$", r"call to \1() clobbers memory", msg)


def _notes(vectorized: dict[str, list[str]], missed: dict[str, list[str]]) -> list[str]:
    """A line per loop vectorized (its vector sizes) and not (its reasons); when they do not all fit, loops not
    vectorized take at least two thirds of the lines and the last says what was left out, with the most common
    reasons of the loops not vectorized that it leaves out."""
    vec, miss = list(vectorized.items()), list(missed.items())
    if len(vec) + len(miss) <= MAX_NOTES:
        n_vec, n_miss = len(vec), len(miss)
    else:
        slots = MAX_NOTES - 1
        n_vec = min(len(vec), max(slots // 3, slots - len(miss)))
        n_miss = min(len(miss), slots - n_vec)
        n_vec = min(len(vec), slots - n_miss)
    notes = [_cut(f"{loc}: loop vectorized ({', '.join(dict.fromkeys(sizes))})") for loc, sizes in vec[:n_vec]]
    notes += [_cut(f"{loc}: loop not vectorized: {'; '.join(dict.fromkeys(reasons)) or 'no reason given'}")
              for loc, reasons in miss[:n_miss]]
    rest = miss[n_miss:]
    parts = [f"{len(vec) - n_vec} more loops vectorized"] if len(vec) > n_vec else []
    if rest:
        common = Counter(r for _, reasons in rest for r in dict.fromkeys(reasons))
        top = ", ".join(f"{r} ({n})" for r, n in common.most_common(3)) or "no reason given"
        parts.append(f"{len(rest)} more not vectorized, most common reasons: {top}")
    if parts:
        notes.append(_cut("; ".join(parts)))
    return notes


def parse_gcc(text: str, build: str = "") -> tuple[dict[str, float], list[str]]:
    """Metrics and notes (see the module docstring) of GCC's ``-fopt-info-vec-optimized-missed`` output; ``build``:
    the build directory, cut from the locations. A loop's reason is the ``missed`` line right after its
    ``couldn't vectorize loop`` line (the missed lines that follow a function's loops are the basic-block
    vectorizer's, about single statements anywhere in the function: neither counted nor noted)."""
    entries: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        m = _GCC_LINE.match(line)
        if m:
            entries.append((_loc(m["loc"], build), m["kind"], m["msg"].strip()))
        elif line.startswith((" ", "\t")) and entries and line.strip():  # a continuation (" scalar_type: float")
            loc, kind, msg = entries[-1]
            entries[-1] = (loc, kind, f"{msg} {line.strip()}")
    vectorized: dict[str, list[str]] = {}
    missed: dict[str, list[str]] = {}
    versioned: set[str] = set()
    slp = widest = 0
    current: str | None = None
    for loc, kind, msg in entries:
        if kind == "optimized":
            current = None
            size = re.match(r"loop vectorized using (\d+) byte vectors", msg)
            if size:
                vectorized.setdefault(loc, []).append(f"{size[1]}-byte vectors")
                widest = max(widest, int(size[1]))
            elif msg.startswith("loop vectorized"):
                vectorized.setdefault(loc, []).append(msg[len("loop vectorized"):].strip() or "vectorized")
            elif "loop versioned for vectorization" in msg:
                versioned.add(loc)
                why = msg.split("because of", 1)[1].strip() if "because of" in msg else "run-time checks"
                vectorized.setdefault(loc, []).append(f"versioned for {why}")
            elif "basic block" in msg and "vectorized" in msg:
                slp += 1
        elif kind == "missed":
            if msg.startswith("couldn't vectorize loop"):
                current = loc
                missed.setdefault(loc, [])
            elif current is not None:  # the loop vectorizer's reason: the line after; later missed lines are
                missed[current].append(_reason(msg))  # the basic-block vectorizer's, about single statements
                current = None
    missed = {loc: reasons for loc, reasons in missed.items() if loc not in vectorized}
    for loc, sizes in vectorized.items():  # "versioned" alone (no size line) still is a vectorized loop
        vectorized[loc] = sorted(sizes, key=lambda s: not s.endswith("vectors"))
    metrics: dict[str, float] = {"loops_vectorized": len(vectorized), "loops_not_vectorized": len(missed),
                                 "loops_versioned": len(versioned), "blocks_slp_vectorized": slp}
    if widest:
        metrics["max_vector_bytes"] = widest
    return metrics, _notes(vectorized, missed)


def parse_clang(log: str, build: str = "") -> tuple[dict[str, float], list[str]]:
    """Metrics and notes of Clang's loop-vectorize remarks in a compile log (other lines are skipped). An
    analysis remark (the reason) comes before its loop's ``loop not vectorized`` remark: reasons wait for the next
    missed loop."""
    vectorized: dict[str, list[str]] = {}
    missed: dict[str, list[str]] = {}
    pending: list[str] = []
    widest = 0
    for line in log.splitlines():
        m = _CLANG_LINE.match(line.strip())
        if not m:
            continue
        loc, kind, msg = _loc(m["loc"], build), m["kind"], m["msg"].strip()
        if kind == "":
            width = re.search(r"vectorization width: (\d+)", msg)
            inter = re.search(r"interleaved count: (\d+)", msg)
            if width:
                widest = max(widest, int(width[1]))
            vectorized.setdefault(loc, []).append(
                f"width {width[1] if width else '?'}" + (f", interleaved {inter[1]}" if inter else ""))
        elif kind == "-analysis":
            pending.append(_reason(msg))
        elif msg.startswith("loop not vectorized"):
            reason = _reason(msg) if ":" in msg else ""
            missed.setdefault(loc, []).extend([*pending, *([reason] if reason else [])])
            pending = []
        else:
            pending.append(_reason(msg))
    missed = {loc: reasons for loc, reasons in missed.items() if loc not in vectorized}
    metrics: dict[str, float] = {"loops_vectorized": len(vectorized), "loops_not_vectorized": len(missed)}
    if widest:
        metrics["max_vector_width"] = widest
    return metrics, _notes(vectorized, missed)


def build_report(target: CpuTarget, candidate: Candidate, timeout_s: float = 120.0) -> Profile | None:
    """The vectorizer's report on ``candidate``: a build like `CpuTarget.compile`'s (the same compiler, flags and
    compile jail) plus `GCC_FLAGS` or `CLANG_FLAGS`, its library discarded; cached beside the build
    (``<key>.vec.json``). None for a candidate `compile` refuses before any process starts (no source, a refused
    flag or name); a Profile with ``error`` when no report can be had (another compiler, a failed build)."""
    from ksearch.targets.cpu import _SRC_EXT, _log, _write_sources

    srcs = {n: s for n, s in candidate.sources.items() if n.endswith(_SRC_EXT)}
    if not srcs or target._refused(candidate):
        return None
    try:
        compiler, version, flags, key = target._build_key(candidate, srcs)
    except TargetError as e:
        return Profile(tool="compiler", error=str(e))
    kind = dialect(version)
    extra = {"gcc": GCC_FLAGS, "clang": CLANG_FLAGS}.get(kind or "", ())
    tool = f"{version} {'-Rpass=loop-vectorize' if kind == 'clang' else extra[0].split('=')[0]}" if extra else version
    if kind is None:
        return Profile(tool=tool, error=f"no vectorization report from {version!r} (GCC and Clang only)")
    cached = config.home_dir() / "cache" / "cpu" / f"{key}.vec.json"
    if cached.is_file():
        return Profile.model_validate_json(cached.read_text())
    with tempfile.TemporaryDirectory(prefix="ksearch-vec-") as tmp:
        build = _write_sources(candidate, tmp)
        try:
            run = target._jailed([compiler, *flags, *extra, *sorted(srcs), "-lm", "-o", "out.so"], build, timeout_s)
        except TargetError as e:
            return Profile(tool=tool, error=str(e))
        if run.returncode != 0 or run.timed_out:
            return Profile(tool=tool, error=f"the report's build failed: {_log(run)[:300]}")
        if kind == "gcc":
            report = build / GCC_REPORT
            text = report.read_bytes()[:READ_BYTES].decode(errors="replace") if report.is_file() else ""
            metrics, notes = parse_gcc(text, str(build))
        else:
            metrics, notes = parse_clang(run.log, str(build))
    profile = Profile(tool=tool, metrics=metrics, notes=notes)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
    partial.write_text(profile.model_dump_json())
    partial.replace(cached)
    return profile
