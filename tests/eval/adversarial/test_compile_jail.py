"""The compile jail, attacked: a candidate's sources and flags cannot make the compiler (or the static checks'
preprocessor run) read a file outside the toolchain, write one outside its build, or run without bounds; and
code run inside the jail finds no network, no home, no secrets. Each attack has a control where one can be
arranged: the same input with the jail's namespaces off leaks, so the test would fail without the defence."""

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ksearch.jail import compile_jail
from ksearch.jail.compile_jail import CompilePolicy
from ksearch.records import Candidate, Status
from ksearch.knowledge import load_pack
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

from .conftest import cand

SECRET = "sk-ksearch-" + secrets.token_hex(8)
DEFINITION = load_task("selective-scan").definition
NO_JAIL = CompilePolicy(namespaces="off")


@pytest.fixture(scope="module")
def jail_report():
    with tempfile.TemporaryDirectory() as d:
        return compile_jail.run(["true"], Path(d), 30).report


@pytest.fixture
def view(jail_report):
    """Skip (with the system's reason) where the jail's namespaces or new root are refused."""
    if not jail_report.get("namespaces") or not jail_report.get("view"):
        pytest.skip(f"the system refuses the compile jail's namespaces or new root: {jail_report.get('errors')}")
    return jail_report


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Secrets the compiler must not reach: a file in a directory outside the jail's view, and an API key in
    ``~/.config/ksearch/config.toml`` of a (fake) home. Their first line is what a compiler prints when it
    cannot parse it."""
    outside = tmp_path / "elsewhere" / "notes.txt"
    home = tmp_path / "home"
    config = home / ".config" / "ksearch" / "config.toml"
    for path in (outside, config):
        path.parent.mkdir(parents=True)
        path.write_text(f'api_key = "{SECRET}"\n')
    monkeypatch.setenv("HOME", str(home))
    return [outside, config]


def _climb(path: Path) -> str:
    """An include of ``path`` relative to the build directory, climbing to / first."""
    return "../" * 16 + str(path).lstrip("/")


def _including(path: str) -> Candidate:
    return Candidate(target="cpu", sources={"kernel.c": f'#include "{path}"\nvoid run(void) {{}}\n'})


@pytest.mark.parametrize("spelling", ["climb", "absolute"])
def test_an_include_of_a_secret_reads_nothing(view, planted, spelling):
    for path in planted:
        c = _including(_climb(path) if spelling == "climb" else str(path))
        built = CpuTarget().compile(c, DEFINITION, 30)
        assert not built.ok and "No such file or directory" in built.log, built.log
        assert SECRET not in built.log
        assert SECRET not in repr(CpuTarget().expand(c))
        leaked = CpuTarget(NO_JAIL).compile(c, DEFINITION, 30)  # control: the compiler prints the line it read
        assert SECRET in leaked.log


@pytest.mark.parametrize("static", [True, False], ids=["static-checks", "sandbox-only"])
def test_the_judge_keeps_the_secret_out_of_what_it_stores(judge, view, planted, static):
    """What reaches the store and the next prompt (the message, the compile log) holds no secret."""
    res = judge(static=static).evaluate(_including(_climb(planted[1])), ["tiny"], timing=False)
    assert res.status is (Status.REJECTED if static else Status.COMPILE_ERROR), res.message
    assert SECRET not in res.message + (res.compile_log or "")
    if static:
        assert "foreign-include" in res.message


@pytest.mark.parametrize("flags", [["-MD", "-MF", "{out}"], ["-MMD"], ["-Wp,-MD,{out}"], ["-Wp,-include,{secret}"],
                                   ["-x", "assembler-with-cpp"], ["@{argfile}"], ["-include", "{secret}"],
                                   ["-o{out}"], ["-fplugin={out}"], ["-save-temps"], ["-fdump-tree-all"]],
                         ids=lambda f: " ".join(f).replace("{", "").replace("}", ""))
def test_flags_that_read_or_write_files_are_refused(judge, planted, tmp_path, flags):
    out, argfile = tmp_path / "written", tmp_path / "args"
    argfile.write_text(f"-MD -MF {out}\n")
    flags = [f.format(out=out, secret=planted[0], argfile=argfile) for f in flags]
    c = Candidate(target="cpu", sources={"kernel.c": "void run(void) {}\n"}, compile_flags=flags)
    built = CpuTarget(NO_JAIL).compile(c, DEFINITION, 30)  # refused before any process, jail or not
    assert not built.ok and f"compile flag {flags[0]!r} is not allowed" in built.log and "allowed: -O0" in built.log
    res = judge(static=False).evaluate(c, ["tiny"], timing=False)
    assert res.status is Status.COMPILE_ERROR and "is not allowed" in res.message
    assert not out.exists() and SECRET not in res.message


def test_a_gigabyte_initialised_global_fails_fast_at_the_file_size_limit(judge):
    big = "char table_[1u << 30] = {1};\n"
    for policy in (CompilePolicy(), NO_JAIL):  # the limit holds with or without namespaces
        t0 = time.monotonic()
        built = CpuTarget(policy).compile(Candidate(target="cpu", sources={"kernel.c": big + "void run(void) {}\n"}),
                                          DEFINITION, 60)
        assert not built.ok and "hit a limit of the compile jail: file size (64 MiB per file)" in built.log
        assert time.monotonic() - t0 < 20
    res = judge(static=False).evaluate(cand(big + load_task("selective-scan").naive_sources["cpu"]), ["tiny"],
                                       timing=False)
    assert res.status is Status.COMPILE_ERROR and "file size" in res.message, res.message


#: 2^40 additions once expanded: the preprocessor streams without end, the compiler's parser never finishes
BOMB = "#define A0 (a + 1)\n" + "".join(f"#define A{i} A{i - 1} + A{i - 1}\n" for i in range(1, 41)) + \
       "int run(int a) { return A40; }\n"


def test_a_compile_that_never_ends_is_stopped_at_its_timeout():
    t0 = time.monotonic()
    built = CpuTarget().compile(Candidate(target="cpu", sources={"kernel.c": BOMB}), DEFINITION, 2)
    assert not built.ok and "hit a limit of the compile jail" in built.log, built.log
    assert time.monotonic() - t0 < 8
    t0 = time.monotonic()
    assert CpuTarget().expand(Candidate(target="cpu", sources={"kernel.c": BOMB}), timeout_s=2) is None
    assert time.monotonic() - t0 < 8


def test_compiler_output_is_bounded():
    """2^12 syntax errors print most of a megabyte; the log keeps 64 KiB and says it was cut."""
    flood = "#define B0 }\n" + "".join(f"#define B{i} B{i - 1} B{i - 1}\n" for i in range(1, 13)) + "B12\n"
    built = CpuTarget().compile(Candidate(target="cpu", sources={"kernel.c": flood}), DEFINITION, 30)
    assert not built.ok and "[compiler output cut at 64 KiB]" in built.log
    assert len(built.log.encode()) < (64 << 10) + 2048


#: run inside the jail (compiled there too): every probe prints name=1 when the jail held
PROBE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
static int absent(const char *p) { FILE *f = fopen(p, "r"); if (f) { fclose(f); return 0; } return 1; }
static int unwritable(const char *p) { FILE *f = fopen(p, "w"); if (f) { fclose(f); return 0; } return 1; }
int main(int argc, char **argv) {
    printf("socket=%d\n", socket(AF_INET, SOCK_STREAM, 0) < 0 && errno == EPERM);
    printf("unix_socket=%d\n", socket(AF_UNIX, SOCK_STREAM, 0) < 0);
    printf("ptrace=%d\n", ptrace(PTRACE_TRACEME, 0, 0, 0) < 0);
    printf("unshare=%d\n", unshare(CLONE_NEWUSER) < 0);
    printf("shadow=%d\n", absent("/etc/shadow"));
    printf("passwd=%d\n", absent("/etc/passwd"));
    char host_pid[64]; snprintf(host_pid, sizeof host_pid, "/proc/%s/status", argv[1]);
    printf("pid_namespace=%d\n", absent(host_pid));  /* the test's own process is out of sight */
    for (int i = 2; i < argc; i++) printf("secret%d=%d\n", i - 1, absent(argv[i]));
    if (getenv("PROBE_READS_ONLY")) return 0;  /* the control run outside the jail writes nothing */
    printf("write_usr=%d\n", unwritable("/usr/ksearch-escape"));
    printf("write_tmp=%d\n", unwritable("/tmp/ksearch-escape"));
    printf("write_build=%d\n", !unwritable("ok.txt"));
    signal(SIGXFSZ, SIG_IGN);
    char big[4096]; snprintf(big, sizeof big, "%s/big.bin", getenv("TMPDIR"));
    FILE *f = fopen(big, "wb"); static char mb[1 << 20]; size_t n = 0;
    while (f && n < 200 && fwrite(mb, 1, sizeof mb, f) == sizeof mb && fflush(f) == 0) n++;
    printf("file_size=%d\n", n > 0 && n < 200);
    return 0;
}
"""


