"""`ksearch report` (ksearch/report/html.py, html_data.py, cli/report_cmd.py): reports of real small runs on the
null target (the offline patterns proposer; the llm proposer answered by a scripted OpenAI-compatible server),
checked in a real headless browser: Debian's Chromium driven by Playwright (skipped, saying so, without them).

The runs and the rendered pages are shared by the module's tests (module-scoped fixtures): two small searches, one
browser, one page load per report.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.records import Evaluation, Status, WorkloadResult
from ksearch.report.html_data import layout, score_interval
from ksearch.search.worldmodel import Tree
from ksearch.store.runs import open_run

CHROMIUM = Path("/usr/bin/chromium")
runner = CliRunner()


# -- pure parts -------------------------------------------------------------------------------------------------


def _ev(*rows: tuple[float, float, list[float] | None], repeats: int = 5) -> Evaluation:
    return Evaluation(candidate_id="c", task="t", target="null", status=Status.PASSED, workloads=[
        WorkloadResult(workload=f"w{i}", status=Status.PASSED, speedup_vs_naive=s, median_ms=m, ci_ms=ci,
                       repeats=repeats) for i, (s, m, ci) in enumerate(rows)])


def test_the_score_interval_is_the_range_the_median_time_intervals_span():
    # naive 2 ms, median 1 ms in [0.5, 2] ms: speedup 2x in [1x, 4x]; a second workload at 1x exactly
    lo, hi = score_interval(_ev((2.0, 1.0, [0.5, 2.0]), (1.0, 1.0, [1.0, 1.0])))
    assert (lo, hi) == pytest.approx((1.0, 2.0))  # geometric means: sqrt(1 * 1), sqrt(4 * 1)
    assert score_interval(_ev((2.0, 1.0, None))) is None  # a workload without an interval: none
    assert score_interval(_ev((2.0, 1.0, [1.0, 1.0]), repeats=1)) is None  # one repeat is no interval
    assert score_interval(None) is None


def test_the_tree_layout_centres_a_parent_over_its_children():
    tree = Tree.model_validate({"nodes": [
        {"id": "root", "status": "open"},
        *({"id": i, "parent_id": p, "action": {"title": i}} for i, p in (("a", "root"), ("b", "root"), ("c", "a"),
                                                                         ("d", "a")))]})
    pos = layout(tree)
    assert pos["c"] == (0.0, -2.0) and pos["d"] == (1.0, -2.0) and pos["b"] == (2.0, -1.0)
    assert pos["a"] == (0.5, -1.0) and pos["root"] == (1.25, 0.0)


def test_a_tree_of_many_leaves_is_drawn_left_to_right_a_row_a_leaf():
    from ksearch.report.html import WIDE_TREE, tree_figure

    def figure(leaves: int):
        raw = [{"id": "root", "status": "open"}] + [{"id": f"n{i}", "parent_id": "root", "action": {"title": "t"}}
                                                    for i in range(leaves)]
        tree = Tree.model_validate({"nodes": raw})
        pos = layout(tree)
        nodes = [{"id": n.id, "x": pos[n.id][0], "y": pos[n.id][1], "parent": n.parent_id, "status": "open",
                  "label": n.label, "rating": 5.0, "confidence": 0.5, "best": False, "in_flight": False,
                  "score": None} for n in tree]
        fig = tree_figure({"nodes": nodes})
        return next(t for t in fig.data if t.name == "nodes"), fig.layout

    few, _ = figure(3)
    assert sorted(set(few.y)) == [-1.0, 0.0]  # top down: y is minus the depth
    many, lay = figure(WIDE_TREE + 6)
    assert len(many.x) == WIDE_TREE + 7 and sorted(set(many.x)) == [0.0, 1.0]  # left to right: x is the depth
    assert lay.height >= 22 * (WIDE_TREE + 6)


def test_data_in_the_page_cannot_close_its_script_element_and_has_no_nan():
    from ksearch.report.html import _json

    text = _json({"kernel": "x </script><script>alert(1)</script> & y", "score": float("nan"), "hi": [float("inf")]})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"kernel": "x </script><script>alert(1)</script> & y", "score": None, "hi": [None]}


# -- real runs --------------------------------------------------------------------------------------------------


def _small_run(home: Path, args: list[str]) -> str:
    """A real `ksearch run` on the null target, made cheap as tests/targets/test_null.py makes it: one check,
    quick timing, a hand-made hardware spec (no probes), fewer pings calibrating the clock. Returns the run's
    directory."""
    from tests.quick_ksearch import use_quick_timing
    from tests.targets.test_null import NULL, SPEC

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KSEARCH_HOME", str(home))
        use_quick_timing(mp.setattr, checks=1)  # and 4 clock pings a worker, not 24 (seconds on a busy machine)
        mp.setattr(type(NULL), "hardware_spec", lambda self: SPEC)
        r = runner.invoke(app, ["run", "selective-scan", "--target", "null", "-w", "tiny", "--json", *args])
    assert r.exit_code == 0, r.output
    return str(home / "runs" / json.loads(r.output[r.output.index("{"):])["run_id"])


def _null_responder(state: Path):
    """The e2e model stand-in (valid tree edits, with its prose and cut-off JSON faults) answering coder prompts
    with the null target's naive kernel marked with the node (every kernel distinct), the second one broken."""
    from ksearch.targets.null import naive_source
    from ksearch.tasks import load_task
    from tests.e2e.responder import Responder

    plan, naive, count = Responder(state), naive_source(load_task("selective-scan").definition), [0]

    def respond(messages: list[dict]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        if "You are the coder" not in system:
            return plan(messages)
        count[0] += 1
        node = re.search(r"node (\S+)", next(m["content"] for m in messages if m["role"] == "user"))
        mark = f"# ksearch report test: node {node.group(1) if node else '?'} #{count[0]}"
        if count[0] == 2:
            return f"```python\n{mark}\ndef run(u, delta:\n    oops </script>\n```\n"
        return f"Here it is.\n\n```python\n{mark}\n{naive}```\n"

    return respond


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real runs: the patterns proposer (3 evaluations) and the llm proposer through a scripted
    OpenAI-compatible server (2 evaluations, the second of which does not compile); their directories."""
    from tests.conftest import fresh_home
    from tests.e2e.test_llm_search import responding
    from tests.llm.fakes import ScriptedOpenAIServer

    home = fresh_home(tmp_path_factory.mktemp("report-home"))
    patterns = _small_run(home, ["--budget", "3"])
    with responding(ScriptedOpenAIServer)(_null_responder(home / "state.json"), {}) as srv:
        llm = _small_run(home, ["--budget", "2", "--model", "gpt-4o-mini", "--base-url", srv.base_url])
    return {"home": home, "patterns": patterns, "llm": llm}


def _facts(run_dir: str) -> dict:
    store = open_run(run_dir)
    try:
        tree = Tree.model_validate_json(store.latest_snapshot()[1])
        return {"nodes": len(tree), "evaluations": store.evaluation_count(), "tree": tree,
                "calls": store.llm_calls(), "kernels": {n.id: store.candidate(n.candidate_id) for n in tree
                                                        if n.candidate_id and n.id != "root"}}
    finally:
        store.close()


@pytest.fixture(scope="module")
def reports(runs, tmp_path_factory):
    """`ksearch report RUN -o FILE` of each run."""
    out = tmp_path_factory.mktemp("reports")
    paths = {}
    for name in ("patterns", "llm"):
        paths[name] = out / f"{name}.html"
        r = runner.invoke(app, ["report", runs[name], "-o", str(paths[name])])
        assert r.exit_code == 0, r.output
        assert f"wrote {paths[name]}" in r.output
    return paths


def test_the_file_is_self_contained(reports):
    text = reports["patterns"].read_text()
    assert text.startswith("<!DOCTYPE html>") and "Plotly" in text
    # no script, style sheet or image from elsewhere (the browser tests also check that the page requests nothing)
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link[^>]*\shref=", text)


def test_the_default_file_is_in_the_run_directory_and_live_stops_with_a_finished_run(runs, monkeypatch):
    import ksearch.cli.report_cmd as report_cmd

    opened = []
    monkeypatch.setattr(report_cmd.webbrowser, "open", opened.append)
    r = runner.invoke(app, ["report", runs["patterns"], "--live", "--every", "1", "--open"])
    assert r.exit_code == 0, r.output
    page = Path(runs["patterns"]) / "report.html"
    assert opened == [page.resolve().as_uri()]  # once, at the first page
    assert page.is_file() and "no longer reloading" in r.output
    assert "location.reload()" not in page.read_text()  # the last render of a stopped run does not reload


def test_an_unknown_id_is_a_clean_error(runs, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(runs["home"]))
    r = runner.invoke(app, ["report", "no-such-run"])
    assert r.exit_code != 0 and "no run 'no-such-run'" in str(r.exception)


def _cut(run_dir: str, dest: Path, keep: int) -> Path:
    """A copy of the run as it stood after ``keep`` evaluations, still running: later evaluations, snapshots, the
    final measurements and the report gone."""
    import sqlite3

    shutil.copytree(run_dir, dest)
    db = sqlite3.connect(dest / "run.sqlite")
    with db:
        for sql in ("DELETE FROM evaluations WHERE seq > ?", "DELETE FROM snapshots WHERE seq > ?"):
            db.execute(sql, (keep,))
        db.execute("DELETE FROM reports")
        db.execute("DELETE FROM baselines WHERE name = 'final'")
        db.execute("UPDATE runs SET status = 'running'")
    db.close()
    return dest


@pytest.mark.parametrize("keep", [0, 1])
def test_a_run_in_progress_is_drawn_from_the_search_alone(runs, tmp_path, keep):
    from ksearch.report.html import render_run

    store = open_run(str(_cut(runs["patterns"], tmp_path / "run", keep)))
    try:
        text = render_run(store, live_s=3)
    finally:
        store.close()
    assert "No final measurement yet" in text and "reloads itself every 3" in text
    assert "location.reload()" in text and "<table id=\"final\">" not in text
    figures = json.loads(re.search(r'id="ks-figures">(.*?)</script>', text, re.S).group(1))
    best = next(t for t in figures["curve-evals"]["data"] if t["name"] == "best so far")
    assert len(best.get("x", [])) == keep
    roofline = [k for k in figures if k.startswith("roofline-")]
    assert roofline and "in-search evaluations" in json.dumps(figures[roofline[0]]["layout"]["title"])


def test_live_rewrites_the_page_while_a_process_holds_the_run_and_stops_after(runs, tmp_path):
    """A process holds the run's lock (as `ksearch run` does); its status changes: the page is written again; the
    lock is let go: the last page, without the reload, and the command ends."""
    import fcntl
    import threading

    from ksearch.store.db import Store

    run = _cut(runs["patterns"], tmp_path / "run", 3)
    lock = open(run / "lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)

    page = run / "report.html"

    def wait_for(cond, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.05)

    def the_run():
        try:
            wait_for(page.exists)  # the first page is written: the command looks at the run right after
            time.sleep(1.0)
            store = Store(run / "run.sqlite")
            store.set_status("finished")
            store.close()
            wait_for(lambda: "<b id=\"run-status\">finished</b>" in page.read_text())  # written again
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()

    t = threading.Thread(target=the_run)
    t.start()
    r = runner.invoke(app, ["report", str(run), "--live", "--every", "1"])
    t.join()
    assert r.exit_code == 0, r.output
    assert "3 evaluations, finished: wrote" in r.output and "no longer reloading" in r.output
    text = page.read_text()
    assert "location.reload()" not in text and "<b id=\"run-status\">finished</b>" in text


def test_a_node_in_flight_shows_the_kernel_being_judged(runs, tmp_path):
    import sqlite3

    from ksearch.report.html_data import run_data

    run = _cut(runs["patterns"], tmp_path / "run", 1)
    db = sqlite3.connect(run / "run.sqlite")
    seq, tree_json = db.execute("SELECT seq, tree_json FROM snapshots ORDER BY seq DESC LIMIT 1").fetchone()
    tree = json.loads(tree_json)
    node = next(n["id"] for n in tree["nodes"] if n["status"] == "open")
    candidate = db.execute("SELECT id FROM candidates LIMIT 1").fetchone()[0]
    tree["in_flight"] = {node: candidate}
    with db:
        db.execute("UPDATE snapshots SET tree_json = ? WHERE seq = ?", (json.dumps(tree), seq))
    db.close()
    store = open_run(str(run), readonly=True)
    try:
        data = run_data(store)
    finally:
        store.close()
    mine = data["details"][node]
    assert mine["in_flight"] and mine["status"] == "open" and f"candidate {candidate}" in mine["kernel"]
    assert next(n for n in data["nodes"] if n["id"] == node)["in_flight"]


def test_a_damaged_world_model_is_a_clean_error_naming_the_file(runs, tmp_path):
    import sqlite3

    run = _cut(runs["patterns"], tmp_path / "run", 2)
    db = sqlite3.connect(run / "run.sqlite")
    with db:
        db.execute("UPDATE snapshots SET tree_json = '{\"nodes\": []}' WHERE seq = 2")
    db.close()
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code != 0 and type(r.exception).__name__ == "StoreError"
    assert "run.sqlite" in str(r.exception) and "snapshot 2 does not load" in str(r.exception)


# -- in a real browser ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (README's test set-up) to check the report in a "
                    "real browser")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A report loaded in the browser, with every script error, console error and request it made."""

    def __init__(self, browser, path: Path):
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri())
        self.page.evaluate("window.ksearch.ready.then(() => true)")

    def js(self, expr: str):
        return self.page.evaluate(expr)

    def click_node(self, node_id: str) -> None:
        """A real mouse click on the node's marker in the tree (Plotly's click, not a call of the page's code)."""
        xy = self.page.evaluate("""(id) => { const gd = document.getElementById('tree'); gd.scrollIntoView();
            const tr = gd.data.find(t => t.name === 'nodes'), i = tr.customdata.indexOf(id);
            const L = gd._fullLayout, r = gd.getBoundingClientRect();
            return [r.left + L.xaxis._offset + L.xaxis.d2p(tr.x[i]), r.top + L.yaxis._offset + L.yaxis.d2p(tr.y[i])];
        }""", node_id)
        self.page.mouse.click(*xy)
        self.page.wait_for_function(f"document.getElementById('node-title') && document.getElementById("
                                    f"'node-title').textContent.startsWith({json.dumps(node_id + ' ')})",
                                    timeout=5000)


