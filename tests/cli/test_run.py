"""`ksearch run` / `resume` / `runs list` / `show` as a user runs them, in real processes."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from ksearch.records import FinalReport
from ksearch.store.runs import open_run
from tests.conftest import fresh_home
from tests.quick_ksearch import command

# one small workload: these tests are about the processes (json, show, kill, resume, Ctrl-C), not the timing
ARGS = ["run", "selective-scan", "-w", "tiny", "--budget", "4", "--seed", "3"]


def ksearch(*args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "ksearch", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def quick_ksearch(*args, env, timeout=300):
    """``ksearch ARGS`` in a real process, its runs timed by the quick plan (`tests.quick_ksearch`: the runs and
    resumes here cost about a fifth less CPU; every check and paired round of that plan still runs)."""
    return subprocess.run(command(*args), capture_output=True, text=True, env=env, timeout=timeout)


def count(db, sql):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:  # tables not there yet
        return 0
    finally:
        con.close()


def wait_for_evaluations(runs, n: int, timeout_s: float = 240):
    """The run.sqlite of the (only) run under ``runs`` once it holds ``n`` evaluations."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = list(runs.glob("*/run.sqlite")) if runs.exists() else []
        if found and count(found[0], "SELECT COUNT(*) FROM evaluations") >= n:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"the run never reached {n} evaluations")


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, KSEARCH_HOME=str(fresh_home(tmp_path / "home")))
    return e


@pytest.mark.slow
def test_run_json_summary_and_show(env, tmp_path):
    p = quick_ksearch(*ARGS[:-4], "--budget", "3", "--seed", "3", "--json", env=env)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)  # stdout: the JSON alone; the progress went to stderr
    assert "in-search best" in p.stderr and "[  3]" in p.stderr
    assert s["evaluations"] == 3 and s["status"] == "finished"
    assert {"run_id", "evaluations", "best_candidate_id", "workloads"} <= set(s)
    assert [w["name"] for w in s["workloads"]] == ["tiny"]
    for w in s["workloads"]:
        assert {"name", "naive_ms", "best_ms", "reference_ms", "speedup_vs_naive", "speedup_vs_reference",
                "pct_of_floor"} <= set(w)
    # on tiny workloads timing noise on a loaded 2-core machine can leave no candidate above the naive kernel:
    # then there is no best kernel, and the summary must say so consistently
    if s["best_source"] is None:
        assert s["best_candidate_id"] is None
    else:
        text = open(s["best_source"]).read()
        assert text.startswith("/*") or "void run" in text
    listing = json.loads(ksearch("runs", "list", "--json", env=env).stdout)
    assert listing[0]["id"] == s["run_id"] and listing[0]["evaluations"] == 3
    # the run keeps the report it printed: the same record, and the same JSON
    store = open_run(os.path.join(env["KSEARCH_HOME"], "runs", s["run_id"]))  # its directory: another home
    try:
        kept = store.report()
    finally:
        store.close()
    assert kept == FinalReport.model_validate(s) and kept.model_dump(mode="json") == s
    shown = ksearch("show", s["run_id"][:-2], env=env)  # a unique prefix is enough
    assert shown.returncode == 0 and "naive" in shown.stdout
    if s["best_source"] is not None:  # without one the root (the naive kernel) carries the star
        assert "★ best" in shown.stdout