def test_code_run_in_the_jail_finds_no_network_no_home_no_secret(view, planted, tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "probe.c").write_text(PROBE)
    secrets_ = " ".join(str(p) for p in planted)
    run = compile_jail.run(["sh", "-c", f"cc -O1 -o probe probe.c && ./probe {os.getpid()} {secrets_}"], build, 60)
    assert run.returncode == 0, run.log
    got = dict(line.split("=") for line in run.log.split() if "=" in line)
    assert len(got) == 11 + len(planted) and set(got.values()) == {"1"}, run.log
    assert not Path("/tmp/ksearch-escape").exists() and not Path("/usr/ksearch-escape").exists()
    if shutil.which("cc"):  # control: the same probe outside the jail sees the planted secrets
        subprocess.run(["cc", "-O1", "-o", "probe", "probe.c"], cwd=build, check=True)
        outside = subprocess.run(["./probe", str(os.getpid()), *map(str, planted)], cwd=build, capture_output=True,
                                 text=True, env={**os.environ, "PROBE_READS_ONLY": "1"})
        assert "secret1=0" in outside.stdout


def test_where_namespaces_are_refused_the_log_says_so_and_the_limits_hold():
    built = CpuTarget(NO_JAIL).compile(
        Candidate(target="cpu", sources={"kernel.c": "char t_[1u << 30] = {1};\nvoid run(void) {}\n"}), DEFINITION, 60)
    assert not built.ok and "file size" in built.log
    assert "compile jail: not enforced: namespaces (the compiler could read any file" in built.log


