"""Running a task's own code: its reference, input generator, check, a KernelBench problem or a GPU MODE module.

Task code is trusted (it runs in this process, as every reference does) but it is not ours: it may raise anything,
call ``sys.exit``, or never return. `task_code` is the one place that turns each of those into a `TaskError` that
names the code and says in one line what happened, so a broken task is reported as the task's error (the CLI's
exit 2), never as the command's exit status, a traceback or the kernel's fault.

The time limit is SIGALRM's (`time_limit`): it works on the main thread only (elsewhere the code runs unbounded,
as a signal cannot be delivered to another thread), interrupts a Python loop at once and a single long C call
(one huge torch op) when that call returns.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from ksearch.errors import TaskError, TaskTimeout

#: the most characters of an exception's first line a task error repeats
REASON_CHARS = 300


class TimeUp(BaseException):
    """Raised inside the limited code when its time is up (a BaseException: task code's ``except Exception`` does
    not swallow it). ``args[0]``: the token `time_limit` yielded, so nested limits tell whose time is up."""


class _Token:
    """Whose limit a `TimeUp` is; ``fired``: that limit's time came (the TimeUp may reach the caller as another
    exception where a C extension, torch's, turned it into a SystemError)."""

    fired = False


#: the limits armed now, outermost first
_ARMED: list[_Token] = []


@contextmanager
def time_limit(seconds: float | None) -> Iterator[_Token]:
    """Raise `TimeUp` in the body after ``seconds`` (None: no limit; by SIGALRM, on the main thread only:
    elsewhere no limit). Yields the token the TimeUp carries. A timer set before (pytest-timeout's, an outer
    limit) keeps its deadline: where it falls first its own handler runs then, and it is re-armed with what it
    had left after the body."""
    token = _Token()
    if seconds is None or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield token
        return
    start = time.monotonic()
    deadline = start + seconds
    passed_on = []

    def up(signum, frame):
        if time.monotonic() >= deadline - 1e-3 or not callable(previous):
            token.fired = True
            raise TimeUp(token)
        passed_on.append(True)  # the outer timer's turn: its handler decides
        previous(signum, frame)

    old = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, up)
    signal.setitimer(signal.ITIMER_REAL, min(seconds, old[0]) if old[0] else seconds)
    _ARMED.append(token)
    try:
        yield token
    finally:
        _ARMED.remove(token)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old[0] and not passed_on:
            signal.setitimer(signal.ITIMER_REAL, max(old[0] - (time.monotonic() - start), 1e-3), old[1])


def _late(failed: str) -> str:
    """`task_code`'s default ``late``: ``failed`` without its last word and colon, then "did not finish"."""
    return f"{failed.rstrip(':').rsplit(' ', 1)[0]} did not finish"


def reason(e: BaseException) -> str:
    """``ValueError: first line of the message`` (cut at `REASON_CHARS`): an exception in one line."""
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    line = line if len(line) <= REASON_CHARS else line[:REASON_CHARS] + "..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


@contextmanager
def task_code(failed: str, limit_s: float | None = None, late: str | None = None) -> Iterator[None]:
    """Run the body as task code: an exception or ``sys.exit`` in it raises ``TaskError(f"{failed} {reason}")``;
    the body still running after ``limit_s`` seconds raises ``TaskTimeout(f"{late} in {limit_s:g} s")``, whatever
    the interrupted code turned the interruption into (torch's C code may make it a SystemError). A TaskError the
    body raises itself (ksearch's own, from a nested call) passes as it is.

    Args:
        failed: what failed, ending as the reason follows it: ``"reference of 'gemm' failed:"``,
            ``"problem.py: get_inputs() raised"``.
        limit_s: seconds the body may run (None: no limit; see `time_limit` for where a limit applies).
        late: what did not finish, e.g. ``"problem.py: the forward did not finish"`` (default: ``failed`` without
            its last word and colon, then "did not finish").

    Raises:
        TaskError: the body raised or exited.
        TaskTimeout: the body ran past ``limit_s``.
    """
    token: _Token | None = None
    try:
        with time_limit(limit_s) as token:
            yield
    except TimeUp as e:
        if e.args[0] is not token:  # an outer limit's
            raise
        raise TaskTimeout(f"{late or _late(failed)} in {limit_s:g} s") from None
    except (Exception, SystemExit) as e:  # SystemExit: sys.exit in task code is its failure, not our exit
        if not isinstance(e, TaskTimeout):  # a limit's TimeUp, turned into another error on its way out?
            fired = next((t for t in [*_ARMED, token] if t is not None and t.fired), None)
            if fired is token:
                raise TaskTimeout(f"{late or _late(failed)} in {limit_s:g} s") from None
            if fired is not None:  # an outer limit's: its guard says so
                raise TimeUp(fired) from None
        if isinstance(e, TaskError):
            raise
        raise TaskError(f"{failed} {reason(e)}") from None
