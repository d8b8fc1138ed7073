import sqlite3

import pytest

from ksearch.errors import StoreError
from ksearch.records import Candidate, Evaluation, Status
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


def test_an_sqlite_file_of_another_program_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (x)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a ksearch run store"):
        Store(path)
    assert path.read_bytes() == before


def _store_with_a_step(path):
    s = Store(path, create=True)
    s.create_run("r1", "t", "cpu", {"task": "t", "budget": 3}, {}, None)
    c = Candidate(target="cpu", sources={"k.c": "x"})
    s.record_step(c, Evaluation(candidate_id=c.id, task="t", target="cpu", status=Status.PASSED), 2.0, "{}", "{}",
                  None)
    s.put_baseline("final", "side-by-side", {"x": 1})
    s.close()
    return c


@pytest.mark.parametrize("damage, read", [
    ("UPDATE evaluations SET evaluation_json = '{not json'", lambda s, c: s.evaluations()),
    ("UPDATE evaluations SET evaluation_json = '{\"status\": \"SOMETIMES\"}'", lambda s, c: s.evaluation_of(c.id)),
    ("UPDATE candidates SET candidate_json = '[]'", lambda s, c: s.candidate(c.id)),
    ("UPDATE runs SET config_json = '[1]'", lambda s, c: s.run()),
    ("UPDATE baselines SET result_json = 'nan nan'", lambda s, c: s.baseline("final")),
    ("SELECT 1", lambda s, c: s.final()),  # {"x": 1}: not the final stage's measurements
    ("INSERT INTO reports VALUES ('final', 'then', '{\"run_id\": \"r1\"}')", lambda s, c: s.report()),
])
def test_reads_of_a_damaged_store_are_store_errors(tmp_path, damage, read):
    c = _store_with_a_step(tmp_path / "r.sqlite")
    con = sqlite3.connect(tmp_path / "r.sqlite")
    con.execute(damage)
    con.commit()
    con.close()
    s = Store(tmp_path / "r.sqlite")
    with pytest.raises(StoreError, match="r.sqlite cannot be read"):
        read(s, c)


def test_a_store_missing_a_table_is_refused(tmp_path):
    _store_with_a_step(tmp_path / "r.sqlite")
    con = sqlite3.connect(tmp_path / "r.sqlite")
    con.execute("DROP TABLE evaluations")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="tables \\['evaluations'\\] are missing"):
        Store(tmp_path / "r.sqlite")


def test_list_runs_newest_first_with_unreadable_and_killed_runs(tmp_path, monkeypatch):
    import fcntl

    from ksearch.store.runs import list_runs, run_dir

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))

    for run_id, created in (("zz-old", "2026-01-01T00:00:00+00:00"), ("aa-new", "2026-02-01T00:00:00+00:00"),
                            ("mm-held", "2026-01-15T00:00:00+00:00")):
        s = Store(run_dir(run_id) / "run.sqlite", create=True)
        s.create_run(run_id, "t", "cpu", {}, {}, None)
        s.db.execute("UPDATE runs SET created_at = ?", (created,))
        s.close()
    run_dir("broken").mkdir()
    (run_dir("broken") / "run.sqlite").write_bytes(b"garbage" * 1000)
    held = open(run_dir("mm-held") / "lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a process working on it
    try:
        listed = list_runs()
    finally:
        held.close()
    rows = {r["id"]: r for r in listed}
    assert [r["id"] for r in listed] == ["aa-new", "mm-held", "zz-old", "broken"]
    assert rows["mm-held"]["status"] == "running"
    assert rows["zz-old"]["status"] == "stopped"  # marked running, but no process holds its lock: killed
    assert rows["broken"]["status"] == "unreadable" and "not a usable" in rows["broken"]["error"]


def _call(h="h1", reply="ok", replayed=False, error=None, cost=0.01, tokens=(100, 20)):
    from ksearch.llm.base import LLMCall, Message, Usage

    return LLMCall(role="planner", purpose="plan:initial", backend="openai", model="m",
                   messages=[Message(role="user", content="q")], prompt_hash=h, reply=None if error else reply,
                   usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1]), cost_usd=cost, error=error,
                   replayed=replayed)


def test_llm_calls_are_kept_replayable_and_summed(tmp_path):
    from ksearch.llm.client import Budget
    from ksearch.proposers.llm.factory import StoreReplay

    s = Store(tmp_path / "r.sqlite", create=True)
    s.create_run("r", "t", "cpu", {}, {}, None)
    s.record_llm_call(_call("h1", "first"))
    s.record_llm_call(_call("h1", "again", replayed=True))  # a replay: not an answer to replay, costs nothing
    s.record_llm_call(_call("h1", error="HTTP 500", cost=None, tokens=(0, 0)))
    s.record_llm_call(_call("h2", "other", cost=None))  # unknown price: tokens count, USD does not
    assert [c.reply for c in s.llm_calls()] == ["first", "again", None, "other"]
    replay = StoreReplay(s)  # a resumed run gets the paid answer once, never the replay or the failure
    assert replay("h1").reply == "first" and replay("h1") is None and replay("nope") is None
    spent = Budget.from_calls(s.llm_calls())  # what a resumed run starts its budget from
    assert spent.spent_usd == pytest.approx(0.01) and spent.spent_tokens == 240


