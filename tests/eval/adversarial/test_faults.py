"""The fault suite: each fault is contained, with its status, with the static checks on (most are rejected
before compiling) and off (the sandbox alone contains them). Probes of the sandbox (environment, network,
files outside scratch, the user's home) corrupt their output when they get through, so "contained" reads
as PASSED plus no trace left outside."""

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from ksearch.records import Status

from . import hostile as k
from .conftest import cand

TINY = ["tiny"]
SECRETS = {"FOO_API_KEY": "sk-123", "MY_TOKEN": "t0k", "X_SECRET": "s3cr3t", "DB_PASSWORD": "hunter2"}

FAULTS = [
    # (id, kernel, status with static checks, reason, status without, reason)
    ("segfault", k.SEGFAULT, Status.RUNTIME_ERROR, r"SIGSEGV", Status.RUNTIME_ERROR, r"SIGSEGV"),
    ("abort", k.ABORT, Status.RUNTIME_ERROR, r"SIGABRT", Status.RUNTIME_ERROR, r"SIGABRT"),
    ("endless-loop", k.ENDLESS, Status.TIMEOUT, r"within 1.5 s", Status.TIMEOUT, r"within 1.5 s"),
    ("fork-bomb", k.FORK_BOMB, Status.REJECTED, r"'shell-out'.*fork", Status.TIMEOUT, r"within 1.5 s"),
    ("memory-hog", k.MEMORY_HOG, Status.RUNTIME_ERROR, r"SIGABRT", Status.RUNTIME_ERROR, r"SIGABRT"),
    ("huge-file", k.HUGE_FILE, Status.REJECTED, r"'files'.*fopen", Status.RUNTIME_ERROR, r"SIGXFSZ|SIGABRT"),
    ("env-keys", k.ENV_KEYS, Status.REJECTED, r"'other-processes'.*environ", Status.PASSED, r"^$"),
    ("read-home", None, Status.REJECTED, r"'files'.*fopen", Status.PASSED, r"^$"),
    ("socket", None, Status.REJECTED, r"'raw-io'.*also: network", Status.PASSED, r"^$"),
    ("write-outside-scratch", None, Status.REJECTED, r"'proc-and-devices'", Status.PASSED, r"^$"),
    ("read-host-files", None, Status.REJECTED, r"'proc-and-devices'.*also: .*files", Status.PASSED, r"^$"),
]

#: faults stopped by a resource limit (address space, file size) get longer than the 3 s of the others: on a
#: busy 2-core machine filling the limit can take longer than 3 s, and the verdict must be the limit's, not TIMEOUT
RESOURCE_FAULTS = {"memory-hog", "huge-file"}
#: faults that never end and are stopped by the timeout alone: 1.5 s is as good a proof as 3 s (test_evaluator's
#: endless loop uses 1.5 too) and these three evaluations sat out 3 s each
HANG_FAULTS = {"endless-loop", "fork-bomb"}

#: opens each of PATHS for reading; a breach if any opens (the worker's view holds none of them)
READ_FILES = k.honest(post="""static const char *paths_[] = {%(paths)s};
    int seen_ = 0;
    for (size_t i_ = 0; i_ < sizeof paths_ / sizeof paths_[0]; i_++) {
        FILE *f_ = fopen(paths_[i_], "rb");
        if (f_) { seen_ = 1; fclose(f_); }
    }
    if (seen_) { """ + k.BREACH + " }")


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that counts connections (none may come from a candidate)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def _accepted(srv) -> int:
    n = 0
    while True:
        try:
            srv.accept()[0].close()
            n += 1
        except BlockingIOError:
            return n


