"""A compiler run in a jail: what a candidate's sources and flags can make the compiler read, write or print.

The controller (`run`) starts ``python -S -P -E -c LAUNCHER '<policy JSON>' <fd> -- <exe> <argv...>`` in a new
session with a scrubbed environment (no site-packages, no PYTHON* variables: `LAUNCHER` imports only
`ksearch.jail.jail` and the standard library); the launcher (`jail.launch`) enters `jail.enter` with the
compile's policy, writes the report to ``<fd>`` and execs the compiler, which runs inside:

- new user, mount, network, PID and IPC namespaces (as the worker's, where the system allows them);
- a new root holding only the toolchain and the system headers (`sandbox.SYSTEM_PATHS`, the files of /etc a
  toolchain reads, the compiler's own installation), ``/dev/null``, a fresh /proc and the build directory
  (read-write), with a size-limited tmpfs as HOME and TMPDIR: no home, no ``$KSEARCH_HOME``, no other
  checkout, nothing of /dev/shm or /tmp but the build;
- no capabilities, no new privileges, and seccomp's ``compile`` profile (`jail._seccomp_program`: fork and
  exec allowed, sockets, ptrace, mounts, namespaces and the rest refused);
- resource limits: CPU time of each process (the compile's timeout), address space, file size (one file: a
  1 GiB initialised global fails fast), processes; the wall-clock timeout kills the session.

What the compiler prints is kept up to `CompilePolicy.log_bytes` (the rest is read and dropped). Where the
namespaces are refused, the limits and seccomp still hold and the run says what was not enforced (`unenforced`).
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from ksearch import config
from ksearch.jail.sandbox import LOADER_ETC, SYSTEM_PATHS

#: what of /etc a toolchain reads besides the loader's files (Debian's alternatives: cc -> gcc-12; clang's
#: configuration files)
TOOLCHAIN_ETC = ("/etc/alternatives", "/etc/clang")
#: the launcher's code (``python -S -P -E -c``: no site-packages, no PYTHON* variables, no current directory on
#: the module path; only ksearch's own root is added, and only `jail` and the standard library are imported)
LAUNCHER = ("import sys; sys.path.insert(0, %r); from ksearch.jail.jail import launch; sys.exit(launch(sys.argv[1:]))"
            % str(Path(__file__).resolve().parents[2]))
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "LC_MESSAGES", "SOURCE_DATE_EPOCH")
#: words in a compiler's message that mean a limit of the jail stopped it, and which limit
_LIMIT_WORDS = (
    (("File size limit exceeded", "File too large", "SIGXFSZ"), "file size"),
    (("No space left on device",), "build space"),
    (("CPU time limit exceeded", "SIGXCPU"), "CPU time"),
    (("out of memory", "virtual memory exhausted", "Cannot allocate memory", "std::bad_alloc"), "memory"),
)


class CompilePolicy(BaseModel):
    """What the compile jail enforces (sizes in bytes).

    ``namespaces`` as `sandbox.Policy`'s; ``address_space_bytes``: per process (cc1, as, ld);
    ``file_size_bytes``: the largest file any of them may write (objects, the library, the preprocessed
    source); ``tmp_bytes``: the tmpfs holding HOME and TMPDIR (the driver's intermediate files);
    ``log_bytes``: the compiler output kept; ``seccomp``: off only in tests.
    """

    namespaces: Literal["auto", "no-user", "off"] = "auto"
    address_space_bytes: int = Field(default=4 << 30, gt=0)
    file_size_bytes: int = Field(default=64 << 20, gt=0)
    tmp_bytes: int = Field(default=256 << 20, gt=0)
    log_bytes: int = Field(default=64 << 10, gt=0)
    nproc: int = Field(default=64, gt=0)
    seccomp: bool = True


@dataclass
class JailedRun:
    """How one jailed compiler run ended: ``returncode`` (negative: killed by that signal), ``log`` (its
    stdout and stderr, at most ``policy.log_bytes``; ``truncated`` when more was printed), ``timed_out``
    (killed at the wall-clock timeout ``timeout_s``), ``report`` (what the jail enforced: `jail.enter`'s
    report; empty when the launcher died before saying), ``seconds`` (wall time)."""

    returncode: int
    log: str
    timed_out: bool
    truncated: bool
    report: dict
    seconds: float
    policy: CompilePolicy
    timeout_s: float

    def limit_hit(self) -> str | None:
        """The limit of the jail that stopped the compiler, in words with its value, or None."""
        p = self.policy
        if self.timed_out:
            return f"wall-clock time ({self.timeout_s:g} s)"
        values = {"file size": f"{p.file_size_bytes >> 20} MiB per file", "build space": f"{p.tmp_bytes >> 20} MiB",
                  "CPU time": f"{math.ceil(self.timeout_s)} s per process",
                  "memory": f"{p.address_space_bytes >> 20} MiB of address space per process"}
        by_signal = {-signal.SIGXFSZ: "file size", -signal.SIGXCPU: "CPU time"}
        for words, name in _LIMIT_WORDS:
            if any(w in self.log for w in words) or by_signal.get(self.returncode) == name:
                return f"{name} ({values[name]})"
        return None


def unenforced(report: dict) -> str | None:
    """One line saying which layers of the compile jail the system refused, or None when all held."""
    missing = []
    if not report:
        return "compile jail: the launcher gave no report; nothing of the jail is known to hold"
    if not report.get("namespaces"):
        missing.append("namespaces (the compiler could read any file this user can, and write where it can)")
    elif not report.get("view"):
        missing.append("the reduced file view (the host's file system stayed visible, read-only)")
    elif not report.get("read_only_fs"):
        missing.append("a read-only file system")
    if not report.get("seccomp"):
        missing.append("seccomp")
    if not missing:
        return None
    return "compile jail: not enforced: " + "; ".join(missing)


def toolchain_view(compiler: str) -> list[str]:
    """Host paths a compile may read: the system's programs, libraries and headers, the files of /etc a
    toolchain reads, the compiler's own installation when it lies elsewhere (the directory above its
    ``bin``, or its ``bin`` alone when that is a home directory or ``/``), and ``compiler`` itself."""
    paths = [*SYSTEM_PATHS, *LOADER_ETC, *TOOLCHAIN_ETC]
    exe = Path(os.path.realpath(compiler))
    prefix = exe.parent.parent if exe.parent.name == "bin" else exe.parent
    homes = [Path(h) for h in config.user_homes()]
    if str(prefix) == "/" or any(prefix == h or h.is_relative_to(prefix) for h in homes):
        prefix = exe.parent
    if not any(prefix.is_relative_to(p) for p in SYSTEM_PATHS):
        paths.append(str(prefix))
    return [*paths, compiler]  # the path as run: its symbolic links are recreated in the view


def _env(tmp: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
    env.update(HOME=str(tmp), TMPDIR=str(tmp))
    return env


def policy_argument(policy: CompilePolicy, build: Path, exe: str, timeout_s: float) -> str:
    """The JSON the launcher's `jail.enter` reads (see its docstring and `jail._reduced_view`)."""
    return json.dumps({
        "namespaces": policy.namespaces, "view": "reduced", "readable": toolchain_view(exe),
        "writable": [str(build)], "home": str(build / "tmp"), "home_bytes": policy.tmp_bytes,
        "stage": str(build / ".root"), "cwd": str(build), "dev": ["/dev/null"],
        "hide": config.user_homes(), "keep": [],
        "address_space_bytes": policy.address_space_bytes, "file_size_bytes": policy.file_size_bytes,
        "cpu_s": max(1, math.ceil(timeout_s)), "nproc": policy.nproc, "pid_max": 301,
        "seccomp": policy.seccomp, "seccomp_profile": "compile",
    })


