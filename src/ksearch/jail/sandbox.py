"""A worker process the controller can always kill, in a sandbox.

Each worker runs ``python -m <module> '<policy>'`` (the judge's: `ksearch.eval.worker`) in a new session (so its
whole process group can be killed), with a scrubbed environment (a whitelist: PATH, locale and OpenMP variables; HOME and TMPDIR in
its own directory) and the sandbox of `ksearch.jail.jail`: new user, mount, network, PID and IPC namespaces
where the system allows them, a read-only file system except its home (a size-limited tmpfs) and the output
files, the invoking user's home hidden, no capabilities, a seccomp filter (no new processes, exec, sockets or
ptrace) and resource limits. Requests wait on a deadline; on expiry the process group is killed (and with
it the PID namespace) and the caller gets a WorkerTimeout. docs/evaluation.md says what this guarantees.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from ksearch import config
from ksearch.errors import ProtocolViolation, WorkerDied, WorkerError, WorkerStopped, WorkerTimeout
from ksearch.protocol import ErrorReply, ReplyT, Request, describe, reply_adapter
from ksearch.jail.jail_fs import DEVICES

_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES")
#: with ``gpu``, by default: the CUDA variables a worker keeps, and the NVIDIA driver's device nodes (glob patterns)
CUDA_ENV = ("CUDA_PATH", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
            "NVIDIA_DRIVER_CAPABILITIES")
NVIDIA_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*")
#: the system's programs and libraries (dynamic loader, libc, libm, libgomp; the toolchain for compiles)
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
#: what of /etc the dynamic loader reads
LOADER_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")


class Policy(BaseModel):
    """What the sandbox enforces on a worker (sizes in bytes, CPU time in seconds).

    ``namespaces``: ``auto`` (user+mount+net+pid+ipc, or without the user namespace as root when it is
    refused, or none), ``no-user`` (skip the user namespace), ``off`` (none: rlimits, capabilities and
    seccomp only). ``cpu_s``: CPU time of all the worker's threads together (None: unlimited). ``nproc``:
    processes + threads (enforced inside a user namespace, and for non-root users). ``hide_home``: cover the
    invoking user's home directory with an empty file system. ``seccomp``: off only to prove that the other
    layers contain a candidate on their own (tests).
    ``gpu``: see the field.
    """

    namespaces: Literal["auto", "no-user", "off"] = "auto"
    address_space_bytes: int = Field(default=16 << 30, gt=0)
    file_size_bytes: int = Field(default=256 << 20, gt=0)
    home_bytes: int = Field(default=256 << 20, gt=0)
    cpu_s: int | None = Field(default=None, gt=0)
    nproc: int = Field(default_factory=lambda: max(256, 4 * (os.cpu_count() or 1)), gt=0)
    hide_home: bool = True
    seccomp: bool = True
    #: pass the NVIDIA GPU through (``/dev/nvidia*`` device nodes usable, no address-space limit: the CUDA
    #: driver reserves far more virtual memory than it uses; CUDA variables kept in the environment). Set by
    #: the judge for GPU targets. If CUDA does not initialise inside the namespaces, ``namespaces="off"`` is
    #: the documented fallback (docs/cuda-target.md)
    gpu: bool = False
    #: with ``gpu``: glob patterns of the device nodes passed through (the target's, `Target.gpu_devices`)
    gpu_devices: tuple[str, ...] = NVIDIA_DEVICES
    #: with ``gpu``: the environment variables kept for the GPU's runtime (the target's, `Target.gpu_env`)
    gpu_env: tuple[str, ...] = CUDA_ENV
    #: ``reduced``: the worker sees only `worker_view` of the host's file system (a new root); ``host``:
    #: all of it, read-only, the user's home hidden (always so for ``gpu``, whose workers run without
    #: namespaces anyway)
    view: Literal["reduced", "host"] = "reduced"


#: seconds between checks, while a request waits, that no process of the worker was stopped from outside
STOP_POLL_S = 1.0


def stopped_process(pid: int) -> int | None:
    """A process in the tree under ``pid`` (itself included) that is stopped (state T or t), or None."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(k) for k in f.read().split()]
        except (OSError, IndexError, ValueError):
            continue
        if state in ("T", "t"):
            return p
    return None


