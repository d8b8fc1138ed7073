"""A load meter: how much CPU other processes used while we measured something.

A timing or a ceiling probe taken while other work runs on the same cores comes out slow; a ceiling measured
that way makes the roofline floor too low and the judge rejects honest kernels as "faster than the floor". The
meter tells the probes (and the judge) whether the machine was busy.

"Ours" is this process (all its threads, `time.process_time`), its live descendants (found through the
``/proc/<pid>/task/<tid>/children`` links, each with the CPU of the children it reaped), the children we reaped
(`os.times`), and every process of a session in ``exclude_sessions`` (the judge's workers run in sessions of their
own). "Others" is the busy CPU time of the CPUs we may run on (``/proc/stat``: user, nice, system, irq, softirq and
steal; steal is time the hypervisor gave our virtual CPUs to someone else) minus ours, in CPU seconds per wall
second over the window: 2.0 means two cores' worth of other work.

Linux only: elsewhere a reading carries the 1-minute load average (which counts our own work too) and says so in
``note``. A reading costs tens of microseconds (two small /proc reads plus one per descendant); psutil's
recursive ``children()`` scans every process of the machine instead, milliseconds on a busy host, which is too
slow to take around every timed phase. What the meter misses: CPU of an excluded-session process that exits and
is reaped by a parent that is not ours during the window is counted as others' (a busier reading, the safe side);
contention that does not show as CPU time (memory bandwidth taken by other cores or other virtual machines) is not
seen at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: A reading is busy when others used more than max(BUSY_MIN_CORES, BUSY_FRACTION x usable cores) cores: on 2
#: cores, half a core; on 16, four. Below that a probe on every core still gets most of each core.
BUSY_MIN_CORES = 0.5
BUSY_FRACTION = 0.25

PROC = Path("/proc")
_STAT_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal; guest is inside user


@dataclass(frozen=True)
class LoadReading:
    """CPU used by other processes over one window.

    busy_cores: CPU seconds per wall second used by processes other than ours (see the module docstring) on the
        CPUs we may run on; on a system without /proc, the 1-minute load average.
    usable_cores: CPUs this process may run on (``len(os.sched_getaffinity(0))``).
    window_s: wall seconds the reading covers.
    loadavg_1m: ``os.getloadavg()[0]`` at the end of the window, for the record (it counts our work too).
    machine_busy_cores: all busy CPU time of those CPUs per wall second, ours included (None without /proc).
    ours_cores: our CPU seconds per wall second (None without /proc).
    note: how the reading was made where it is not the usual way.
    """

    busy_cores: float
    usable_cores: int
    window_s: float
    loadavg_1m: float
    machine_busy_cores: float | None = None
    ours_cores: float | None = None
    note: str = ""

    @property
    def threshold_cores(self) -> float:
        """Cores of others' work above which the reading is busy: `busy_threshold(usable_cores)`."""
        return busy_threshold(self.usable_cores)

    @property
    def busy(self) -> bool:
        """True when others used more than `threshold_cores` cores over the window."""
        return self.busy_cores > self.threshold_cores

    def describe(self) -> str:
        """One line for a record, e.g. 'others used 1.93 of 2 cores over 0.20 s (busy; load average 2.1)'."""
        state = "busy" if self.busy else "quiet"
        text = (f"others used {self.busy_cores:.2f} of {self.usable_cores} cores over {self.window_s:.2f} s "
                f"({state}; load average {self.loadavg_1m:.2f})")
        return f"{text}; {self.note}" if self.note else text


def busy_threshold(usable_cores: int) -> float:
    """Cores of others' work above which a machine with `usable_cores` is busy:
    max(BUSY_MIN_CORES, BUSY_FRACTION x usable_cores)."""
    return max(BUSY_MIN_CORES, BUSY_FRACTION * usable_cores)