def run(argv: list[str], build: Path, timeout_s: float, policy: CompilePolicy | None = None) -> JailedRun:
    """Run ``argv`` (``argv[0]`` found on PATH, as a shell would) in the compile jail, in ``build`` (a
    directory the caller owns; ``build/tmp`` and ``build/.root`` are made here).

    Raises:
        FileNotFoundError: ``argv[0]`` is not on PATH.
        OSError: the launcher cannot be started.
    """
    policy = policy or CompilePolicy()
    exe = shutil.which(argv[0])
    if exe is None:
        raise FileNotFoundError(f"{argv[0]!r} not found on PATH")
    build = build.resolve()
    (build / "tmp").mkdir(exist_ok=True)
    (build / ".root").mkdir(exist_ok=True)
    report_r, report_w = os.pipe()
    t0 = time.perf_counter()
    cmd = [sys.executable, "-S", "-P", "-E", "-c", LAUNCHER,
           policy_argument(policy, build, exe, timeout_s), str(report_w), "--", exe, *argv]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd="/", env=_env(build / "tmp"), pass_fds=(report_w,), start_new_session=True)
    finally:
        os.close(report_w)
    try:
        log, truncated, timed_out = _read_bounded(proc, policy.log_bytes, t0 + timeout_s)
        report = _read_report(report_r)
    finally:
        os.close(report_r)
    return JailedRun(proc.returncode, log.decode(errors="replace"), timed_out, truncated, report,
                     time.perf_counter() - t0, policy, timeout_s)


def _read_bounded(proc: subprocess.Popen, limit: int, deadline: float) -> tuple[bytes, bool, bool]:
    """Read ``proc``'s output until it ends or the deadline passes (then kill its session); keep ``limit``
    bytes. Returns (kept output, truncated, timed out)."""
    kept, truncated, timed_out = bytearray(), False, False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not sel.select(timeout=left):
                timed_out = True
                break
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            room = limit - len(kept)
            if len(chunk) > room:
                truncated = True
            kept += chunk[:max(room, 0)]
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.stdout.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return bytes(kept), truncated, timed_out


def _read_report(fd: int) -> dict:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:  # a process of the session still holds the pipe: no more is coming
        pass
    try:
        report = json.loads(data.decode() or "{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}
