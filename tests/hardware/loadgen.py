"""Synthetic CPU load for the load-meter and probe tests: busy loops that are, or are not, our descendants."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ksearch.hardware.load import PROC, parse_pid_stat, usable_cpus

LOOP = "while True: pass"

# The middle process forks the loop in a new session, prints its pid and exits: the loop is re-parented away
# from us, so it is nobody's descendant of ours.
_DETACH = f"""
import os, sys
pid = os.fork()
if pid == 0:
    os.setsid()
    os.closerange(0, 3)
    {LOOP}
print(pid, flush=True)
"""


def cpu_ticks(pids) -> int:
    """utime + stime (+ reaped children) ticks of the live processes `pids`."""
    total = 0
    for pid in pids:
        try:
            total += parse_pid_stat((PROC / str(pid) / "stat").read_text())[3]
        except (OSError, ValueError):
            pass
    return total


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


#: the machine-wide lock one test's synthetic load holds (`load_turn`)
TURN_LOCK = Path(tempfile.gettempdir()) / "ksearch-tests-synthetic-load.lock"


@contextlib.contextmanager
def load_turn(exclusive: bool = True):
    """One test's busy loops at a time on this machine: an exclusive flock on `TURN_LOCK` while they run.
    pytest-xdist runs tests side by side, and each load test asserts what the judge or the load meter does at its
    own load (beside the tie test's two loops, the judge's power test at its own two loops on 2 cores found the
    1.3x kernel faster in fewer than the 6 of 10 rounds it asks for: at least 6 ties). A session-long load
    (`--under-load`) takes no turn (`exclusive=False`)."""
    if not exclusive:
        yield
        return
    with open(TURN_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)   # waits for another worker's load test to end
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def detached_loops(n: int | None = None, exclusive: bool = True):
    """`n` (default: one per usable CPU) busy loops, each in its own session and not our descendant; yields
    their pids (each also its session id) and kills them on exit. `exclusive`: in this machine's load turn
    (`load_turn`)."""
    n = n or len(usable_cpus())
    pids: list[int] = []
    with load_turn(exclusive):
        try:
            for _ in range(n):
                out = subprocess.run([sys.executable, "-c", _DETACH], capture_output=True, text=True, timeout=30,
                                     check=True).stdout
                pids.append(int(out.split()[0]))
            time.sleep(0.05)
            yield pids
        finally:
            _kill(pids)


@contextlib.contextmanager
def own_loops(n: int | None = None, grandchild: bool = True):
    """`n` busy loops that are our descendants (the last one a grandchild, through a shell, when `grandchild`);
    yields the pids of the loops and kills them (and the shell) on exit. Each child leads a session of its own
    (still our descendant): with the scheduler's autogroups (Linux, sched_autogroup_enabled) loops in pytest's
    session shared one session's part of the CPUs, 0.14-0.19 cores for two loops at a load average of 6-9 on 2
    cores where the detached loops of other sessions got far more. In this machine's load turn (`load_turn`)."""
    n = n or len(usable_cpus())
    procs: list[subprocess.Popen] = []
    loops: list[int] = []
    with load_turn():
        try:
            for i in range(n):
                if grandchild and i == n - 1:
                    shell = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{LOOP}" & echo $!; wait'],
                                             stdout=subprocess.PIPE, text=True, start_new_session=True)
                    procs.append(shell)
                    loops.append(int(shell.stdout.readline()))
                else:
                    p = subprocess.Popen([sys.executable, "-c", LOOP], start_new_session=True)
                    procs.append(p)
                    loops.append(p.pid)
            time.sleep(0.05)
            yield loops
        finally:
            _kill(loops)
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(timeout=10)