@pytest.fixture(scope="module")
def pages(browser, reports):
    return {name: Page(browser, path) for name, path in reports.items()}


@pytest.mark.parametrize("name", ["patterns", "llm"])
def test_the_page_loads_without_script_errors_or_network(pages, name):
    page = pages[name]
    assert page.errors == []
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in page.requests), page.requests


@pytest.mark.parametrize("name", ["patterns", "llm"])
def test_the_tree_has_one_marker_per_node_and_the_curves_one_point_per_evaluation(pages, runs, name):
    facts, page = _facts(runs[name]), pages[name]
    assert page.js("document.getElementById('tree').data.find(t => t.name === 'nodes').x.length") == facts["nodes"]
    for div in ("curve-evals", "curve-time"):
        n = page.js(f"document.getElementById('{div}').data.find(t => t.name === 'best so far').x.length")
        assert n == facts["evaluations"], div
    assert page.js("document.getElementById('eval-count').textContent") == str(facts["evaluations"])


def test_clicking_a_node_shows_its_kernel_and_its_diff(pages, runs):
    facts, page = _facts(runs["patterns"]), pages["patterns"]
    node = next(n for n in facts["tree"] if n.id in facts["kernels"] and n.parent_id != "root")
    page.click_node(node.id)
    kernel = page.js("document.getElementById('node-kernel').textContent")
    body = facts["kernels"][node.id].sources["kernel.py"]
    assert f"candidate {facts['kernels'][node.id].id}" in kernel and body.splitlines()[1] in kernel
    diff = page.js("document.getElementById('node-diff').textContent")
    assert f"--- {node.parent_id}/kernel.py" in diff and f"+++ {node.id}/kernel.py" in diff
    assert node.action.title in page.js("document.getElementById('node-action').textContent")
    assert "tiny" in page.js("document.getElementById('node-panel').textContent")  # the per-workload table
    assert page.errors == []