def test_a_store_from_before_the_llm_table_is_migrated(tmp_path):
    import sqlite3

    from ksearch.store import db as dbmod

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    dbmod._m001_initial(old)
    old.execute("INSERT INTO migrations VALUES ('001_initial', 'then')")
    old.close()
    s = Store(path)
    s.record_llm_call(_call())
    assert len(s.llm_calls()) == 1


def _report():
    from ksearch.records import FinalMeasurements, FinalReport, WorkloadResult

    naive = Evaluation(candidate_id="n", task="t", target="cpu", status=Status.PASSED,
                       workloads=[WorkloadResult(workload="w", status=Status.PASSED, median_ms=2.0)])
    best = Evaluation(candidate_id="c", task="t", target="cpu", status=Status.PASSED,
                      workloads=[WorkloadResult(workload="w", status=Status.PASSED, median_ms=0.5)])
    final = FinalMeasurements(best_candidate_id="c", naive=naive, best=best, reference_notes=["a note"])
    run = {"id": "r1", "task": "t", "target": "cpu", "status": "finished"}
    return final, FinalReport.build(run, 3, "n1", final, "/k.c")


def test_the_final_measurements_and_report_are_kept_as_made(tmp_path):
    s = Store(tmp_path / "r.sqlite", create=True)
    s.create_run("r1", "t", "cpu", {}, {}, None)
    assert s.final() is None and s.report() is None
    final, report = _report()
    s.put_final(final)
    s.put_report(report)
    s.put_report(report)  # a second finish replaces the first's
    s.close()
    again = Store(tmp_path / "r.sqlite")
    assert again.final() == final and again.report() == report
    assert again.baseline("final") == final.model_dump(mode="json")  # what `ksearch show --json` prints


def test_a_store_from_before_the_reports_table_is_migrated(tmp_path):
    from ksearch.store import db as dbmod

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    dbmod._m001_initial(old)
    dbmod._m002_llm_calls(old)
    old.execute("INSERT INTO migrations VALUES ('001_initial', 'then'), ('002_llm_calls', 'then')")
    old.close()
    s = Store(path)
    assert s.report() is None
    report = _report()[1]
    s.put_report(report)
    assert s.report() == report


def test_best_score_is_the_world_models_best_not_the_highest_score(tmp_path):
    """A kernel that tied with the best of its time can score a little higher than it: `ksearch runs list` must
    show the best the tree (and `ksearch show`) has, not the highest score; a damaged snapshot is a StoreError."""
    from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Node, Tree, attach

    t = attach(Tree.new(), ROOT_ID, "base", EvalSummary(status="PASSED", score=1.0, latency_ms={"w": 1.0}))
    t = t.replace(Node(id="a", parent_id=ROOT_ID, action=Action(title="a")),
                  Node(id="b", parent_id="a", action=Action(title="b")))
    t = attach(t, "a", "ca", EvalSummary(status="PASSED", score=1.5, latency_ms={"w": 0.6}, vs_best="faster"))
    t = attach(t, "b", "cb", EvalSummary(status="PASSED", score=1.6, latency_ms={"w": 0.6}, vs_best="tie"))
    s = Store(tmp_path / "run.sqlite", create=True)
    s.create_run("r1", "t", "cpu", {"task": "t", "budget": 3}, {}, None)
    c = Candidate(target="cpu", sources={"k.c": "x"})
    s.record_step(c, Evaluation(candidate_id=c.id, task="t", target="cpu", status=Status.PASSED), 1.6,
                  t.model_dump_json(), "{}", None)
    assert t.best().id == "a" and s.best_score() == pytest.approx(1.5)
    s.record_snapshot('{"nodes": 7}', "{}")
    with pytest.raises(StoreError, match="world model does not load"):
        s.best_score()
    s.close()


def test_an_empty_run_id_is_no_run_not_the_only_one(tmp_path, monkeypatch):
    # '' is a prefix of every id: `ksearch report "$RUN"` with RUN unset drew the only run there was
    from ksearch.store.runs import find_run, run_dir

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    s = Store(run_dir("only-one") / "run.sqlite", create=True)
    s.create_run("only-one", "t", "cpu", {}, {}, None)
    s.close()
    assert find_run("only") == run_dir("only-one") / "run.sqlite"
    for blank in ("", " "):
        with pytest.raises(StoreError, match="no run given"):
            find_run(blank)