def scrubbed_env(home: Path, gpu: bool = False, gpu_env: tuple[str, ...] = CUDA_ENV) -> dict[str, str]:
    """The environment a candidate sees: a whitelist (nothing secret), HOME and TMPDIR = ``home``; with
    ``gpu``, the GPU runtime's variables ``gpu_env`` too (CUDA's by default) and CuPy's kernel cache in ``home``
    (private to the worker)."""
    env = {k: os.environ[k] for k in _KEEP_ENV + (gpu_env if gpu else ()) if k in os.environ}
    if gpu:
        env["CUPY_CACHE_DIR"] = str(home / "cupy")
    env["HOME"] = str(home)
    env["TMPDIR"] = str(home)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # the worker must import ksearch the way this process did (installed, or from a source checkout)
    src = Path(__file__).resolve().parents[2]
    # ... and find the same third-party packages (a PYTHONPATH of the parent's, e.g. wheels carried to a machine)
    env["PYTHONPATH"] = os.pathsep.join([str(src), *config.python_path()])
    return env


@lru_cache(maxsize=1)
def _interpreter_paths() -> tuple[str, ...]:
    """The module search path of a worker's interpreter (asked once: this process's own ``sys.path`` has
    entries a worker does not get, such as a script's directory or a test runner's root), with the
    interpreter's prefixes and directory."""
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             str(Path(__file__).resolve().parents[2])}
    try:
        out = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                             check=False, capture_output=True, text=True, timeout=60, cwd="/",
                             env=scrubbed_env(Path("/")))
        paths.update(json.loads(out.stdout))
    except (OSError, subprocess.SubprocessError, ValueError):  # the worker will say what it cannot import
        paths.update(p for p in sys.path if p)
    return tuple(sorted(p for p in paths if p and os.path.exists(p)))


def _needed_paths(readable: list[Path]) -> list[str]:
    """Paths the worker reads besides the system's: the interpreter, its standard library and
    site-packages, ksearch itself, the PYTHONPATH it is given, and ``readable`` (e.g. the compiled kernel's
    directory, the input files' root)."""
    return sorted({*_interpreter_paths(), *(str(p) for p in readable)})


def worker_view(readable: list[Path]) -> list[str]:
    """Everything a CPU worker sees of the host's file system (read-only), besides its home, its output
    files, a fresh /proc and `jail.DEVICES`: the system's programs and libraries, the files of /etc the
    dynamic loader reads, ``/sys/devices/system/cpu`` (OpenMP and glibc count CPUs there), and
    `_needed_paths`."""
    return [*SYSTEM_PATHS, *LOADER_ETC, "/sys/devices/system/cpu", *_needed_paths(readable)]


def policy_argument(policy: Policy, home: Path, writable: list[Path], readable: list[Path]) -> str:
    """The JSON the worker's `jail.enter` reads (see its docstring). The worker's new root is assembled in
    ``home``'s sibling ``.root`` (an empty directory `Worker` makes)."""
    nproc = policy.nproc
    reduced = policy.view == "reduced" and not policy.gpu
    return json.dumps({
        "namespaces": policy.namespaces, "home": str(home), "home_bytes": policy.home_bytes,
        "writable": [str(p) for p in writable], "view": "reduced" if reduced else "host",
        "readable": worker_view(readable) if reduced else [], "stage": str(home.parent / ".root"),
        "dev": list(DEVICES),
        "address_space_bytes": None if policy.gpu else policy.address_space_bytes,
        "devices": gpu_device_nodes(policy.gpu_devices) if policy.gpu else [],
        "file_size_bytes": policy.file_size_bytes, "cpu_s": policy.cpu_s, "nproc": nproc,
        "pid_max": max(301, nproc + 64), "seccomp": policy.seccomp,  # 301: the kernel's least pid_max
        "hide": config.user_homes() if policy.hide_home else [], "keep": _needed_paths(readable),
    })


def gpu_device_nodes(patterns: tuple[str, ...] = NVIDIA_DEVICES) -> list[str]:
    """The device nodes of this machine that match ``patterns`` (glob; by default the NVIDIA driver's:
    ``/dev/nvidia0``, ``nvidiactl``, ``nvidia-uvm``, ...)."""
    import glob

    return sorted(p for pattern in patterns for p in glob.glob(pattern) if not os.path.isdir(p))


