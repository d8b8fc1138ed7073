import sqlite3

import pytest

from ksearch.errors import StoreError
from ksearch.eval.records import Candidate, Evaluation, Status
from ksearch.store.db import MIGRATIONS, Store


def test_migrations_recorded_and_reopen(tmp_path):
    s = Store(tmp_path / "r.sqlite", create=True)
    s.create_run("r1", "t", "cpu", {"budget": 3}, {"python": "3.11"}, None)
    names = [r[0] for r in s.db.execute("SELECT name FROM migrations")]
    assert names == [n for n, _ in MIGRATIONS]
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()
    again = Store(tmp_path / "r.sqlite")
    assert again.run()["config"] == {"budget": 3}


def test_step_is_atomic(tmp_path):
    s = Store(tmp_path / "r.sqlite", create=True)
    s.create_run("r1", "t", "cpu", {}, {}, None)
    c = Candidate(target="cpu", sources={"k.c": "x"})
    ev = Evaluation(candidate_id=c.id, task="t", target="cpu", status=Status.PASSED)
    assert s.record_step(c, ev, 2.0, '{"t": 1}', '{"s": 1}', None) == 1
    # the same candidate twice violates the unique index: nothing of the second step is written
    with pytest.raises(sqlite3.IntegrityError):
        s.record_step(c, ev, 2.0, '{"t": 2}', '{"s": 2}', None)
    assert s.evaluation_count() == 1
    assert s.latest_snapshot() == (1, '{"t": 1}', '{"s": 1}')
    assert s.evaluation_of(c.id).status is Status.PASSED and s.candidate(c.id) == c


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(StoreError, match="no run store"):
        Store(tmp_path / "missing.sqlite")
    (tmp_path / "junk.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a usable"):
        Store(tmp_path / "junk.sqlite")
    s = Store(tmp_path / "new.sqlite", create=True)
    s.db.execute("INSERT INTO migrations VALUES ('999_future', 'x')")
    s.close()
    with pytest.raises(StoreError, match="newer ksearch"):
        Store(tmp_path / "new.sqlite")
