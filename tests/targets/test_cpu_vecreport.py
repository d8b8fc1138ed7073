"""The cpu target's compiler report (targets/cpu_vecreport.py): GCC's -fopt-info-vec and Clang's loop-vectorize
remarks parsed from recorded output, the report of a real build, and that its flags change no code."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ksearch import config
from ksearch.records import Candidate
from ksearch.targets import cpu, cpu_vecreport
from ksearch.targets.cpu import BASE_FLAGS, CpuTarget, compiler_version
from ksearch.targets.cpu_vecreport import (CLANG_FLAGS, GCC_FLAGS, MAX_NOTES, NOTE_CHARS, dialect, parse_clang,
                                           parse_gcc)
from ksearch.tasks import load_task
from tests.eval.kernels import VECTOR_SPLIT

DATA = Path(__file__).parent / "data"
GCC = dialect(compiler_version(config.c_compiler())) == "gcc" if shutil.which(config.c_compiler()) else False


def test_gcc_report_recorded_gives_counts_sizes_and_reasons():
    """GCC 12.2 on an AVX-512 machine (-march=native), the kernel VECTOR_SPLIT: the skip-term loop vectorized (64-byte
    vectors, a 32-byte epilogue, versioned for aliasing), five loops not, each with its vectorizer's reason; the
    basic-block vectorizer's lines at the end are no loop's reasons (malloc, memset, free)."""
    metrics, notes = parse_gcc((DATA / "vecreport-gcc12.txt").read_text())
    assert metrics == {"loops_vectorized": 1, "loops_not_vectorized": 5, "loops_versioned": 1,
                       "blocks_slp_vectorized": 0, "max_vector_bytes": 64}
    assert notes[0] == "kernel.c:24:35: loop vectorized (64-byte vectors, 32-byte vectors, versioned for possible aliasing)"
    assert "kernel.c:25:35: loop not vectorized: call to expf() clobbers memory" in notes
    assert "kernel.c:13:35: loop not vectorized: control flow in loop" in notes
    assert "kernel.c:17:39: loop not vectorized: call to expf() clobbers memory" in notes
    assert not any("malloc" in n or "free" in n for n in notes)


def test_gcc_continuation_lines_and_build_directory():
    text = ("/tmp/ksearch-vec-1/kernel.c:6:27: missed: couldn't vectorize loop\n"
            "/tmp/ksearch-vec-1/kernel.c:6:49: missed: not vectorized: no vectype for stmt: _15 = *_14;\n"
            " scalar_type: float\n"
            "/tmp/ksearch-vec-1/kernel.c:7:13: optimized: basic block part vectorized using 64 byte vectors\n")
    metrics, notes = parse_gcc(text, "/tmp/ksearch-vec-1")
    assert metrics["loops_not_vectorized"] == 1 and metrics["blocks_slp_vectorized"] == 1
    assert notes == ["kernel.c:6:27: loop not vectorized: no vectype for stmt: _15 = *_14; scalar_type: float"]


def test_clang_remarks_recorded_attach_reasons_to_the_next_missed_loop():
    """Clang 14, same kernel: its analysis remark (the reason) comes before the loop's "loop not vectorized"."""
    metrics, notes = parse_clang((DATA / "vecreport-clang14.txt").read_text())
    assert metrics == {"loops_vectorized": 1, "loops_not_vectorized": 2, "max_vector_width": 16}
    assert notes == [
        "kernel.c:24:13: loop vectorized (width 16, interleaved 4)",
        "kernel.c:25:13: loop not vectorized: call instruction cannot be vectorized; instruction cannot be vectorized",
        "kernel.c:17:17: loop not vectorized: call instruction cannot be vectorized; instruction cannot be vectorized"]


def test_many_loops_fit_in_the_notes_with_the_common_reasons_last():
    lines = [f"k.c:{i}:1: optimized: loop vectorized using 32 byte vectors" for i in range(1, 6)]
    for i in range(10, 22):
        reason = "control flow in loop" if i % 3 else "complicated access pattern"
        lines += [f"k.c:{i}:1: missed: couldn't vectorize loop", f"k.c:{i}:5: missed: not vectorized: {reason}."]
    lines.append("k.c:30:1: missed: couldn't vectorize loop\nk.c:30:2: missed: not vectorized: " + "x" * 400)
    metrics, notes = parse_gcc("\n".join(lines))
    assert metrics["loops_vectorized"] == 5 and metrics["loops_not_vectorized"] == 13
    assert len(notes) == MAX_NOTES and all(len(n) <= NOTE_CHARS for n in notes)
    assert sum("loop not vectorized" in n for n in notes) == 5  # the failures get most of the room
    assert notes[-1].startswith("3 more loops vectorized; 8 more not vectorized, most common reasons: ")
    assert "control flow in loop (" in notes[-1]


