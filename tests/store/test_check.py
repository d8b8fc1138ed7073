"""`ksearch runs check` and resume on damaged stores (ksearch.store.check, issue 25): bytes overwritten inside the
file are found (check, resume, show), the repair keeps every row that still reads and a resume finishes the run
without judging a committed kernel again; a newest snapshot that does not decode is skipped on resume."""

import random
import shutil
import sqlite3

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.store.check import check
from ksearch.store.db import Store
from tests.store.test_durability import _judged_once, _resume, _steps

runner = CliRunner()


@pytest.fixture(scope="module")
def six(tmp_path_factory):
    """A closed store of a run stopped after 6 of 10 evaluations (the fake judge)."""
    where = tmp_path_factory.mktemp("six") / "r"
    c = _steps(where, 6, budget=10)
    c.store.set_config(c.cfg.model_dump(mode="json"))
    c.close()
    c.store.close()
    return where, c.cfg


def _copy(six, tmp_path):
    where, cfg = six
    shutil.copytree(where, tmp_path / "r")
    return tmp_path / "r" / "run.sqlite", cfg


def _set_newest_snapshot(path, column: str, value: str) -> None:
    """Write ``value`` (JSON that does not decode) into ``column`` of the newest snapshot."""
    con = sqlite3.connect(path)
    with con:
        con.execute(f"UPDATE snapshots SET {column} = ? WHERE seq = (SELECT MAX(seq) FROM snapshots)", (value,))
    con.close()


def _overwrite_a_leaf_of(path, table: str) -> None:
    """Random bytes over the first half of one leaf page of ``table`` (its header and cell pointers)."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = con.execute("PRAGMA page_size").fetchone()[0]
    leaves = [p for (p,) in con.execute("SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (table,))]
    con.close()
    assert len(leaves) >= 2, leaves
    with open(path, "r+b") as f:
        f.seek((leaves[len(leaves) // 2] - 1) * size)
        f.write(random.Random(25).randbytes(size // 2))


def test_bytes_overwritten_in_the_file_are_found_and_repaired_and_the_run_finishes(six, tmp_path):
    path, cfg = _copy(six, tmp_path)
    _overwrite_a_leaf_of(path, "snapshots")
    assert Store(path).quick_check()  # the damage is there for SQLite to see
    r = runner.invoke(app, ["resume", str(path.parent)])  # refused before anything is written
    assert r.exit_code != 0 and "is damaged (integrity check" in str(r.exception) and "--repair" in str(r.exception)
    r = runner.invoke(app, ["runs", "check", str(path.parent)])
    assert r.exit_code == 1 and "damaged" in r.output and "--repair" in r.output, r.output
    r = runner.invoke(app, ["runs", "check", str(path.parent), "--repair"])
    assert r.exit_code == 0 and "repaired: 6 evaluations" in r.output, r.output
    assert len(list(path.parent.glob("run.sqlite.damaged-*[0-9]"))) == 1
    fixed = check(path)
    assert fixed.ok and fixed.rows["evaluations"] == 6 and fixed.newest_snapshot is not None
    again = _resume(path, cfg)
    assert again.evaluations == 10 and _judged_once(again.store) == 10
    assert len(again.evaluator.calls) == 4  # only the 4 not judged before (the naive kernel is kept)
    assert runner.invoke(app, ["runs", "check", str(path.parent)]).exit_code == 0


def test_a_damaged_evaluations_page_loses_only_its_rows(six, tmp_path):
    path, cfg = _copy(six, tmp_path)
    _overwrite_a_leaf_of(path, "evaluations")
    r = runner.invoke(app, ["runs", "check", str(path.parent), "--repair", "--json"])
    assert r.exit_code == 0, r.output
    fixed = check(path)
    assert fixed.ok and 0 < fixed.rows["evaluations"] < 6
    again = _resume(path, cfg)  # what was lost is judged again, once
    assert again.evaluations == 10 and _judged_once(again.store) == 10


def test_a_newest_snapshot_that_does_not_decode_is_skipped_on_resume(six, tmp_path):
    path, cfg = _copy(six, tmp_path)
    _set_newest_snapshot(path, "tree_json", '{"nodes": 7')
    found = check(path)
    assert not found.ok and found.snapshots_damaged == 1 and "snapshots row 6 does not decode" in found.problems[0]
    said: list[str] = []
    from ksearch.proposers.patterns import PatternsProposer
    from ksearch.run.controller import Controller
    from tests.search.test_controller import TASK, FakeJudge

    c = Controller(Store(path), TASK, FakeJudge(), PatternsProposer(TASK, "cpu", None), cfg, progress=said.append)
    c.start()
    assert any("snapshot 6 does not decode" in s and "going on from snapshot 5" in s for s in said), said
    c.run()
    assert c.evaluations == 10 and _judged_once(c.store) == 10
    assert len(c.evaluator.calls) == 4



def test_show_says_what_is_damaged(six, tmp_path):
    path, _ = _copy(six, tmp_path)
    _set_newest_snapshot(path, "state_json", "[]")
    r = runner.invoke(app, ["show", str(path.parent)])
    assert r.exit_code == 0 and "snapshot 6 does not decode" in r.output and "going on from snapshot 5" in r.output


def test_a_store_sqlite_cannot_open_is_damaged_and_the_commands_it_prints_name_the_run_as_given(six, tmp_path):
    """A truncated or overwritten header (SQLite: "database disk image is malformed") was exit 2 as if no store were
    there, an empty file exit 1 (damaged): it is damaged, exit 1, and --repair says it cannot rebuild it. The
    commands printed named the run by its directory's name, not found for a copy outside KSEARCH_HOME."""
    path, _ = _copy(six, tmp_path)
    moved = tmp_path / "a copy" / "run.sqlite"
    moved.parent.mkdir()
    shutil.copy(path, moved)
    con = sqlite3.connect(moved)
    with con:
        con.execute("UPDATE snapshots SET tree_json = '{' WHERE seq = 6")
    con.close()
    r = runner.invoke(app, ["runs", "check", str(moved.parent)])
    assert r.exit_code == 1 and f"`ksearch runs check '{moved.parent}' --repair`" in r.output, r.output
    with open(path, "r+b") as f:
        f.write(b"\0" * 100)  # the header
    before = path.read_bytes()
    for args in ([], ["--repair"]):
        r = runner.invoke(app, ["runs", "check", str(path.parent), *args])
        assert r.exit_code == 1 and "damaged" in r.output and "is not a usable ksearch run store" in r.output, r.output
    assert "--repair cannot rebuild it" in r.output and path.read_bytes() == before