def test_honest_kernels_build_in_the_jail_and_pass(judge, view):
    task = load_task("selective-scan")
    pack = load_pack("selective-scan", "cpu")
    kernel = pack.render(task.definition, {"family": "row-sequential", "compile_flags": "fast-math"}, {})
    assert "-ffast-math" in kernel.compile_flags
    fast = Candidate(target="cpu", sources=dict(kernel.sources), entry_point=kernel.entry_point,
                     compile_flags=list(kernel.compile_flags))
    ev = judge()
    for c in (fast, ev.naive_candidate()):
        res = ev.evaluate(c, ["tiny", "odd"], timing=False)
        assert res.status is Status.PASSED, res.message
        assert "not enforced" not in (res.compile_log or "")


def test_the_toolchain_view_takes_a_compilers_own_installation_but_never_a_home(monkeypatch, tmp_path):
    home = tmp_path / "me"
    monkeypatch.setenv("HOME", str(home))
    assert str(tmp_path / "opt" / "gcc-14") in compile_jail.toolchain_view(str(tmp_path / "opt/gcc-14/bin/gcc"))
    view = compile_jail.toolchain_view(str(home / "bin" / "cc"))
    assert str(home / "bin") in view and str(home) not in view
    assert all(p.startswith(("/usr", "/lib", "/bin", "/sbin", "/etc/")) for p in compile_jail.toolchain_view("/usr/bin/cc"))
