"""`ksearch ablate` (ksearch.run.ablate, ksearch.run.ablate_results): one ordinary run per context level on the cpu
target, answered by the scripted model stand-in of tests/e2e, at budget 1 on the smallest workload (tiny)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.llm.base import LLMCall, Message, Usage
from ksearch.records import Candidate, Evaluation, Paired, Status, WorkloadResult
from ksearch.run import ablate, ablate_results
from ksearch.run.controller import RunConfig, summarize
from ksearch.search.edits import Insert, apply
from ksearch.search.strategy import SearchState
from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Tree, attach
from ksearch.store.db import Store
from ksearch.store.runs import list_runs, open_run, run_dir
from tests.conftest import fresh_home
from tests.e2e.responder import NAIVE, Responder

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
BASE = ["ablate", "selective-scan", "-w", "tiny", "--budget", "1"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    monkeypatch.setenv("KSEARCH_BUSY_WAIT_S", "0")  # runs of one ablation side by side: time, do not wait
    monkeypatch.chdir(ROOT)  # `python -m tests.e2e.responder`
    return tmp_path / "home"


@pytest.fixture
def quick_timing(monkeypatch):
    """The ablation's runs and its re-time timed with the quick plan (`tests.targets.test_null.QUICK`, kept in each
    run's config: ablate's runs are built by ablate_cmd), each worker's clock calibrated with 4 pings, not 24 (as
    tests/e2e does): these tests are about the runs, their configs and the table's plumbing, not the figures (the
    default plan's minimum time per kernel and repeats were about a third of each test)."""
    from tests.quick_ksearch import use_quick_timing

    use_quick_timing(monkeypatch.setattr)


def _command(tmp_path) -> list[str]:
    return ["--command", f"{sys.executable} -m tests.e2e.responder {tmp_path / 'state.json'}"]


def _answer(queue: Path, respond: Responder, stop: threading.Event) -> None:
    """An agent answering every run's prompts under ``queue`` (one directory per run), each reply atomically."""
    while not stop.is_set():
        for p in sorted(queue.glob("*/*.json")):
            reply = p.with_name(p.name[:-len(".json")] + ".reply.md")
            if reply.exists() or not p.with_name(p.name[:-5] + ".prompt.md").exists():
                continue
            tmp = reply.with_name("." + reply.name)
            tmp.write_text(respond(json.loads(p.read_text())["messages"]))
            tmp.rename(reply)
        stop.wait(0.02)


def _manifest(home: Path) -> ablate.Ablation:
    (d,) = (home / "ablations").iterdir()
    return ablate.Ablation.model_validate_json((d / "ablation.json").read_text())


def _config(run_id: str) -> RunConfig:
    store = open_run(run_id)
    try:
        return RunConfig.model_validate(store.run()["config"])
    finally:
        store.close()