@pytest.mark.parametrize("version, kind", [
    ("gcc (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc"), ("cc (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc"),
    ("c++ (GCC) 13.2.1 20231011", "gcc"), ("g++ (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", "gcc"),
    ("Debian clang version 14.0.6", "clang"), ("Apple clang version 15.0.0 (clang-1500.3.9.4)", "clang"),
    ("tcc version 0.9.27 (x86_64 Linux)", None)])
def test_dialect_from_the_version_line(version, kind):
    assert dialect(version) == kind


@pytest.mark.skipif(not GCC, reason="the system C compiler is not GCC")
def test_report_of_a_real_build_and_it_is_cached(tmp_path, monkeypatch):
    target, task = CpuTarget(), load_task("selective-scan")
    cand = Candidate(target="cpu", sources={"kernel.c": VECTOR_SPLIT})
    report = target.compile_report(cand, task.definition)
    assert report is not None and not report.error and report.workload is None
    assert report.tool.endswith("-fopt-info-vec-optimized-missed")
    assert report.metrics["loops_vectorized"] >= 1 and report.metrics["loops_not_vectorized"] >= 1
    assert any(n.startswith("kernel.c:24:") and "loop vectorized" in n for n in report.notes)
    assert any(n.startswith("kernel.c:25:") and "expf" in n for n in report.notes)
    monkeypatch.setattr(cpu_vecreport, "parse_gcc", lambda *a: pytest.fail("not cached"))
    assert target.compile_report(cand, task.definition) == report


@pytest.mark.skipif(not GCC, reason="the system C compiler is not GCC")
def test_the_report_flags_change_no_code(tmp_path):
    """The library built with GCC_FLAGS is byte-identical to the one built without (GCC 12.2: it is). Clang 14's
    remarks are not: they turn on source locations, which OpenMP's location strings then carry (";kernel.c;run;7;5;;"
    instead of ";unknown;unknown;0;0;;"): the data moves, the loops' instructions are the same. The judge never
    runs the report's library either way: it is a build of its own, discarded."""
    (tmp_path / "kernel.c").write_text(VECTOR_SPLIT)
    cc = config.c_compiler()
    for name, extra in (("plain.so", ()), ("report.so", GCC_FLAGS)):
        subprocess.run([cc, *BASE_FLAGS, *extra, "kernel.c", "-lm", "-o", name], cwd=tmp_path, check=True)
    assert (tmp_path / "plain.so").read_bytes() == (tmp_path / "report.so").read_bytes()
    assert (tmp_path / cpu_vecreport.GCC_REPORT).stat().st_size > 0


def test_no_report_for_a_refused_candidate_and_an_error_for_another_compiler(monkeypatch):
    target, task = CpuTarget(), load_task("selective-scan")
    assert target.compile_report(Candidate(target="cpu", sources={"kernel.c": "x"}, compile_flags=["-MD"]),
                                 task.definition) is None
    assert target.compile_report(Candidate(target="cpu", sources={"k.txt": "x"}), task.definition) is None
    monkeypatch.setattr(cpu, "compiler_version", lambda c: "tcc version 0.9.27 (x86_64 Linux)")
    report = target.compile_report(Candidate(target="cpu", sources={"kernel.c": VECTOR_SPLIT}), task.definition)
    assert report is not None and "GCC and Clang only" in report.error and not report.metrics


def test_a_build_that_fails_is_a_report_error():
    report = CpuTarget().compile_report(Candidate(target="cpu", sources={"kernel.c": "not C;"}),
                                        load_task("selective-scan").definition)
    assert report is not None and report.error.startswith("the report's build failed") and not report.metrics


def _clang_builds_openmp() -> bool:
    if not shutil.which("clang"):
        return False
    probe = subprocess.run(["clang", "-fopenmp", "-x", "c", "-", "-shared", "-fPIC", "-o", "/dev/null"],
                           input="void f(void) {}", capture_output=True, text=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _clang_builds_openmp(), reason="no clang with OpenMP here")
def test_report_of_a_real_clang_build(monkeypatch):
    monkeypatch.setenv("CC", "clang")
    assert all(f.startswith(("-Rpass", "-fno-caret")) for f in CLANG_FLAGS)  # remarks only
    report = CpuTarget().compile_report(Candidate(target="cpu", sources={"kernel.c": VECTOR_SPLIT}),
                                        load_task("selective-scan").definition)
    assert report is not None and not report.error and report.tool.endswith("-Rpass=loop-vectorize")
    assert report.metrics["loops_vectorized"] >= 1 and report.metrics["loops_not_vectorized"] >= 1
    assert any(n.startswith("kernel.c:24:") and "loop vectorized (width" in n for n in report.notes)
