"""`ksearch run` / `resume` / `runs list` / `show` against their storage (issue 25): a full disk (a small tmpfs
this test mounts, where the machine lets it) stops a run with one line and exit 3 and resume finishes it; a run
that cannot start leaves no directory behind; a read-only home still lists and shows its runs; a bad `final` row
does not break `show`. Runs on the null target with a hand-made spec and quick timing (tests.targets.test_null)."""

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.store.db import Store
from tests.targets.test_null import NULL, SPEC

runner = CliRunner()
RUN = ["run", "selective-scan", "--target", "null", "-w", "tiny"]


@pytest.fixture
def quick(monkeypatch):
    from tests.quick_ksearch import use_quick_timing

    use_quick_timing(monkeypatch.setattr, checks=1)
    monkeypatch.setattr(type(NULL), "hardware_spec", lambda self: SPEC)


def _mount(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine does not let the test mount a tmpfs: {done.stderr.strip() or done.returncode}")


@pytest.fixture
def tmpfs(tmp_path):
    where = tmp_path / "fs"
    _mount(where, "16m")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(where: Path) -> Path:
    """A file that takes every free block of the file system at ``where``."""
    filler = where / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_disk_stops_a_run_with_one_line_and_resume_finishes_it(tmpfs, quick, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmpfs / "home"))
    real = Store.record_step
    filled: list[Path] = []

    def record_then_fill(self, *args, **kwargs):  # the first evaluation committed, then the disk is full
        seq = real(self, *args, **kwargs)
        if not filled:
            filled.append(_fill(tmpfs))
        return seq

    monkeypatch.setattr(Store, "record_step", record_then_fill)
    r = runner.invoke(app, [*RUN, "--budget", "2"])
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    stop = [line for line in r.output.splitlines() if line.startswith("stopped:")]
    assert len(stop) == 1 and ("disk is full" in stop[0] or "No space left" in stop[0]), r.output
    (run_id,) = [p.name for p in (tmpfs / "home" / "runs").iterdir()]
    assert f"ksearch resume {run_id}" in r.output
    assert Store(tmpfs / "home" / "runs" / run_id / "run.sqlite", readonly=True).evaluation_count() == 1
    filled[0].unlink()
    r = runner.invoke(app, ["resume", run_id, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["evaluations"] == 2


def test_a_run_directory_removed_mid_run_stops_it_with_one_line_and_nothing_lost(tmp_path, quick, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    real = Store.record_step
    removed: list[Path] = []

    def record_then_remove(self, *args, **kwargs):
        seq = real(self, *args, **kwargs)
        if not removed:
            removed.append(self.path.parent)
            shutil.rmtree(self.path.parent)
        return seq

    monkeypatch.setattr(Store, "record_step", record_then_remove)
    r = runner.invoke(app, [*RUN, "--budget", "2"])
    assert r.exit_code == 3, r.output
    (stop,) = [line for line in r.output.splitlines() if line.startswith("stopped:")]
    assert "was removed while the run worked on it" in stop and "(1 evaluations) was written back" in stop, stop
    run_id = removed[0].name
    assert f"ksearch resume {run_id}" in stop
    assert Store(removed[0] / "run.sqlite", readonly=True).evaluation_count() == 1
    r = runner.invoke(app, ["resume", run_id, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["evaluations"] == 2


def test_a_run_that_cannot_start_leaves_no_directory(tmp_path, quick, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    task = tmp_path / "task"
    shutil.copytree(Path(__import__("ksearch.tasks", fromlist=["x"]).__file__).parent / "builtin" / "selective-scan",
                    task)
    (task / "naive.null.py").write_text("def run(*args):\n    pass\n")  # its outputs never written: fails its check
    r = runner.invoke(app, ["run", str(task), "--target", "null", "-w", "tiny", "--budget", "2"])
    assert r.exit_code != 0 and "naive kernel does not pass" in str(r.exception), r.output
    runs = tmp_path / "home" / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_a_run_home_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, quick, monkeypatch):
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    _mount(home / "runs", "1m")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(home / "runs")], check=True)
        monkeypatch.setenv("KSEARCH_HOME", str(home))
        r = runner.invoke(app, [*RUN, "--budget", "1"])
        assert r.exit_code != 0 and "Read-only file system" in str(r.exception), r.output
        assert not list((home / "runs").iterdir())
    finally:
        subprocess.run(["umount", "-l", str(home / "runs")], capture_output=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished four-evaluation run (the controller on tests.search's fake judge) in a home of its own, with
    final measurements: (home, run id)."""
    from ksearch.records import Evaluation, FinalMeasurements, Status
    from tests.search.test_controller import make

    home = tmp_path_factory.mktemp("finished") / "home"
    where = home / "runs" / "r-finished"
    where.mkdir(parents=True)
    c = make(where, budget=4)
    c.store.set_config(c.cfg.model_dump(mode="json"))  # as `Session.create` saves it
    c.start()
    c.run()
    naive = Evaluation(candidate_id="naive", task=c.task.name, target="cpu", status=Status.PASSED)
    c.store.put_final(FinalMeasurements(naive=naive))
    c.store.set_status("finished")
    c.close()
    c.store.close()
    return home, where.name


def test_a_read_only_home_still_lists_and_shows_its_runs(finished, tmp_path, monkeypatch):
    home, run_id = finished
    ro = tmp_path / "ro"
    _mount(ro, "16m")
    try:
        shutil.copytree(home / "runs", ro / "runs")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        monkeypatch.setenv("KSEARCH_HOME", str(ro))
        r = runner.invoke(app, ["runs", "list", "--json"])
        assert r.exit_code == 0, r.output
        (row,) = json.loads(r.stdout)
        assert row["id"] == run_id and row["evaluations"] == 4 and row["status"] == "finished"
        r = runner.invoke(app, ["show", run_id])
        assert r.exit_code == 0 and "naive" in r.output, r.output
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


@pytest.mark.parametrize("final", ["{not json", '{"naive": 3}', '{"naive": {"status": "SOMETIMES"}}', "[]"])
def test_a_bad_final_row_does_not_break_show(finished, tmp_path, monkeypatch, final):
    home, run_id = finished
    copy = tmp_path / "runs" / run_id
    shutil.copytree(home / "runs" / run_id, copy)
    con = sqlite3.connect(copy / "run.sqlite")
    con.execute("UPDATE baselines SET result_json = ? WHERE name = 'final'", (final,))
    con.commit()
    con.close()
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    r = runner.invoke(app, ["show", run_id])
    assert r.exit_code == 0, r.output
    assert "final measurements" in r.output and "do not decode" in r.output
    assert runner.invoke(app, ["show", run_id, "--json"]).exit_code == 0


def test_a_bad_final_row_is_measured_again_when_the_run_finishes(finished, tmp_path, monkeypatch):
    import ksearch.run.session as session_mod
    from ksearch.records import Evaluation, FinalMeasurements, Status

    home, run_id = finished
    copy = tmp_path / "runs" / run_id
    shutil.copytree(home / "runs" / run_id, copy)
    con = sqlite3.connect(copy / "run.sqlite")
    con.execute("UPDATE baselines SET result_json = '{\"naive\": 3}' WHERE name = 'final'")
    con.commit()
    con.close()
    monkeypatch.setattr(session_mod, "spec_for_run", lambda target, stored: SPEC)
    again = FinalMeasurements(naive=Evaluation(candidate_id="naive", task="selective-scan", target="cpu",
                                               status=Status.PASSED, message="measured again"))
    monkeypatch.setattr(session_mod.Session, "_final_measurements", lambda self, best: again)
    with session_mod.Session.resume(str(copy)) as s:
        s.controller.start()
        report = s.finish()
        assert s.store.final() == again and report.evaluations == 4