@pytest.mark.slow
def test_one_run_per_level_with_the_same_config_but_the_context_and_a_queue_directory_each(home, quick_timing, tmp_path,
                                                                                           monkeypatch):
    from ksearch.llm import backends

    init = backends.QueueBackend.__init__  # a 0.05 s poll instead of 0.5 s, as tests/e2e does
    monkeypatch.setattr(backends.QueueBackend, "__init__",
                        lambda self, directory, **kw: init(self, directory, **{"poll_s": 0.05, **kw}))
    queue, stop = tmp_path / "queue", threading.Event()
    t = threading.Thread(target=_answer, args=(queue, Responder(tmp_path / "state.json"), stop), daemon=True)
    t.start()
    try:
        r = runner.invoke(app, BASE + ["--contexts", "none,full", "--offline", "--queue-dir", str(queue),
                                       "--seed", "7", "-o", str(tmp_path / "out" / "ablation.md")])
    finally:
        stop.set()
        t.join(5)
    assert r.exit_code == 0, r.output
    # before starting, where each run's prompts will appear
    assert f"prompts in {queue / 'none'}/" in r.output and f"prompts in {queue / 'full'}/" in r.output
    ab = _manifest(home)
    assert [x.label for x in ab.runs] == ["none", "full", "offline"] and all(x.run_id for x in ab.runs)
    configs = {x.label: _config(x.run_id) for x in ab.runs}
    for label in ("none", "full"):  # the llm runs: the same but for the context and its queue directory
        cfg = configs[label]
        assert cfg.proposer == "llm" and cfg.llm.context == label and cfg.llm.queue_dir == str(queue / label)
        assert cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"context": "full", "queue_dir": "q"})}) == \
            configs["none"].model_copy(update={"llm": configs["none"].llm.model_copy(
                update={"context": "full", "queue_dir": "q"})})
        assert sorted(p.name.split("-", 1)[1] for p in (queue / label).glob("*.prompt.md"))  # its prompts there
    offline = configs["offline"]
    assert offline.proposer == "patterns" and offline.llm is None
    assert offline.model_dump(exclude={"proposer", "llm"}) == configs["none"].model_dump(exclude={"proposer", "llm"})
    assert offline.seed == 7 and offline.budget == 1 and offline.workloads == ["tiny"]
    listed = {row["id"]: row for row in list_runs()}  # ordinary runs
    assert all(listed[x.run_id]["status"] == "finished" for x in ab.runs)
    # the table, and its files with how and where it was measured
    for label in ("none", "full", "offline"):
        assert label in r.output
    md = (tmp_path / "out" / "ablation.md").read_text()
    result = json.loads((tmp_path / "out" / "ablation.json").read_text())
    assert [row["label"] for row in result["rows"]] == ["none", "full", "offline"]
    assert all(row["evaluations"] == 1 and row["vs_naive"] for row in result["rows"])
    assert result["rows"][0]["llm_calls"] > 0 and result["rows"][0]["tokens_estimated"]
    assert result["rows"][2]["llm_calls"] == 0
    assert result["reference_name"] == "numpy-token-loop" and result["bench_workloads"] == ["tiny"]
    for key in ("- date:", "- command:", "- machine:", "- versions:", "- load:", "| context | run id |"):
        assert key in md
    assert result["machine"]["cpu"] and result["versions"]["ksearch"]
    assert ab.results == str(tmp_path / "out" / "ablation.json")


@pytest.mark.slow
def test_resume_finishes_an_interrupted_run_and_does_not_start_a_finished_one(home, quick_timing, tmp_path, monkeypatch):
    from ksearch.run import controller as controller_mod
    from ksearch.run.session import Session

    real_run = controller_mod.Controller.run

    def ctrl_c_in_the_offline_run(self, *a, **kw):
        if self.cfg.proposer == "patterns":
            raise KeyboardInterrupt
        return real_run(self, *a, **kw)

    monkeypatch.setattr(controller_mod.Controller, "run", ctrl_c_in_the_offline_run)
    r = runner.invoke(app, BASE + ["--contexts", "none", "--offline", "--name", "abl"] + _command(tmp_path))
    assert r.exit_code == 130, r.output
    assert "ksearch ablate --resume abl" in r.output
    ab = ablate.load("abl")
    none, offline = ab.run("none"), ab.run("offline")
    assert none.status == "finished" and offline.status == "interrupted" and offline.run_id
    assert open_run(offline.run_id).run()["status"] == "interrupted"
    before = open_run(none.run_id).evaluation_count()

    monkeypatch.setattr(controller_mod.Controller, "run", real_run)
    started, resumed = [], []
    create, resume = Session.create.__func__, Session.resume.__func__
    monkeypatch.setattr(Session, "create", classmethod(lambda cls, cfg, *a, **kw: started.append(cfg) or
                                                       create(cls, cfg, *a, **kw)))
    monkeypatch.setattr(Session, "resume", classmethod(lambda cls, run, *a, **kw: resumed.append(run) or
                                                       resume(cls, run, *a, **kw)))
    r = runner.invoke(app, ["ablate", "--resume", "abl"])
    assert r.exit_code == 0, r.output
    assert started == [] and resumed == [offline.run_id]  # the finished run is not started or resumed again
    assert open_run(none.run_id).evaluation_count() == before
    ab = ablate.load("abl")
    assert [x.run_id for x in ab.runs] == [none.run_id, offline.run_id]
    assert open_run(offline.run_id).run()["status"] == "finished"
    # the same --name again: nothing left to run, the recorded table is printed (no re-time)
    monkeypatch.setattr(ablate_results, "retime", lambda *a, **kw: pytest.fail("re-timed again"))
    r = runner.invoke(app, BASE + ["--contexts", "none", "--offline", "--name", "abl"] + _command(tmp_path))
    assert r.exit_code == 0, r.output
    assert started == [] and resumed == [offline.run_id] and "offline" in r.output
    # ... but with other settings it is refused
    r = runner.invoke(app, BASE + ["--contexts", "full", "--name", "abl"] + _command(tmp_path))
    assert r.exit_code == 2 and "exists with other settings" in r.output