def usable_cpus() -> list[int]:
    """Ids of the CPUs this process may run on (all CPUs where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


#: /proc/stat's aggregate line (every CPU together); ``cpuN`` lines are one CPU each
_ALL_CPUS = "cpu"


def busy_ticks(stat_text: str, cpus: Iterable[int] | None = None) -> int:
    """Busy clock ticks in /proc/stat text: user + nice + system + irq + softirq + steal, summed over the
    ``cpuN`` lines of `cpus` (the aggregate ``cpu`` line when `cpus` is None or one of them has no line).
    Raises ValueError when the text has no ``cpu`` line."""
    lines: dict[str, list[int]] = {}
    for line in stat_text.splitlines():
        if line.startswith(_ALL_CPUS):
            name, *values = line.split()
            lines[name] = [int(v) for v in values]
    if _ALL_CPUS not in lines:
        raise ValueError(f"no 'cpu' line in /proc/stat text {stat_text[:80]!r}")
    names = [f"{_ALL_CPUS}{c}" for c in cpus] if cpus is not None else []
    if not names or any(n not in lines for n in names):
        names = [_ALL_CPUS]
    return sum(lines[n][i] for n in names for i in _STAT_BUSY_FIELDS if i < len(lines[n]))


def parse_pid_stat(text: str) -> tuple[int, int, int, int]:
    """(ppid, session id, start time, CPU ticks) from /proc/<pid>/stat text; CPU ticks = utime + stime +
    cutime + cstime (its own and its reaped children's). Raises ValueError on malformed text."""
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    # rest[0] is the state (field 3); field k of proc(5) is rest[k - 3]
    ppid, sid = int(rest[1]), int(rest[3])
    cpu = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return ppid, sid, int(rest[19]), cpu


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:
        return None


def _children(proc: Path, pid: int) -> list[int] | None:
    """Child pids of `pid` through every thread's children file; None when the kernel has no such files."""
    try:
        tids = os.listdir(proc / str(pid) / "task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        text = _read(proc / str(pid) / "task" / tid / "children")
        if text is None:
            if not (proc / str(pid) / "task" / tid).exists():
                continue  # the thread ended
            return None
        out += [int(p) for p in text.split()]
    return out


def _scan(proc: Path) -> dict[int, tuple[int, int, int, int]]:
    """Every process: pid -> parse_pid_stat. The slow path (one read per process on the machine)."""
    out = {}
    for name in os.listdir(proc):
        if name.isdigit():
            text = _read(proc / name / "stat")
            if text:
                try:
                    out[int(name)] = parse_pid_stat(text)
                except (ValueError, IndexError):
                    continue
    return out


def tree_ticks(proc: Path, roots: Iterable[int], sessions: Iterable[int] = (),
               include_roots: bool = False) -> dict[int, tuple[int, int]]:
    """pid -> (start time, CPU ticks) of the live descendants of `roots` (the roots themselves too with
    `include_roots`) and of every process of `sessions` with its descendants, read under `proc` (a /proc)."""
    found: dict[int, tuple[int, int]] = {}
    sessions = set(sessions)
    scan: dict[int, tuple[int, int, int, int]] | None = None
    stack: list[int] = []
    for root in roots:
        if include_roots:
            stack.append(root)
        else:
            kids = _children(proc, root)
            if kids is None:
                scan = scan or _scan(proc)
                kids = [p for p, s in scan.items() if s[0] == root]
            stack += kids
    for sid in sessions:  # a session's id is its leader's pid; a session without a leader needs the slow scan
        text = _read(proc / str(sid) / "stat")
        try:
            leader = text is not None and parse_pid_stat(text)[1] == sid
        except (ValueError, IndexError):
            leader = False
        if leader:
            stack.append(sid)
        else:
            scan = scan or _scan(proc)
            stack += [p for p, s in scan.items() if s[1] == sid]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        text = _read(proc / str(pid) / "stat")
        if text is None:
            continue  # it ended; its CPU moved to whoever reaped it
        try:
            _, _, start, cpu = parse_pid_stat(text)
        except (ValueError, IndexError):
            continue
        found[pid] = (start, cpu)
        kids = _children(proc, pid)
        if kids is None:
            scan = scan or _scan(proc)
            kids = [p for p, s in scan.items() if s[0] == pid]
        stack += kids
    return found


class LoadMeter:
    """Measures the CPU used by others from its creation to each `reading` (see the module docstring).

    exclude_sessions: session ids whose processes count as ours (e.g. the judge's worker sessions).
    """

    def __init__(self, exclude_sessions: Iterable[int] = ()):
        self._sessions = frozenset(int(s) for s in exclude_sessions)
        self._cpus = usable_cpus()
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._linux = (PROC / "stat").exists()
        self._t0 = time.monotonic()
        self._pids: dict[int, tuple[int, int]] = {}
        self._start = self._sample(first=True) if self._linux else (0.0, 0.0)

    def _sample(self, first: bool = False) -> tuple[float, float]:
        """(busy CPU seconds of our CPUs, our CPU seconds) now; the first sample remembers the pids it counted."""
        machine = busy_ticks(_read(PROC / "stat") or "", self._cpus) / self._tick
        t = os.times()
        ours = time.process_time() + t.children_user + t.children_system
        pids = tree_ticks(PROC, [os.getpid()], self._sessions)
        for pid, (start, _) in self._pids.items():  # counted before, now out of the tree (re-parented): keep it
            if pid not in pids:
                text = _read(PROC / str(pid) / "stat")
                try:
                    if text is not None and parse_pid_stat(text)[2] == start:
                        pids[pid] = (start, parse_pid_stat(text)[3])
                except (ValueError, IndexError):
                    pass
        if first:
            self._pids = dict(pids)
        ours += sum(cpu for _, cpu in pids.values()) / self._tick
        return machine, ours

    def reading(self) -> LoadReading:
        """The load by others since the meter was made. Never raises on an unreadable /proc entry."""
        window = max(time.monotonic() - self._t0, 1e-9)
        try:
            load1 = os.getloadavg()[0]
        except (OSError, AttributeError):
            load1 = 0.0
        n = len(self._cpus)
        if not self._linux:
            return LoadReading(busy_cores=load1, usable_cores=n, window_s=window, loadavg_1m=load1,
                               note="no /proc/stat here: busy_cores is the 1-minute load average, ours included")
        machine, ours = self._sample()
        machine_cores = (machine - self._start[0]) / window
        ours_cores = (ours - self._start[1]) / window
        return LoadReading(busy_cores=max(0.0, machine_cores - ours_cores), usable_cores=n, window_s=window,
                           loadavg_1m=load1, machine_busy_cores=machine_cores, ours_cores=ours_cores)


def measure_load(window_s: float = 0.2, exclude_sessions: Iterable[int] = ()) -> LoadReading:
    """Sleep `window_s` seconds and return the load by others over that time (see `LoadMeter`)."""
    meter = LoadMeter(exclude_sessions)
    time.sleep(window_s)
    return meter.reading()