def test_an_llm_node_shows_its_prompts_replies_tokens_and_cost_and_a_broken_kernel_as_text(pages, runs):
    facts, page = _facts(runs["llm"]), pages["llm"]
    failed = next(n for n in facts["tree"] if n.status.value == "failed" and n.candidate_id)
    page.click_node(failed.id)
    mine = [c for c in facts["calls"] if c.node_id == failed.id]
    assert mine and page.js("document.querySelectorAll('#node-panel .llm-call').length") == len(mine)
    panel = page.js("document.getElementById('node-panel').textContent")
    assert f"{mine[0].usage.input_tokens} in / " in panel and "$" in panel  # gpt-4o-mini has a price
    assert "You are the coder" in panel and "oops </script>" in page.js(
        "document.getElementById('node-kernel').textContent")  # shown as written, never run as markup
    assert "COMPILE_ERROR" in page.js("document.getElementById('node-judge').textContent")
    history = page.js("document.getElementById('node-history').textContent")
    assert f"inserted '{failed.id}'" in history and "sent to be judged" in history  # the planner's edits naming it
    assert page.js("document.getElementById('llm-totals').textContent").startswith(f"{len(facts['calls'])} calls")
    assert page.errors == []


def _manifest(runs: dict, compare: bool):
    """A comparison's manifest over the two runs as `ksearch compare` keeps it, with its stored results (the
    re-timed table); or an ablation's (`ksearch ablate`) with a third run never started and no results."""
    from ksearch.run.ablate import Ablation, AblationRun, ablation_dir, save
    from ksearch.run.ablate_results import AblationResult, AblationRow
    from ksearch.run.compare import CompareResult, StrategySummary
    from ksearch.run.controller import RunConfig

    cfg = RunConfig(task="selective-scan", target="null")
    ids = {"a": Path(runs["patterns"]).name, "b": Path(runs["llm"]).name}
    labels = {"a": "worldmodel-1", "b": "random-1"} if compare else {"a": "offline", "b": "full", None: "none"}
    ab = Ablation(id=f"report-test-{'compare' if compare else 'ablate'}", created_at="2026-12-07T00:00:00+00:00",
                  task="selective-scan", contexts=[] if compare else ["full", "none"], offline=not compare,
                  config=cfg, runs=[AblationRun(label=labels[k], run_id=ids[k], status="finished") for k in "ab"]
                  + ([] if compare else [AblationRun(label="none")]),
                  variants={x: cfg for x in labels.values()} if compare else {},
                  strategies=["worldmodel", "random"] if compare else [], repeats=1 if compare else 0)
    if compare:
        rows = [AblationRow(label=labels[k], run_id=ids[k], status="finished", evaluations=_facts(runs[r])[
            "evaluations"], vs_naive=1.5) for k, r in (("a", "patterns"), ("b", "llm"))]
        table = AblationResult(ablation_id=ab.id, task="selective-scan", target="null", budget=3, seed=0, rows=rows,
                               date="2026-12-07")
        path = ablation_dir(ab.id) / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = StrategySummary(strategy="worldmodel", runs=1, finished=1, curve_median=[1.0, 1.2, 1.2],
                                  curve_min=[1.0, 1.1, 1.1], curve_max=[1.0, 1.3, 1.4])
        path.write_text(CompareResult(table=table, strategies=ab.strategies, repeats=1,
                                      summaries=[summary]).model_dump_json())
        ab.results = str(path)
    save(ab)
    return ab