@pytest.mark.slow
def test_a_run_that_fails_to_start_is_reported_and_the_others_go_on(home, quick_timing, tmp_path, monkeypatch):
    from ksearch.errors import ConfigError
    from ksearch.run.session import Session

    create = Session.create.__func__

    def refuse_the_llm_run(cls, cfg, *a, **kw):
        if cfg.proposer == "llm":
            raise ConfigError("command backend: no such program 'my-agent'")
        return create(cls, cfg, *a, **kw)

    monkeypatch.setattr(Session, "create", classmethod(refuse_the_llm_run))
    r = runner.invoke(app, BASE + ["--contexts", "none", "--offline", "--name", "f"] + _command(tmp_path))
    assert r.exit_code == 3, r.output
    assert "no such program 'my-agent'" in r.output and "ksearch ablate --resume f" in r.output
    ab = ablate.load("f")
    assert ab.run("none").run_id is None and ab.run("none").status == "failed"
    assert ab.run("offline").status == "finished"
    result = json.loads((home / "ablations" / "f" / "results.json").read_text())
    assert result["rows"][0]["run_id"] is None and "my-agent" in result["rows"][0]["error"]
    assert result["rows"][1]["vs_naive"]


@pytest.mark.parametrize("contexts, words", [("none,bogus", "unknown context level 'bogus'"),
                                             ("full,full", "names full more than once")])
def test_an_unknown_or_repeated_level_is_one_line_error(home, tmp_path, contexts, words):
    r = runner.invoke(app, BASE + ["--contexts", contexts] + _command(tmp_path))
    assert r.exit_code == 2
    assert words in r.output and len(r.output.strip().splitlines()) == 1
    assert not (home / "ablations").exists() or not list((home / "ablations").iterdir())


def test_evaluations_to_reach_95_percent_of_the_final_best():
    reach = ablate_results.evaluations_to_reach
    assert reach([1.2, None, 3.0, 3.9, 4.0], 4.0) == 4  # 3.9 >= 0.95 * 4.0 = 3.8; 3.0 is not
    assert reach([None, 2.0], 2.0) == 2
    assert reach([0.5, 1.0], 1.02) == 0  # the naive kernel (1.0) is already within 5% of the best
    assert reach([], None) is None and reach([None], None) is None


def _step(store: Store, tree: Tree, node_id: str, cand: Candidate, status: Status, speedup: float | None):
    ws = [WorkloadResult(workload="small-b2", status=status, median_ms=0.1 / speedup if speedup else None,
                         speedup_vs_naive=speedup)]
    ev = Evaluation(candidate_id=cand.id, task="selective-scan", target="cpu", status=status, workloads=ws,
                    paired=[Paired(role="best", candidate_id="x", ratio=speedup, lo=speedup * 0.9,
                                   hi=speedup * 1.1, verdict="faster")] if speedup else [])
    summary = summarize(ev)
    tree = attach(tree, node_id, cand.id, summary)
    store.record_step(cand.model_copy(update={"node_id": node_id}), ev, summary.score, tree.model_dump_json(),
                      SearchState().model_dump_json(), None)
    return tree


