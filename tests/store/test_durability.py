"""The run store survives its environment (issue 25): the run file alone holds every committed step, a file or
directory removed or replaced under a run stops it with nothing lost, a full disk stops it resumably, and a
read-only home still lists and shows runs. Runs here are the controller's on a fake judge (tests.search)."""

import shutil
import sqlite3

import pytest

from ksearch.errors import StoreWriteError
from ksearch.proposers.patterns import PatternsProposer
from ksearch.run.controller import Controller
from ksearch.store.db import Store
from tests.search.test_controller import TASK, FakeJudge, make


def _steps(tmp_path, n, budget=6):
    c = make(tmp_path, budget=budget)
    c.start()
    for _ in range(n):
        c.step()
    assert c.evaluations == n
    return c


def _resume(path, cfg):
    """A new process's controller on the store at ``path``, run to its budget."""
    again = Controller(Store(path), TASK, FakeJudge(), PatternsProposer(TASK, "cpu", None), cfg)
    again.start()
    again.run()
    return again


def _judged_once(store):
    n = store.db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    assert n == store.db.execute("SELECT COUNT(DISTINCT candidate_id) FROM evaluations").fetchone()[0]
    return n


def test_the_run_file_copied_alone_mid_run_holds_every_committed_evaluation(tmp_path):
    c = _steps(tmp_path / "r", 3)
    (tmp_path / "copy").mkdir()
    shutil.copy(c.store.path, tmp_path / "copy" / "run.sqlite")  # without its -wal, the run still open
    copy = Store(tmp_path / "copy" / "run.sqlite")
    assert copy.evaluation_count() == 3
    assert copy.latest_snapshot() == c.store.latest_snapshot()
    assert copy.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_run_directory_removed_mid_run_is_written_back_and_the_run_stops(tmp_path):
    c = _steps(tmp_path / "r", 2)
    shutil.rmtree(tmp_path / "r")
    with pytest.raises(StoreWriteError, match=r"was removed while the run worked on it; its store \(2 evaluations\) "
                                              r"was written back there"):
        c.step()
    with pytest.raises(StoreWriteError, match="was removed"):  # and it stays stopped
        c.store.set_status("stopped")
    c.store.close()
    again = _resume(tmp_path / "r" / "run.sqlite", c.cfg)
    assert again.evaluations == 6 and _judged_once(again.store) == 6


def test_a_run_file_replaced_mid_run_is_left_alone_and_the_runs_own_kept_beside_it(tmp_path):
    c = _steps(tmp_path / "r", 2)
    other = Store(tmp_path / "other.sqlite", create=True)
    other.close()
    shutil.move(tmp_path / "other.sqlite", c.store.path)
    with pytest.raises(StoreWriteError, match=r"was replaced by another file .* \(2 evaluations\) is kept as"):
        c.step()
    kept = list((tmp_path / "r").glob("run.kept-*.sqlite"))
    assert len(kept) == 1 and Store(kept[0]).evaluation_count() == 2
    assert Store(c.store.path).evaluation_count() == 0  # the file put there is untouched


def test_a_removed_wal_is_checkpointed_into_the_run_file_and_the_run_stops(tmp_path):
    c = _steps(tmp_path / "r", 2)
    wal = c.store.path.with_name("run.sqlite-wal")
    assert wal.is_file()
    wal.unlink()
    with pytest.raises(StoreWriteError, match=r"run.sqlite-wal was removed .* \(2 evaluations\) is in"):
        c.step()
    again = _resume(c.store.path, c.cfg)
    assert again.evaluations == 6 and _judged_once(again.store) == 6


class _FullDisk:
    """A connection whose writes of evaluations fail as SQLite's do on a full disk, once ``full`` is set."""

    def __init__(self, db):
        self._db, self.full = db, False

    def execute(self, sql, *args):
        if self.full and sql.startswith("INSERT INTO evaluations"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_full_disk_stops_the_run_with_nothing_half_written_and_resume_finishes(tmp_path):
    c = _steps(tmp_path / "r", 2)
    c.store.db = disk = _FullDisk(c.store.db)
    disk.full = True
    with pytest.raises(StoreWriteError, match="cannot write the run store .*run.sqlite: database or disk is full; "
                                              "nothing of this step was committed"):
        c.run()
    assert not disk.in_transaction
    c.store.close()
    again = _resume(c.store.path, c.cfg)
    assert again.evaluations == 6 and _judged_once(again.store) == 6


KILLED = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.search.test_controller import make
c = make(Path(sys.argv[1]), budget=6)
c.start()
for _ in range(3):
    c.step()
print("ready", flush=True)
time.sleep(60)
"""


def test_a_run_killed_after_its_wal_was_removed_loses_no_committed_evaluation(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "r"), str(root)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        assert proc.stdout.readline().strip() == "ready"
        (tmp_path / "r" / "run.sqlite-wal").unlink()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert Store(tmp_path / "r" / "run.sqlite").evaluation_count() == 3
