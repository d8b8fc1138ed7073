"""`ksearch show` (ksearch.cli.show_cmd) on a run searched with a fake judge: a node's kernel, the diff from its
parent's, and the JSON's kernels and times."""

import json

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from tests.search.test_controller import make

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    where = tmp_path_factory.mktemp("show") / "r"
    where.mkdir()
    c = make(where, budget=4)
    c.store.set_config(c.cfg.model_dump(mode="json"))  # as `Session.create` saves it
    c.start()
    c.run()
    c.close()
    c.store.close()
    return where


def test_show_node_source_and_diff(run_dir):
    r = runner.invoke(app, ["show", str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    judged = [e for e in doc["evaluations"] if e["node_id"] not in (None, "n0") and e["kernel"]]
    assert judged and "kernel.c" in judged[0]["kernel"]["sources"] and "wall_s" in judged[0]
    node = judged[0]["node_id"]
    r = runner.invoke(app, ["show", str(run_dir), "--node", node, "--source"])
    assert r.exit_code == 0 and "==> kernel.c <==" in r.output and "# compile flags:" in r.output
    assert judged[0]["kernel"]["sources"]["kernel.c"].strip() in r.output
    r = runner.invoke(app, ["show", str(run_dir), "--node", node, "--diff"])
    assert r.exit_code == 0 and f"+++ {node}/kernel.c" in r.output, r.output
    r = runner.invoke(app, ["show", str(run_dir), "--node", node])  # the path to it
    assert r.exit_code == 0 and r.output.splitlines()[-1].strip().startswith(node)


def test_show_node_errors_name_the_bad_value(run_dir):
    r = runner.invoke(app, ["show", str(run_dir), "--node", "n999", "--source"])
    assert "no node 'n999'" in str(r.exception)
    r = runner.invoke(app, ["show", str(run_dir), "--diff"])
    assert "give its id with --node" in str(r.exception)
    r = runner.invoke(app, ["show", "--help"], terminal_width=200)
    text = " ".join(r.output.replace("│", " ").split())
    assert "--open" in text and "not tried yet" in text and "rating and confidence" in text  # what --open lists