@pytest.mark.slow
def test_sigkill_during_evaluation_then_resume(env, tmp_path):
    proc = subprocess.Popen(command(*ARGS), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    db = wait_for_evaluations(tmp_path / "home" / "runs", 2)
    os.killpg(proc.pid, signal.SIGKILL)  # the controller and anything it started in its group
    proc.wait()
    done = count(db, "SELECT COUNT(*) FROM evaluations")
    assert 2 <= done < 4  # killed within 50 ms of the second: never a whole evaluation later
    p = quick_ksearch("resume", db.parent.name, "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["evaluations"] == 4
    assert count(db, "SELECT COUNT(*) FROM evaluations") == 4
    assert count(db, "SELECT COUNT(DISTINCT candidate_id) FROM evaluations") == 4
    # the killed run's judge directories were cleaned up by the next run
    from ksearch.eval.casedata import shared_base

    assert not list(shared_base().glob(f"ksearch-*-{proc.pid}-*"))
    assert ksearch("resume", db.parent.name, env=env).returncode == 0  # finished runs resume to their summary


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_cleanly(sig, code, env, tmp_path):
    """Ctrl-C, and SIGTERM (``kill``, ``timeout``, a container stopping) the same way: the run marked interrupted,
    the resume line, no traceback; exit 130 or 143 (128 + the signal); the run resumes to its end."""
    proc = subprocess.Popen(command(*ARGS), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,  # SIGINT at its default, as from a terminal
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    db = wait_for_evaluations(tmp_path / "home" / "runs", 1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "interrupted after" in err and "ksearch resume" in err and "Traceback" not in err
    listing = json.loads(ksearch("runs", "list", "--json", env=env).stdout)
    assert listing[0]["status"] == "interrupted"
    if sig == signal.SIGTERM:  # nothing committed was lost: the run goes on to its budget
        p = quick_ksearch("resume", db.parent.name, "--json", env=env)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["evaluations"] == 4


@pytest.mark.parametrize("message, code", [("Error serializing to JSON: KeyboardInterrupt: ", 130),
                                           ("Error serializing to JSON: ValueError: bad", None)])
def test_ctrl_c_inside_pydantics_serializer_is_a_ctrl_c(message, code, tmp_path, monkeypatch, capsys):
    """A SIGINT landing while pydantic serializes the tree (its Rust core) surfaces as a PydanticSerializationError
    naming KeyboardInterrupt (seen under load, in the controller's dispatch of a kernel): the run stops as on any
    Ctrl-C (exit 130, resumable, no traceback); any other serialization error is not swallowed."""
    from pydantic_core import PydanticSerializationError

    from ksearch.run.controller import Controller
    from tests.conftest import fresh_home, ksearch_main

    def dispatch(self, *a, **kw):
        raise PydanticSerializationError(message)

    monkeypatch.setattr(Controller, "_start_one", dispatch)  # a step inside Controller.run, as the real one was
    args = ["run", "selective-scan", "--target", "null", "-w", "tiny", "--budget", "2"]
    env = {"KSEARCH_HOME": str(fresh_home(tmp_path / "home"))}
    if code is None:
        with pytest.raises(PydanticSerializationError):
            ksearch_main(args, capsys, monkeypatch, env)
        return
    got, _, err = ksearch_main(args, capsys, monkeypatch, env)
    assert got == code and "ksearch resume" in err and "Traceback" not in err


def test_an_ablation_run_ctrl_c_inside_pydantics_serializer_is_interrupted_not_failed(tmp_path, monkeypatch):
    """The same wrapped Ctrl-C in a run of `ksearch ablate`/`compare` (`ksearch.run.ablate.execute`, which reports
    any other exception as a failed run and goes on): the run is marked interrupted and the Ctrl-C goes up."""
    from pydantic_core import PydanticSerializationError

    from ksearch.run import ablate
    from ksearch.run.controller import Controller, RunConfig
    from tests.conftest import fresh_home

    def dispatch(self, *a, **kw):
        raise PydanticSerializationError("Error serializing to JSON: KeyboardInterrupt: ")

    monkeypatch.setattr(Controller, "_start_one", dispatch)
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    events: list[dict] = []
    job = ablate.Job(label="a", config=RunConfig(task="selective-scan", target="null", workloads=["tiny"], budget=2))
    with pytest.raises(KeyboardInterrupt):
        ablate.execute(job, events.append)
    ended = [e for e in events if e["kind"] == "ended"]
    assert [e["status"] for e in ended] == ["interrupted"]
    assert ablate.run_state(ended[0]["run_id"]) == ("interrupted", False)


def test_eta_is_evaluations_left_times_the_recent_time_per_evaluation():
    from ksearch.cli.run_cmd import eta_s

    steps = [(0.0, 0), (100.0, 1), (110.0, 2), (120.0, 3)]  # a slow first step, then 10 s each
    assert eta_s(steps, 10, recent=2) == 100.0
    assert eta_s(steps, 10) == 400.0  # over all three steps: 120 s / 3
    assert eta_s(steps, 10, time_left_s=30.0, recent=2) == 30.0  # the time limit comes first
    assert eta_s(steps[:1], 10) is None and eta_s(steps, 0) is None


def test_a_back_off_reason_is_printed_whole():
    from ksearch.cli.run_cmd import step_lines
    from ksearch.records import Evaluation, Status
    from ksearch.run.controller import StepReport
    from ksearch.search.strategy import Decision

    reason = ("backoff: branch 'chunked-parallel-scan (a very long family title)' stagnated 5 evals; switching to "
              "'register-state'; n9 'x': ranking 7.000 (rating 7, confidence 0.5, difficulty 2, depth 2)")
    ev = Evaluation(candidate_id="c", task="t", target="cpu", status=Status.PASSED)
    r = StepReport(seq=7, node_id="n9", label="x", decision=Decision(node_id="n9", reason=reason, score=7.0,
                                                                      backoff=True),
                   evaluation=ev, score=1.5, node_status="solved", reused=False)
    lines = step_lines(r)
    assert len(lines) == 2 and "switching to 'register-state'" in lines[1] and "(a very long family title)" in lines[1]
    r.decision = Decision(node_id="n9", reason="ranked first; n9 'x': ranking 7.000", score=7.0)
    (line,) = step_lines(r)
    assert "ranked first" in line and "ranking 7.000" not in line
