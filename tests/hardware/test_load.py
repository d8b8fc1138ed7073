"""The load meter: others' CPU counted, ours (self, descendants, excluded sessions) not, and cheap to read.

The machine these tests run on is shared, so nothing asserts that it is quiet: each test compares the meter
with the CPU time its own synthetic load used (read from /proc), which holds whatever else runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ksearch.hardware import load
from ksearch.hardware.load import LoadMeter, LoadReading, busy_ticks, measure_load, parse_pid_stat, tree_ticks

from .loadgen import cpu_ticks, detached_loops, own_loops

linux = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the load meter reads /proc (Linux)")
TICK = os.sysconf("SC_CLK_TCK")
WINDOW_S = 0.4


def _window(pids, sessions=()):
    """A meter reading over WINDOW_S and the cores `pids` used meanwhile (from their /proc ticks)."""
    before = cpu_ticks(pids)
    meter = LoadMeter(sessions)
    time.sleep(WINDOW_S)
    reading = meter.reading()
    return reading, (cpu_ticks(pids) - before) / TICK / reading.window_s


#: windows a test takes, at most, for its loops to get the CPU it needs
TRIES = 5


def _loaded_window(pids, least: float, sessions=()):
    """The first of up to TRIES `_window`s in which `pids` ran more than ``least`` cores; the test is skipped,
    with the cores they got, when none does: on a machine busy enough (a load average of 9-12 on 2 cores) the loops
    got 0.19 cores, and nothing about the meter can be told from loops that barely ran. Only the precondition picks
    the window: what is asserted of the reading is asserted of that window, whatever it shows."""
    got = []
    for _ in range(TRIES):
        reading, theirs = _window(pids, sessions)
        if theirs > least:
            return reading, theirs
        got.append(round(theirs, 2))
    pytest.skip(f"the loops ran {got} cores in {TRIES} windows of {WINDOW_S} s (load average "
                f"{os.getloadavg()[0]:.1f}), never more than {least}: too little to test the meter with")


def test_busy_ticks_sums_busy_fields_of_the_usable_cpus():
    text = ("cpu  100 5 20 999 7 1 2 3 50 0\n"
            "cpu0 60 5 10 500 3 1 1 2 50 0\n"
            "cpu1 40 0 10 499 4 0 1 1 0 0\n"
            "intr 12345\n")
    assert busy_ticks(text, [0]) == 60 + 5 + 10 + 1 + 1 + 2  # idle, iowait and guest (inside user) left out
    assert busy_ticks(text, [1]) == 40 + 10 + 1 + 1
    assert busy_ticks(text, [0, 7]) == busy_ticks(text) == 100 + 5 + 20 + 1 + 2 + 3  # cpu7 has no line
    with pytest.raises(ValueError, match="no 'cpu' line"):
        busy_ticks("intr 1\n")


def test_parse_pid_stat_survives_a_hostile_command_name():
    fields = ["S", "41", "41", "77"] + ["0"] * 7 + ["11", "12", "13", "14"] + ["0"] * 4 + ["999"] + ["0"] * 20
    text = f"42 (a) b (c) {' '.join(fields)}\n"
    assert parse_pid_stat(text) == (41, 77, 999, 11 + 12 + 13 + 14)


def _fake_proc(root: Path, procs: dict[int, tuple[int, int, int]], children: bool = True) -> Path:
    """A /proc tree of pid -> (ppid, sid, cpu ticks), one thread per process; children files unless not
    `children` (a kernel without CONFIG_PROC_CHILDREN)."""
    for pid, (ppid, sid, cpu) in procs.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        fields = ["S", str(ppid), str(pid), str(sid)] + ["0"] * 7 + [str(cpu), "0", "0", "0"] + ["0"] * 4 + \
            [str(1000 + pid)] + ["0"] * 20
        (d / "stat").write_text(f"{pid} (p {pid}) {' '.join(fields)}\n")
        if children:
            kids = [str(p) for p, (pp, _, _) in procs.items() if pp == pid]
            (d / "task" / str(pid) / "children").write_text(" ".join(kids) + (" " if kids else ""))
    return root


@pytest.mark.parametrize("children", [True, False])
def test_tree_ticks_finds_descendants_and_session_members(tmp_path, children):
    procs = {1: (0, 1, 5), 10: (1, 10, 100), 11: (10, 10, 7), 12: (11, 12, 3),  # 10 us, 11 child, 12 grandchild
             20: (1, 20, 50),  # someone else
             30: (1, 30, 40), 31: (30, 30, 2),  # a session we exclude, led by 30
             41: (1, 40, 9)}  # a session whose leader 40 is gone
    proc = _fake_proc(tmp_path, procs, children)
    assert tree_ticks(proc, [10]) == {11: (1011, 7), 12: (1012, 3)}
    assert tree_ticks(proc, [10], include_roots=True)[10] == (1010, 100)
    got = tree_ticks(proc, [10], sessions=[30, 40])
    assert set(got) == {11, 12, 30, 31, 41} and 20 not in got


@linux
def test_detached_loops_on_every_core_count_as_others():
    with detached_loops() as pids:
        reading, theirs = _loaded_window(pids, 0.6)
    assert reading.busy_cores >= 0.85 * theirs - 0.1, (reading, theirs)
    assert reading.ours_cores < 0.2, reading
    assert reading.busy


@linux
def test_our_busy_children_and_grandchild_are_not_others():
    with own_loops() as pids:
        reading, theirs = _loaded_window(pids, 0.3)
    assert reading.ours_cores >= 0.9 * theirs - 0.1, (reading, theirs)
    # what is left for others is at most what the machine did besides our loops
    assert reading.busy_cores <= reading.machine_busy_cores - 0.9 * theirs + 0.1, (reading, theirs)


@linux
def test_a_child_reaped_within_the_window_stays_ours():
    meter = LoadMeter()
    done = subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"],
                          timeout=30)  # 0.3 s of CPU, however long that takes on a shared machine
    assert done.returncode == 0
    reading = meter.reading()
    used = 0.3 / reading.window_s
    assert reading.ours_cores >= 0.8 * used, reading


@linux
def test_excluded_sessions_count_as_ours():
    with detached_loops(1) as pids:
        counted, theirs = _loaded_window(pids, 0.3, sessions=pids)  # each loop leads its own session
        # > 0.3 as above: on a loaded machine (pytest --under-load) one loop got 0.50 cores; what is checked is
        # relative to what it ran
        assert counted.ours_cores >= 0.85 * theirs - 0.1, (counted, theirs)
        plain, theirs = _loaded_window(pids, 0.3)
        assert plain.ours_cores < 0.2 and plain.busy_cores >= 0.85 * theirs - 0.1, (plain, theirs)


@linux
def test_a_reading_is_cheap():
    meter = LoadMeter()
    costs = []
    for _ in range(50):
        t = time.perf_counter()
        meter.reading()
        costs.append(time.perf_counter() - t)
    t = time.perf_counter()
    LoadMeter()
    costs.append(time.perf_counter() - t)
    assert sorted(costs)[len(costs) // 2] < 1e-3, sorted(costs)


def test_busy_threshold():
    def r(busy, cores):
        return LoadReading(busy_cores=busy, usable_cores=cores, window_s=0.2, loadavg_1m=0.0)

    assert not r(0.5, 2).busy and r(0.51, 2).busy  # half a core on 2 cores
    assert not r(3.9, 16).busy and r(4.1, 16).busy  # a quarter of 16 cores
    assert "busy" in r(1.0, 2).describe() and "quiet" in r(0.0, 2).describe()


def test_without_proc_the_reading_is_the_load_average(monkeypatch, tmp_path):
    monkeypatch.setattr(load, "PROC", tmp_path / "no-proc")
    monkeypatch.setattr(load.os, "getloadavg", lambda: (3.25, 1.0, 1.0))
    reading = measure_load(0.01)
    assert reading.busy_cores == 3.25 and reading.machine_busy_cores is None
    assert "load average" in reading.note
