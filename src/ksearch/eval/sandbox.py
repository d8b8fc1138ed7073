"""A worker process the controller can always kill.

Each worker runs ``python -m ksearch.eval.worker`` in a new session (so its whole process group can be
killed), in its own scratch directory, with a scrubbed environment (no API keys, tokens or credentials: only
PATH, a few locale/thread variables and HOME pointed at the scratch directory) and resource limits (no core
files, bounded address space and file size). Requests wait on a deadline; on expiry the process group is
killed and the caller gets a WorkerTimeout.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from ksearch.errors import WorkerError

_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "TMPDIR")


class WorkerTimeout(Exception):
    """The worker did not answer within the deadline (it has been killed)."""


class WorkerDied(Exception):
    """The worker exited while a request was pending: ``returncode`` < 0 is the signal number."""

    def __init__(self, returncode: int | None, stderr_tail: str):
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        super().__init__(describe_exit(returncode))


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "worker stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker killed by {name}"
    return f"worker exited with status {returncode}"


def scrubbed_env(scratch: Path) -> dict[str, str]:
    """The environment a candidate sees: nothing secret, HOME and TMPDIR inside its scratch directory."""
    env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
    env["HOME"] = str(scratch)
    env["TMPDIR"] = str(scratch)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # the worker must import ksearch the way this process did (installed, or from a source checkout)
    src = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(src)
    return env


def _limits(address_space_bytes: int, file_size_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_bytes, file_size_bytes))


class Worker:
    """One sandboxed worker process; use as a context manager so it is always killed."""

    def __init__(self, scratch: Path, address_space_bytes: int = 16 << 30, file_size_bytes: int = 1 << 30):
        self.scratch = scratch
        self.stderr_path = scratch / "worker.stderr"
        self._stderr = open(self.stderr_path, "wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ksearch.eval.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                cwd=scratch, env=scrubbed_env(scratch), start_new_session=True,
                preexec_fn=lambda: _limits(address_space_bytes, file_size_bytes),
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

    def request(self, msg: dict, timeout_s: float) -> dict:
        """Send one request and wait for its reply.

        Raises:
            WorkerTimeout: no reply within ``timeout_s`` (the worker is killed).
            WorkerDied: the worker exited or closed its reply stream.
        """
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            raise WorkerDied(self.proc.returncode, self.stderr_tail()) from None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(timeout=left):
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout_s:g} s")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                self.kill()
                raise WorkerDied(self.proc.returncode, self.stderr_tail())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self.kill()
            raise WorkerDied(None, f"garbled reply: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied(None, f"garbled reply: {line[:200]!r}")
        return reply

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
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._sel.close()
        self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