def parse_reply(line: bytes, msg: Request[ReplyT], rid: str) -> ReplyT | ErrorReply:
    """The reply ``line`` (one line of the worker's reply stream) to ``msg``, sent with id ``rid``: of the request's
    reply type (`ksearch.protocol.Request.expects`) or an ErrorReply.

    Raises:
        WorkerDied: the line is no JSON object (garbled).
        ProtocolViolation: it carries another id (it answers no request: something in the worker wrote it), or is
            not of the request's reply type (the message names the fields that are wrong).
    """
    try:
        reply = reply_adapter(msg.expects()).validate_json(line)
        if reply.id == rid:
            return reply
        why = ""
    except ValidationError as e:
        why = describe(e)
    try:
        obj = json.loads(line)
    except ValueError:
        raise WorkerDied(None, f"garbled reply: {line[:200]!r}") from None
    if not isinstance(obj, dict):
        raise WorkerDied(None, f"garbled reply: {line[:200]!r}")
    if obj.get("id") != rid:
        raise ProtocolViolation(f"a reply that answers no request was written to the worker's reply stream: "
                                f"{line[:200]!r}")
    raise ProtocolViolation(f"the reply to a {msg.op} request is not of its type ({why}): {line[:200]!r}")


class Worker:
    """One sandboxed worker process; use as a context manager so it is always killed.

    Args:
        scratch: the evaluation's directory; the worker's home is ``scratch/home`` (created here).
        policy: what the sandbox enforces.
        writable: files the worker may write (the output files; they must exist already).
        readable: further paths the worker must be able to read (the compiled kernel's directory).
        module: the worker's program, run as ``python -m module '<policy>'`` (the judge's:
            `ksearch.eval.evaluator.WORKER_MODULE`; named by the caller, so that the sandbox, below the judge, knows
            no module above it).
    """

    def __init__(self, scratch: Path, policy: Policy | None = None, writable: list[Path] = (),
                 readable: list[Path] = (), *, module: str):
        self.scratch = scratch
        self.policy = policy or Policy()
        self.home = scratch / "home"
        self.home.mkdir(exist_ok=True)
        (scratch / ".root").mkdir(exist_ok=True)  # where the jail assembles the worker's new root
        self.stderr_path = scratch / "worker.stderr"
        self._stderr = open(self.stderr_path, "wb")
        arg = policy_argument(self.policy, self.home, list(writable), list(readable))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, arg],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                cwd=self.home, env=scrubbed_env(self.home, self.policy.gpu, self.policy.gpu_env), start_new_session=True,
            )
        except OSError as e:
            self._stderr.close()
            raise WorkerError(f"cannot start an evaluation worker ({sys.executable}): {e}") from None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            data = self.stderr_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace").strip()

    def request(self, msg: Request[ReplyT], timeout_s: float) -> ReplyT | ErrorReply:
        """Send one request (with a fresh random ``id``) and wait for its reply: the request's reply type
        (`ksearch.protocol.Request.expects`) or an ErrorReply.

        Raises:
            WorkerTimeout: no reply within ``timeout_s`` (the worker is killed).
            WorkerDied: the worker exited or closed its reply stream, or wrote a line that is no JSON object
                (the worker is killed).
            ProtocolViolation: the reply does not carry the request's id, or is not of the request's reply type
                (the worker is killed).
        """
        rid = secrets.token_hex(8)
        try:
            self.proc.stdin.write((msg.model_copy(update={"id": rid}).model_dump_json() + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied(self.proc.returncode, self.stderr_tail()) from None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = stopped_process(self.proc.pid)
                self.kill()
                if stopped is not None:
                    raise WorkerStopped(f"worker process {stopped} was stopped by a signal from outside the judge")
                raise WorkerTimeout(f"no answer within {timeout_s:g} s")
            if not self._sel.select(timeout=min(left, STOP_POLL_S)):
                stopped = stopped_process(self.proc.pid) if left > STOP_POLL_S else None
                if stopped is not None:  # stopped from outside: say so now, not at the deadline
                    self.kill()
                    raise WorkerStopped(f"worker process {stopped} was stopped by a signal from outside the judge")
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:  # the worker is gone; let its init and launcher report how it ended
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                self.kill()
                raise WorkerDied(self.proc.returncode, self.stderr_tail())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return parse_reply(line, msg, rid)
        except (WorkerDied, ProtocolViolation):
            self.kill()
            raise

    def kill(self) -> None:
        """Kill the worker's whole process group and reap it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Kill the worker (a worker keeps nothing worth a graceful exit: its results are in its replies and its
        stderr file) and release its pipes."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.kill()
        self._sel.close()
        self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