def test_a_comparisons_page_draws_its_runs_curves_side_by_side_with_its_table(browser, runs, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(runs["home"]))
    ab = _manifest(runs, compare=True)
    out = tmp_path / "compare.html"
    r = runner.invoke(app, ["report", ab.id, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert f"comparison {ab.id}, 2 runs" in r.output
    page = Page(browser, out)
    assert page.errors == []
    names = page.js("document.getElementById('curves').data.map(t => t.name)")
    runs_drawn = [x for x in names if x in ("random-1", "worldmodel-1")]
    assert sorted(set(runs_drawn)) == ["random-1", "worldmodel-1"] and len(runs_drawn) == 4  # evaluations, time
    assert "worldmodel median" in names and "worldmodel min-max" in names  # the strategy's band over its runs
    counts = {k: _facts(runs[k])["evaluations"] for k in ("patterns", "llm")}
    assert page.js("window.ksearch.data.runs") == {"worldmodel-1": counts["patterns"], "random-1": counts["llm"]}
    table = page.js("document.getElementById('results').textContent")
    assert "1.50x" in table and "worldmodel-1" in table


def test_an_ablations_page_without_results_says_how_to_make_them(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(runs["home"]))
    ab = _manifest(runs, compare=False)
    r = runner.invoke(app, ["report", ab.id])
    assert r.exit_code == 0, r.output
    text = (runs["home"] / "ablations" / ab.id / "report.html").read_text()
    assert f"ksearch ablate --resume {ab.id}" in text and "none: not started" in text
    assert 'id="results"' not in text and '"offline": 3' in text.replace("\\u003c", "<")