def test_the_table_comes_from_the_store_and_one_re_time(home, monkeypatch):
    """A run written by hand: four evaluations scoring 1.5, (failed), 2.9, 3.0; three llm calls, one replayed, one
    estimated, one unpriced. Its row: 3 evaluations to 95% of 3.0, 2 calls paid for, ~ tokens, the priced cost;
    its best kernel (a copy of the naive kernel) re-timed beside the naive kernel in one session."""
    cfg = RunConfig(task="selective-scan", workloads=["small-b2"], budget=4, proposer="llm",
                    llm={"backend": "queue", "queue_dir": str(home / "q")})
    run_id = "selective-scan-by-hand"
    store = Store(run_dir(run_id) / "run.sqlite", create=True)
    try:
        store.create_run(run_id, "selective-scan", "cpu", cfg.model_dump(mode="json"), {}, None)
        tree = attach(Tree.new(), ROOT_ID, "naive", EvalSummary(status="PASSED", score=1.0))
        tree, results = apply(tree, [Insert(parent_id=ROOT_ID, id=f"k{i}", decision="d", choice=f"c{i}",
                                            action=Action(title=f"t{i}", description="x")) for i in range(4)])
        assert all(x.ok for x in results)
        kernels = [Candidate(target="cpu", sources={"kernel.c": f"/* {i} */\n{NAIVE}"}) for i in range(4)]
        for i, (status, up) in enumerate([(Status.PASSED, 1.5), (Status.COMPILE_ERROR, None),
                                          (Status.PASSED, 2.9), (Status.PASSED, 3.0)]):
            tree = _step(store, tree, f"k{i}", kernels[i], status, up)
        for tokens, estimated, cost, replayed in [((1000, 200), True, None, False), ((500, 100), False, 0.25, False),
                                                  ((1000, 200), False, 0.5, True)]:
            store.record_llm_call(LLMCall(role="planner", purpose="plan:initial", backend="queue", model="m",
                                          messages=[Message(role="user", content="q")], prompt_hash="h", reply="r",
                                          usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1]),
                                          usage_estimated=estimated, cost_usd=cost, replayed=replayed))
        store.set_status("finished")
    finally:
        store.close()
    ab = ablate.new_ablation(cfg, ["full"], False, "by-hand")
    ab.run("full").run_id = run_id
    row, best = ablate_results.row_from_store("full", run_id)
    assert best.id == kernels[3].id and row.best_node_id == "k3" and row.best_score == pytest.approx(3.0)
    assert row.evaluations == 4 and row.evaluations_to_95 == 3
    assert row.llm_calls == 2 and row.replayed_calls == 1 and row.tokens_estimated
    assert (row.input_tokens, row.output_tokens) == (1500, 300)
    assert row.cost_usd == pytest.approx(0.25) and row.cost_partial
    result = ablate_results.results(ab)
    (row,) = result.rows
    assert row.retime_status == "PASSED" and row.vs_naive is not None and row.vs_naive_lo is not None
    assert row.workloads[0].workload == "small-b2" and row.workloads[0].naive_ms and row.workloads[0].best_ms
    assert row.vs_reference == pytest.approx(row.workloads[0].reference_ms / row.workloads[0].best_ms)
    assert row.pct_of_floor == pytest.approx(row.workloads[0].pct_of_floor)
    from ksearch.report.ablation import ablation_markdown, cells

    assert cells(row)[6] == "3" and cells(row)[8] == "~1,800" and cells(row)[9] == "0.25+"
    assert f"| full | {run_id} | 4 |" in ablation_markdown(result)


@pytest.mark.slow
def test_jobs_run_at_once_each_in_its_own_process_and_ctrl_c_stops_them_all(home, tmp_path):
    queue = tmp_path / "queue"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "ksearch", *BASE, "--contexts", "none,full", "--jobs", "2",
                             "--queue-dir", str(queue), "--name", "par"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not all((queue / x / "0001-plan-initial.prompt.md").exists() for x in ("none", "full")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        # both runs wait for their first answer at once, each in its own directory
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "ksearch ablate --resume par" in err and "Traceback" not in err
    ab = ablate.load("par")
    assert all(x.run_id and x.status == "interrupted" for x in ab.runs)
    assert {open_run(x.run_id).run()["status"] for x in ab.runs} == {"interrupted"}
