"""The cpu target's compile policy: the flag allow-list, source names, and what its compile log says (the
jail itself is attacked in tests/eval/adversarial/test_compile_jail.py)."""

from pathlib import Path

import pytest
import yaml

from ksearch import knowledge
from ksearch.jail import compile_jail
from ksearch.jail.compile_jail import CompilePolicy, JailedRun
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets import cpu
from ksearch.targets.cpu import CpuTarget, refused_flag
from ksearch.tasks import load_task

#: flags a person or a model would pass to tune a kernel (all must stay allowed)
TUNING = ["-O2", "-Ofast", "-Os", "-funroll-loops", "-fno-unroll-loops", "-fno-math-errno", "-ffp-contract=fast",
          "-ffinite-math-only", "-fno-signed-zeros", "-fassociative-math", "-mavx2", "-mfma", "-mno-avx512f",
          "-msse4.2", "-march=native", "-march=x86-64-v3", "-mtune=native", "-mprefer-vector-width=512",
          "-fopenmp-simd", "-DBLOCK=64", "-DSCALE=1.5f", "-DN=(4*16)", "-UNDEBUG", "-std=c11", "-std=gnu++17",
          "-Wall", "-Wno-unused-variable", "-Werror=vla", "-w", "--param=max-unroll-times=8",
          "-fvect-cost-model=unlimited", "-ftree-vectorize", "-fno-tree-loop-distribute-patterns",
          "-falign-loops=32", "-fno-strict-aliasing", "-fno-semantic-interposition", "-g"]

#: flags that read, write, load or run something, or change the language (each must be refused)
HOSTILE = ["-MD", "-MMD", "-MF/tmp/x.d", "-MT", "-M", "-Wp,-MD,/tmp/x.d", "-Wp,-include,/etc/passwd",
           "-Wa,-o,/tmp/x", "-Wl,-rpath,/tmp", "-Xlinker", "-Xpreprocessor", "-x", "-xc", "assembler-with-cpp",
           "@/tmp/flags", "-include", "-include/etc/passwd", "-imacros/etc/passwd", "-iquote/", "-isystem/",
           "-I/", "-L/tmp", "-lcrypt", "-B/tmp", "-fplugin=/tmp/x.so", "-fplugin-arg-x-y=z", "-specs=/tmp/x",
           "-o/tmp/evil.so", "-o", "-save-temps", "-save-temps=cwd", "-fdump-tree-all", "-fdump-rtl-expand",
           "-fstack-usage", "-fcallgraph-info", "-fprofile-generate=/tmp", "-fprofile-use=/tmp/x",
           "-fauto-profile=/tmp/x", "-fopt-info-all=/tmp/x", "-fmodule-mapper=|true", "-fmodules-ts",
           "-fsanitize=address", "-finstrument-functions", "-pg", "--coverage", "-fdebug-prefix-map=/=/x",
           "-finput-charset=UTF-7", "-fexec-charset=EBCDIC-US", "-fdirectives-only", "-fpreprocessed",
           "-traditional-cpp", "-gsplit-dwarf", "-nostdlib", "-static", "-E", "-S", "-c", "-v", "-###",
           "--help", "-print-file-name=libc.so", "-wrapper", "--sysroot=/tmp", "-mllvm", "-Xclang", "-fuse-ld=lld",
           '-DX="/etc/passwd"', "-DX=</etc/passwd>", "-DX=a b", "-std=c11 -MD", "-O3\n-MD", "--param",
           "-flto=auto", "-fconstexpr-depth=100000000", "-ftemplate-depth=100000", ""]


def _pack_flags() -> set[str]:
    """Every compile flag of every choice of every cpu knowledge pack."""
    flags = set()
    packs = Path(knowledge.__file__).parent / "packs"
    tasks = [yaml.safe_load(f.read_text())["tasks"][0] for f in sorted(packs.glob("*/cpu/pack.yaml"))]
    assert len(tasks) >= 3, tasks
    for task in tasks:
        for decision in load_pack(task, "cpu").decisions:
            for choice in decision.choices:
                flags.update(choice.compile_flags)
    return flags


def test_every_flag_the_knowledge_packs_use_is_allowed():
    flags = _pack_flags()
    assert "-ffast-math" in flags  # what the packs' compile_flags decision adds today
    assert [f for f in flags if refused_flag(f)] == []


@pytest.mark.parametrize("flag", TUNING)
def test_tuning_flags_are_allowed(flag):
    assert refused_flag(flag) is None


@pytest.mark.parametrize("flag", HOSTILE)
def test_hostile_flags_are_refused_with_what_is_allowed(flag):
    why = refused_flag(flag)
    assert why is not None and repr(flag) in why and "allowed: -O0..-O3" in why