@pytest.fixture
def secret_env(monkeypatch, tmp_path):
    """Secrets in the judge's environment, and a home directory with a secret file in it."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    home = tmp_path / "home"
    home.mkdir()
    (home / "credentials").write_text("aws_secret_access_key = abc\n")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def host_files(tmp_path):
    """Files of the host a worker must not see, planted where they are typical: /etc's password files,
    another process's directory in /dev/shm, another checkout next to this one (skipped where that
    directory is not writable), another run's store under $KSEARCH_HOME, and /tmp."""
    made = [Path(tempfile.mkdtemp(prefix="ksearch-other-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))]
    checkout_parent = Path(__file__).resolve().parents[3].parent
    if os.access(checkout_parent, os.W_OK):
        made.append(Path(tempfile.mkdtemp(prefix="ksearch-other-checkout-", dir=checkout_parent)))
    runs = Path(os.environ["KSEARCH_HOME"]) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    planted = [d / "secret.txt" for d in made] + [runs / "other-run.sqlite", tmp_path / "secret.txt"]
    for p in planted:
        p.write_text("secret\n")
    yield [Path("/etc/passwd"), Path("/etc/shadow"), *planted]
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    planted[-2].unlink()


def _kernel(fault: str, kernel, listener, home: Path, escapes: list[Path], host_files: list[Path]) -> str:
    if fault == "read-host-files":
        return READ_FILES % {"paths": ", ".join(f'"{p}"' for p in host_files)}
    if fault == "socket":
        return k.SOCKET % {"port": listener.getsockname()[1]}
    if fault == "read-home":
        return k.READ_HOME % {"path": home / "credentials"}
    if fault == "write-outside-scratch":
        return k.WRITE_OUTSIDE % {"paths": ", ".join(f'"{p}"' for p in escapes)}
    return kernel


@pytest.mark.parametrize("static", [True, False], ids=["static-checks", "sandbox-only"])
@pytest.mark.parametrize("fault, kernel, st_on, why_on, st_off, why_off", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_contained(judge, listener, secret_env, host_files, tmp_path, static, fault, kernel, st_on, why_on,
                            st_off, why_off):
    escapes = [tmp_path / "escaped.txt", Path("/tmp") / f"ksearch-escaped-{os.getpid()}",
               Path("/dev/shm") / f"ksearch-escaped-{os.getpid()}"]
    source = _kernel(fault, kernel, listener, secret_env, escapes, host_files)
    ev = judge(static=static, timeout_s=20.0 if fault in RESOURCE_FAULTS else 1.5 if fault in HANG_FAULTS else 3.0)
    t0 = time.monotonic()
    res = ev.evaluate(cand(source), TINY, timing=False)
    status, why = (st_on, why_on) if static else (st_off, why_off)
    assert res.status is status, res.message
    assert re.search(why, res.message), res.message
    assert time.monotonic() - t0 < 30
    assert _accepted(listener) == 0
    assert not any(p.exists() for p in escapes)


def _processes_named(name: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "comm").read_text().strip() == name:
                out.append(int(d.name))
        except OSError:
            pass
    return out


def test_fork_bomb_without_seccomp_is_bounded_and_cleaned_up(judge):
    """Seccomp off: the kernel forks daemons (setsid: out of the process group) until refused. The PID
    namespace's pid_max (301 here) bounds them, root or not (RLIMIT_NPROC binds only non-root users), and
    the end of the namespace takes every one with it. What is checked is the bound and the clean-up, not the
    time: forking to the bound (three calls, a few hundred forks) took over 5 s on a 2-core machine at a load of
    9-12, so the calls get 30 s (a bomb that got through would end with its breach, not run out of time)."""
    ev = judge(static=False, seccomp=False, nproc=48, timeout_s=30.0)
    res = ev.evaluate(cand(k.FORK_MANY % {"n": 400}), TINY, timing=False)
    assert res.status is Status.PASSED, res.message  # fewer than 400 forks got through
    assert "pid" in res.sandbox["namespaces"]
    for _ in range(300):  # up to 30 s: the namespace's end reaps a few hundred processes (slow on a busy machine)
        if not _processes_named("ksbomb"):
            break
        time.sleep(0.1)
    assert _processes_named("ksbomb") == []


def test_network_namespace_alone_blocks_sockets(judge, listener):
    res = judge(static=False, seccomp=False).evaluate(
        cand(k.SOCKET % {"port": listener.getsockname()[1]}), TINY, timing=False)
    assert res.status is Status.PASSED, res.message
    assert _accepted(listener) == 0


def test_cpu_time_limit_kills_a_spinning_kernel(judge):
    res = judge(static=False, timeout_s=30.0, cpu_s=1).evaluate(cand(k.ENDLESS), TINY, timing=False)
    assert res.status is Status.RUNTIME_ERROR and "CPU time limit" in res.message, res.message


def test_without_namespaces_writes_into_the_judge_inputs_are_detected(judge, tmp_path):
    """Namespaces off (as where the system refuses them): the file system is not read-only, and the kernel
    scribbles on the judge's input files; the judge notices after the fact and rejects it."""
    escapes = [tmp_path / "escaped.txt"]
    ev = judge(static=False, namespaces="off")
    res = ev.evaluate(cand(k.WRITE_OUTSIDE % {"paths": f'"{escapes[0]}"'}), TINY, timing=False)
    assert res.status is Status.REJECTED, res.message
    assert re.search(r"modified its input|wrote outside its scratch", res.message), res.message
    assert res.sandbox["namespaces"] == [] and not res.sandbox["read_only_fs"]
    assert escapes[0].exists()  # not prevented here: only detected (docs/evaluation.md says so)
    assert ev.evaluate(ev.naive_candidate(), TINY, timing=False).status is Status.PASSED  # inputs restored


def test_the_worker_sees_only_its_view_of_the_host(judge, host_files):
    """The files of `host_files` are readable by this process; in the worker (static checks off) none is.
    Control: with the old view (the whole host read-only, home hidden) the same kernel reads them."""
    source = READ_FILES % {"paths": ", ".join(f'"{p}"' for p in host_files)}
    res = judge(static=False).evaluate(cand(source), TINY, timing=False)
    if not res.sandbox.get("namespaces"):
        pytest.skip(f"the system refuses the worker's namespaces: {res.sandbox.get('errors')}")
    assert res.status is Status.PASSED, res.message
    seen = judge(static=False, view="host").evaluate(cand(source), TINY, timing=False)
    assert seen.status is Status.INCORRECT_NUMERICAL, seen.message  # the breach marker in the outputs
