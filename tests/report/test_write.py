"""`ksearch.report.html.write_html`: where ``-o`` cannot take a page, one error and nothing replaced or left behind
(a device or a FIFO was renamed over: ``-o /dev/full`` as root replaced the device with the page)."""

from __future__ import annotations

import os

import pytest

from ksearch.errors import ReportError
from ksearch.report.html import write_html


def test_a_page_is_written_whole_and_rewritten(tmp_path):
    out = tmp_path / "missing" / "r.html"
    write_html(out, "one")
    write_html(out, "two")
    assert out.read_text() == "two" and os.listdir(out.parent) == ["r.html"]


def test_a_directory_or_a_fifo_is_refused_and_left_as_it_was(tmp_path):
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    with pytest.raises(ReportError, match="is a directory"):
        write_html(tmp_path, "page")
    with pytest.raises(ReportError, match="not a regular file"):
        write_html(fifo, "page")
    assert fifo.is_fifo() and sorted(os.listdir(tmp_path)) == ["pipe.html"]


def test_a_store_whose_pages_do_not_read_is_a_store_error_not_a_traceback(tmp_path):
    # bytes overwritten on disk: a snapshot whose text is not UTF-8 was sqlite3.OperationalError out of the report
    import sqlite3

    from ksearch.errors import StoreError
    from ksearch.records import Candidate, Evaluation, Status
    from ksearch.report.html import render_run
    from ksearch.store.db import Store

    path = tmp_path / "run" / "run.sqlite"
    path.parent.mkdir()
    s = Store(path, create=True)
    s.create_run("r1", "t", "null", {}, {}, None)
    c = Candidate(target="null", sources={"k.py": "x"})
    s.record_step(c, Evaluation(candidate_id=c.id, task="t", target="null", status=Status.PASSED), 1.0,
                  '{"nodes": []}', "{}", None)
    s.close()
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE snapshots SET tree_json = CAST(x'7b22ff' AS TEXT)")
    con.close()
    s = Store(path, readonly=True)
    try:
        with pytest.raises(StoreError, match=r"run.sqlite cannot be drawn: it does not read .* runs check .*--repair"):
            render_run(s)
    finally:
        s.close()


def test_a_killed_run_is_drawn_stopped_and_a_held_one_running(tmp_path):
    # kill -9 leaves the stored status 'running': `runs list` said stopped, the page and `show` said running
    import fcntl

    from ksearch.report.html_data import run_data
    from ksearch.store.db import Store

    path = tmp_path / "run" / "run.sqlite"
    path.parent.mkdir()
    s = Store(path, create=True)
    s.create_run("r1", "t", "null", {"task": "t", "target": "null"}, {}, None)
    try:
        assert s.run()["status"] == "running" and run_data(s)["run"]["status"] == "stopped"
        from typer.testing import CliRunner

        from ksearch.cli import app

        r = CliRunner().invoke(app, ["show", str(path.parent), "--json"])
        assert r.exit_code == 0 and '"status": "stopped"' in r.output, r.output  # `ksearch show` too
        with open(path.parent / "lock", "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # a process works on it
            assert run_data(s)["run"]["status"] == "running"
    finally:
        s.close()


def test_live_on_a_comparison_says_what_it_is_not_no_run(tmp_path, monkeypatch):
    import types

    from typer.testing import CliRunner

    from ksearch.cli import app
    from ksearch.run import ablate

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    monkeypatch.setattr(ablate, "load", lambda ident: types.SimpleNamespace(variants=["worldmodel-0"]))
    r = CliRunner().invoke(app, ["report", "cmp-1", "--live"])
    assert r.exit_code != 0 and "cmp-1 is a comparison: --live watches one run" in str(r.exception), r.output


def test_a_write_that_fails_names_the_page_and_leaves_nothing(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write on a full disk: no file named

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as e:
        write_html(tmp_path / "r.html", "page")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "r.html")
    assert os.listdir(tmp_path) == []


def test_live_every_is_bounded(tmp_path, monkeypatch):
    # --every inf reached the page's setTimeout as int(inf): an OverflowError traceback
    from typer.testing import CliRunner

    from ksearch.cli import app

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    for every in ("inf", "1e308"):
        r = CliRunner().invoke(app, ["report", "r", "--live", "--every", every])
        assert r.exit_code == 2 and "Invalid value for '--every'" in r.output, r.output  # a usage error
