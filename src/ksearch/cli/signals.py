"""SIGTERM as a stop request: ``kill PID``, ``timeout``, a container stopping or a batch system's walltime ends a
run the way Ctrl-C does (the run marked interrupted, the ``ksearch resume`` line printed, nothing committed lost),
with the conventional exit status 128 + 15 = 143 instead of 130.

A process forked from the CLI inherits Python's handler; there it dies as SIGTERM's default would (its parent's
kill of it must not turn into an exception inside whatever it was doing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_main_pid: int | None = None
_terminated = False


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - the signal module's handler signature
    global _terminated
    if os.getpid() != _main_pid:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _terminated = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside: SIGTERM raises KeyboardInterrupt in this (the main) thread; the previous handler comes back
    after. A no-op where SIGTERM was ignored (a wrapper that meant it) or off the main thread."""
    global _main_pid, _terminated
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield
        return
    _main_pid, _terminated = os.getpid(), False
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupt_status() -> int:
    """The exit status of a command stopped by a KeyboardInterrupt: 143 when SIGTERM raised it, else 130."""
    return 143 if _terminated else 130