@pytest.mark.parametrize("name", ["-fplugin=x.c", "../kernel.c", "sub/kernel.c", ".hidden.c", "kernel", "tmp",
                                  "a b.c", "k\n.c"])
def test_source_names_that_are_not_plain_files_are_refused(name):
    cand = Candidate(target="cpu", sources={name: "void run(void) {}"})
    assert "must be a plain file name" in CpuTarget._refused(cand)


def test_a_refused_flag_starts_no_process(monkeypatch, tmp_path):
    """Refused before the compiler (or the jail's launcher) ever runs: neither can write the -MF file."""
    def no_run(*a, **k):
        raise AssertionError("a process was started for a refused flag")

    monkeypatch.setattr(compile_jail, "run", no_run)
    monkeypatch.setattr(cpu.subprocess, "run", no_run)
    dep = tmp_path / "x.d"
    cand = Candidate(target="cpu", sources={"kernel.c": "void run(void) {}"}, compile_flags=["-MD", "-MF", str(dep)])
    res = CpuTarget().compile(cand, load_task("selective-scan").definition)
    assert not res.ok and "'-MD' is not allowed" in res.log and not dep.exists()
    assert CpuTarget().expand(cand) is None


def _run(log: str = "", returncode: int = 1, timed_out: bool = False, report: dict | None = None,
         truncated: bool = False) -> JailedRun:
    full = {"namespaces": ["user", "mount"], "view": ["/usr"], "read_only_fs": True, "seccomp": ["socket"]}
    return JailedRun(returncode, log, timed_out, truncated, full if report is None else report, 0.1,
                     CompilePolicy(), 30.0)


def test_the_log_names_the_limit_that_stopped_the_compile():
    assert cpu._log(_run("as: can't write: 'File too large'")).startswith(
        "the compile hit a limit of the compile jail: file size (64 MiB per file)")
    assert "memory (4096 MiB of address space" in cpu._log(_run("virtual memory exhausted: Cannot allocate memory"))
    assert "CPU time (30 s per process)" in cpu._log(_run("", returncode=-24))
    assert "wall-clock time (30 s) (compiler timed out)" in cpu._log(_run("", returncode=-9, timed_out=True))
    assert cpu._log(_run("kernel.c:1: error: expected ';'")) == "kernel.c:1: error: expected ';'"
    assert cpu._log(_run("x", truncated=True)).endswith("[compiler output cut at 64 KiB]")


def test_the_log_says_what_the_system_did_not_enforce():
    line = cpu._log(_run("", returncode=0, report={"namespaces": [], "seccomp": ["socket"], "errors": ["EPERM"]}))
    assert line.startswith("compile jail: not enforced: namespaces (the compiler could read any file")
    assert "the reduced file view" in cpu._log(_run("", 0, report={"namespaces": ["mount"], "view": [],
                                                                    "seccomp": ["socket"]}))
    assert "seccomp" in cpu._log(_run("", 0, report={"namespaces": ["mount"], "view": ["/usr"],
                                                      "read_only_fs": True, "seccomp": []}))
    assert "no report" in cpu._log(_run("", 0, report={}))


def test_missing_includes_are_read_from_gcc_and_clang_messages(tmp_path):
    build = str(tmp_path)
    log = (f"In file included from {build}/kernel.c:2:\n"
           f"{build}/kernel.h:3:10: fatal error: ../../etc/shadow: No such file or directory\n"
           "kernel.c:7:10: fatal error: '/root/.ssh/id_rsa' file not found\n"
           "other.c:1:10: fatal error: x.h: No such file or directory\n")
    got = cpu._missing_includes(log, {"kernel.c", "kernel.h"}, build)
    assert got == {"kernel.h": [(3, "../../etc/shadow")], "kernel.c": [(7, "/root/.ssh/id_rsa")]}


def test_expand_results_are_kept_by_content(monkeypatch, tmp_path):
    """The static checks expand every evaluated candidate; the same content a second time runs nothing."""
    calls = []
    real = compile_jail.run

    def counting(argv, build: Path, *a, **k):
        calls.append(argv)
        return real(argv, build, *a, **k)

    monkeypatch.setattr(compile_jail, "run", counting)
    cand = Candidate(target="cpu", sources={"kernel.c": f"#define N {tmp_path.name.__hash__() & 0xffff}\n"
                                                        "int run(void) { return N; }\n"})
    first = CpuTarget().expand(cand)
    assert first is not None and len(calls) == 1
    assert CpuTarget().expand(cand.model_copy(update={"meta": {"again": 1}})) == first and len(calls) == 1
    assert CpuTarget().expand(cand.model_copy(update={"compile_flags": ["-O2"]})) is not None and len(calls) == 2
