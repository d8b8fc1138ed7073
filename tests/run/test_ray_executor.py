"""The Ray executor on a real local Ray cluster (issue 21; no mocks of Ray): a run with two workers judges every
kernel once; a Ray worker process killed mid-evaluation has its candidate judged again and the run completes;
the controller killed with kill -9 while evaluations are in flight, then `ksearch resume`, loses and repeats
nothing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from ksearch.records import Status
from ksearch.run.controller import RunConfig

from tests.conftest import fresh_home
from tests.quick_ksearch import command
from tests.run.test_executor import REAL, SlowNthProposer, real_controller

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers need two CPUs")]

RAY = REAL.model_copy(update={"executor": "ray", "budget": 5})


def test_two_ray_workers_judge_each_kernel_once_and_a_killed_worker_process_is_replaced(tmp_path):
    c, judge = real_controller(tmp_path, RAY)
    c.proposer = proposer = SlowNthProposer(c.task, "cpu", None)
    c.start()
    killed: list[tuple[str, int]] = []

    def kill_a_busy_worker():
        pool = c._executor
        busy = [s for s in pool.states() if s.job is not None and s.job.candidate.id == proposer.slow
                and not s.stage.startswith((s.job.node_id + ":", "static checks", "compile"))]
        if busy and not killed:
            pid = pool.pids()[busy[0].name]
            killed.append((busy[0].job.candidate.id, pid))
            os.kill(pid, signal.SIGKILL)  # the actor's own process, as the OOM killer or a lost node would

    c.on_tick = kill_a_busy_worker
    try:
        c.run()
        pids = dict(c._executor.pids())
    finally:
        c.close()
        judge.close()
    assert not ray.is_initialized()  # the pool stopped the cluster it started
    assert c.evaluations == RAY.budget
    ids = [e.candidate_id for _, _, e in c.store.evaluations()]
    assert len(ids) == len(set(ids)) == RAY.budget
    assert killed, "the worker timing the slow kernel was never seen"
    cand, pid = killed[0]
    assert cand == proposer.slow
    assert pid not in pids.values()  # replaced by a new actor
    assert [(f["candidate_id"], f["outcome"]) for f in c.store.faults()] == [(cand, "requeued")]
    assert c.store.evaluation_of(cand).status is Status.PASSED
    assert not c.tree.in_flight


def _state(db) -> tuple[int, dict]:
    con = sqlite3.connect(db)
    try:
        n = con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
        row = con.execute("SELECT tree_json FROM snapshots ORDER BY seq DESC LIMIT 1").fetchone()
        return n, (json.loads(row[0]).get("in_flight", {}) if row else {})
    except sqlite3.OperationalError:  # tables not there yet
        return 0, {}
    finally:
        con.close()


def test_kill_9_of_the_controller_with_evaluations_in_flight_then_resume_loses_and_repeats_nothing(tmp_path):
    env = dict(os.environ, KSEARCH_HOME=str(fresh_home(tmp_path / "home")))
    # the ksearch command with the quick timing plan (tests/quick_ksearch.py: the test is about the processes)
    args = command("run", "selective-scan", "-w", "tiny", "--budget", "6", "--workers", "2", "--executor", "ray")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = tmp_path / "home" / "runs"
    deadline, db, in_flight = time.monotonic() + 240, None, {}
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(runs.glob("*/run.sqlite")) if runs.exists() else []
        if found:
            db = found[0]
            done, in_flight = _state(db)
            if done >= 1 and in_flight:
                break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the controller, its Ray cluster and its workers
    proc.wait()
    assert db is not None and in_flight, "the run never had an evaluation committed and others in flight"
    done, in_flight = _state(db)
    assert 1 <= done < 6 and in_flight
    p = subprocess.run(command("resume", db.parent.name, "--json"), env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["evaluations"] == 6
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT node_id, candidate_id FROM evaluations ORDER BY seq").fetchall()
    finally:
        con.close()
    ids = [cid for _, cid in rows]
    assert len(ids) == len(set(ids)) == 6  # nothing judged twice
    assert set(in_flight.values()) <= set(ids)  # what was in flight was judged after the resume, not lost
    assert {n for n, _ in rows[done:]} >= set(in_flight)


def test_ray_settings_are_saved_with_the_run():
    cfg = RunConfig(task="selective-scan", executor="ray", workers=3, ray_address="auto")
    assert RunConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
