"""Tests for ksearch.run.session: where runs are created, what a failed start leaves, resume and the lock."""

import fcntl
import json
import shutil

import pytest

from ksearch.errors import KsearchError, StoreError
from ksearch.records import Status
from ksearch.run.controller import RunConfig
from ksearch.run.session import Session
from ksearch.store.db import Store
from ksearch.store.runs import run_dir, runs_dir
from ksearch.tasks.loader import _BUILTIN_ROOT

from tests.conftest import fresh_home


def test_a_task_given_by_path_runs_under_ksearch_home_and_resumes_from_anywhere(tmp_path, monkeypatch):
    shutil.copytree(str(_BUILTIN_ROOT / "selective-scan"), tmp_path / "my task")
    monkeypatch.chdir(tmp_path)
    with Session.create(RunConfig(task="my task/", workloads=["tiny"], budget=1)) as s:
        run_id, directory = s.run_id, s.dir
    assert directory.parent == runs_dir() and run_id.startswith("selective-scan-")  # named after the definition
    monkeypatch.chdir("/")
    with Session.resume(run_id) as s:
        assert s.cfg.task == str(tmp_path / "my task") and s.task.name == "selective-scan"


def test_a_run_that_cannot_start_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    shutil.copytree(str(_BUILTIN_ROOT / "selective-scan"), tmp_path / "no-naive")
    (tmp_path / "no-naive" / "naive.cpu.c").unlink()  # was a KeyError traceback
    for bad, match in (({"target": "nope"}, "unknown target"), ({"workloads": ["nope"]}, "no workload"),
                       ({"task": "no-such-task"}, "no task"), ({"task": str(tmp_path / "no-naive")}, "no naive kernel")):
        with pytest.raises(KsearchError, match=match):
            Session.create(RunConfig(**{"task": "selective-scan", **bad}))
    assert list(runs_dir().iterdir()) == []


def _stored_run(run_id: str, config: dict) -> None:
    s = Store(run_dir(run_id) / "run.sqlite", create=True)
    s.create_run(run_id, "selective-scan", "cpu", config, {}, None)
    s.close()


def test_resume_of_a_run_another_process_holds_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    _stored_run("r1", RunConfig(task="selective-scan", budget=5).model_dump(mode="json"))
    held = open(run_dir("r1") / "lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(StoreError, match="being worked on by another ksearch process"):
            Session.resume("r1", budget=20)
    finally:
        held.close()
    s = Store(run_dir("r1") / "run.sqlite")
    assert s.run()["config"]["budget"] == 5  # the refused resume did not raise the budget under the other process
    s.close()


def test_resume_of_a_run_whose_configuration_does_not_decode_is_a_store_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    _stored_run("r2", {"task": 5, "budget": "many"})
    with pytest.raises(StoreError, match="run configuration that does not decode"):
        Session.resume("r2")
    assert json.loads(json.dumps(Store(run_dir("r2") / "run.sqlite").run()["config"]))["budget"] == "many"


def test_reference_timings_skip_a_baseline_that_does_not_load_and_keep_one_that_fails_on_a_workload():
    # was: a baseline raising TaskError (or anything but BaselineUnavailable) ended the final stage, so the run's
    # naive / best / hidden measurements were lost and every resume failed the same way
    import dataclasses

    from ksearch.run.session import reference_timings
    from ksearch.tasks import load_task

    task = load_task("selective-scan")
    real = task.baseline_sources["numpy-token-loop"]
    fails = real + "\n\ndef prepare(**inputs):\n    raise RuntimeError('CUDA out of memory')\n"
    said: list[str] = []
    task = dataclasses.replace(task, baseline_sources={"broken": "1 / 0\n", "fails": fails, "ok": real})
    name, reference, notes = reference_timings(task, ["tiny"], 0, said.append)
    assert name == "fails" and reference["tiny"].status is Status.RUNTIME_ERROR, reference
    assert any(n.startswith("baseline broken skipped") for n in notes)  # the summary says why, not only progress
    assert any(n.startswith("baseline fails on tiny: RUNTIME_ERROR") and "out of memory" in n for n in notes), notes
    assert any("broken skipped" in s and "ZeroDivisionError" in s for s in said), said


def test_reference_timings_say_a_baseline_for_other_targets_only_where_none_runs():
    """attention's mlx-sdpa comes first and is meant for MLX runs: a cpu run times the next baseline without a
    note about it; where no baseline runs at all, the summary says why each was skipped."""
    import dataclasses

    from ksearch.run.session import reference_timings
    from ksearch.tasks import load_task

    task = load_task("selective-scan")
    real = task.baseline_sources["numpy-token-loop"]
    other = "raise BaselineNotForTarget(f'for MLX runs only, not {TARGET}')\n"
    runs = dataclasses.replace(task, baseline_sources={"mlx-only": other, "ok": real})
    name, _, notes = reference_timings(runs, ["tiny"], 0, lambda m: None)
    assert name == "ok" and notes == []
    alone = dataclasses.replace(task, baseline_sources={"mlx-only": other})
    name, _, notes = reference_timings(alone, ["tiny"], 0, lambda m: None)
    assert name is None and notes == ["baseline mlx-only skipped: for MLX runs only, not cpu"]


def test_the_best_kernel_is_written_before_the_final_measurements(tmp_path, monkeypatch):
    """A run killed during the final stage (minutes on big workloads; an H200 decode run's timeout cut it there and
    best/ was missing) still has best/ with the kernel and its candidate.json."""
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    with Session.create(RunConfig(task="selective-scan", workloads=["tiny"], budget=1)) as s:
        s.controller.start()
        s.controller.run(lambda r: None)
        node = next(n for n in s.controller.tree.nodes if n.candidate_id and n.id != "root")
        cand = s.store.candidate(node.candidate_id)   # the best, whatever it measured (tiny timings are noise)
        monkeypatch.setattr(s.controller, "best", lambda: (node.id, cand, s.store.evaluation_of(cand.id)))

        def killed(best):
            raise KeyboardInterrupt
        monkeypatch.setattr(s, "_final_measurements", killed)
        with pytest.raises(KeyboardInterrupt):
            s.finish()
        best = json.loads((s.dir / "best" / "candidate.json").read_text())
        assert best == json.loads(cand.model_dump_json())
        assert (s.dir / "best" / next(iter(best["sources"]))).read_text() == next(iter(best["sources"].values()))
