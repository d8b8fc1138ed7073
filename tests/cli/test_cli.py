import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ksearch.cli import app

from ..eval import kernels

from tests.conftest import fresh_home, ksearch_main

runner = CliRunner()


def test_tasks_list_and_show():
    r = runner.invoke(app, ["tasks", "--json"])
    assert r.exit_code == 0, r.output
    assert {t["name"] for t in json.loads(r.output)} >= {"selective-scan", "selective-scan-fp16"}
    r = runner.invoke(app, ["tasks", "show", "selective-scan", "--json"])
    data = json.loads(r.output)
    assert data["definition"]["axes"]["seqlen"]["type"] == "var" and len(data["workloads"]) == 12
    r = runner.invoke(app, ["tasks", "show", "selective-scan"])
    assert "def run(u, delta, A, B, C, D, z, delta_bias, h0)" in r.output and "mamba370m-L4096" in r.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.output.splitlines()
            if line.count("│") > 3}
    assert rows["tiny"] == "check" and rows["mamba370m-L4096"] == "bench"  # which workloads a search times


def test_version_prints_the_installed_version_and_exits():
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith(f"ksearch {version('ksearch')} (python "), r.output
    r = runner.invoke(app, ["--version", "run", "no-such-task"])  # eager: nothing else runs
    assert r.exit_code == 0 and "no-such-task" not in r.output


def test_eval_json_fields(tmp_path):
    k = tmp_path / "k.c"
    from ksearch.tasks import load_task

    k.write_text(load_task("selective-scan").naive_sources["cpu"])
    r = runner.invoke(app, ["eval", "selective-scan", str(k), "-w", "tiny,odd", "--json", "--seed", "7"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert {"task", "target", "hardware", "workloads"} <= set(data)
    assert data["hardware"]["memory_bandwidth_gbs"] > 0
    for w in data["workloads"]:
        assert {"name", "status", "max_abs_err", "max_rel_err", "median_ms", "spread", "pct_of_floor",
                "speedup_vs_naive"} <= set(w)
        assert w["status"] == "PASSED" and w["pct_of_floor"] > 0 and w["speedup_vs_naive"] > 0


def test_eval_table_and_failure_exit_code(tmp_path):
    k = tmp_path / "wrong.c"
    k.write_text(kernels.WRONG)
    r = runner.invoke(app, ["eval", "selective-scan", str(k), "-w", "tiny", "--no-naive"])
    assert r.exit_code == 1
    assert "INCORRECT_NUMERICAL" in r.output and "roofline floor" in r.output


def test_user_errors_are_one_line_not_tracebacks(tmp_path, capsys, monkeypatch):
    (tmp_path / "binary.c").write_bytes(bytes(range(128, 256)))  # was a UnicodeDecodeError traceback
    # one real process, as a user runs it; the other cases through the same entry point in this process
    p = subprocess.run([sys.executable, "-m", "ksearch", "tasks", "show", "no-such-task"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    for args in (["eval", "selective-scan", str(tmp_path / "missing.c")],
                 ["eval", "selective-scan", __file__, "-w", "no-such-workload"],
                 ["eval", "selective-scan", str(tmp_path / "binary.c")]):
        code, _, err = ksearch_main(args, capsys, monkeypatch)
        assert code == 2, (args, err)
        assert "error:" in err and "Traceback" not in err
    k = tmp_path / "k.c"
    k.write_text(kernels.WRONG)
    for args, match in ((["eval", "selective-scan", str(k), "--seed", "-5"], "--seed"),  # was a NumPy traceback
                        (["eval", "selective-scan", str(k), "--timeout", "0"], "more than 0 seconds"),  # all TIMEOUT
                        (["run", "selective-scan", "--timeout", "-1"], "more than 0 seconds")):
        code, _, err = ksearch_main(args, capsys, monkeypatch)
        assert code == 2 and match in err and "Traceback" not in err, (args, err)


def test_ctrl_c_during_eval_says_so_and_leaves_no_worker(tmp_path):
    import signal
    import time

    from ksearch.eval.casedata import shared_base

    k = tmp_path / "endless.c"
    k.write_text(kernels.ENDLESS)
    # Ctrl-C as a terminal delivers it: the child's SIGINT at its default, whatever this test process inherited
    # (a suite started in the background by a non-interactive shell inherits SIGINT ignored, and so would ksearch)
    proc = subprocess.Popen([sys.executable, "-m", "ksearch", "eval", "selective-scan", str(k), "-w", "tiny",
                             "--no-naive"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(shared_base().glob(f"ksearch-eval-{proc.pid}-*/*/home")):
        time.sleep(0.05)  # until the worker's directory (scratch/<role>/home) exists
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert not list(shared_base().glob(f"ksearch-*-{proc.pid}-*"))
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"ksearch-eval-{proc.pid}-" not in ps  # the worker (its policy names its directory) is gone


def test_damaged_runs_are_one_line_errors_and_listed_as_unreadable(tmp_path, capsys, monkeypatch):
    import os

    from ksearch.store.db import Store

    env = dict(os.environ, KSEARCH_HOME=str(tmp_path))
    for run_id, damage in (("r-json", "UPDATE snapshots SET tree_json = '{\"nodes\": 3}'"),
                           ("r-table", "DROP TABLE evaluations")):
        s = Store(tmp_path / "runs" / run_id / "run.sqlite", create=True)
        s.create_run(run_id, "selective-scan", "cpu", {"task": "selective-scan"}, {}, None)
        s.record_snapshot("{}", "{}")
        s.db.execute(damage)
        s.close()
    # one real process, as a user runs it; the other cases through the same entry point in this process
    p = subprocess.run([sys.executable, "-m", "ksearch", "resume", "r-table"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr, p.stderr
    home = {"KSEARCH_HOME": str(tmp_path)}
    for args in (["show", "r-json"], ["resume", "r-json"], ["show", "r-table"]):
        code, _, err = ksearch_main(args, capsys, monkeypatch, home)
        assert code == 2 and "error:" in err and "Traceback" not in err, (args, err)
    code, out, err = ksearch_main(["runs", "list", "--json"], capsys, monkeypatch, home)
    assert code == 0, err
    assert {r["id"]: r["status"] for r in json.loads(out)} == {"r-json": "interrupted", "r-table": "unreadable"}


def test_runs_list_never_cuts_a_run_id_at_120_columns(tmp_path, monkeypatch):
    from ksearch.store.db import Store

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "120")
    run_id = "attention-prefill-noncausal-bf16-20261207-040958-e8b6"
    s = Store(tmp_path / "runs" / run_id / "run.sqlite", create=True)
    s.create_run(run_id, "attention-prefill-noncausal-bf16", "cpu", {"task": "attention-prefill-noncausal-bf16"}, {},
                 None)
    s.close()
    r = runner.invoke(app, ["runs", "list"])
    assert r.exit_code == 0 and run_id in r.output, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 120


def test_llm_flags_are_checked_before_a_run_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    cases = [
        (["run", "--backend", "openai"], "are for the llm proposer"),
        (["run", "--max-cost", "1"], "are for the llm proposer"),
        (["run", "--proposer", "llm"], "needs --model"),
        (["run", "--backend", "queue"], "needs --queue-dir"),
        (["run", "--backend", "command"], "needs --command"),
        (["run", "--model", "m", "--context", "everything"], "context"),
    ]
    for args, msg in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in " ".join(r.output.split()), (args, r.output)
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


def test_show_llm_on_a_run_without_llm_calls(tmp_path, monkeypatch):
    from ksearch.store.db import Store
    from ksearch.store.runs import run_dir

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path))
    s = Store(run_dir("selective-scan-x") / "run.sqlite", create=True)
    s.create_run("selective-scan-x", "selective-scan", "cpu", {"task": "selective-scan"}, {}, None)
    s.close()
    r = runner.invoke(app, ["show", "selective-scan-x", "--llm"])
    assert r.exit_code == 0 and "made no llm calls" in r.output, r.output
    r = runner.invoke(app, ["show", "selective-scan-x", "--llm", "--json"])
    assert json.loads(r.output)["llm_totals"]["calls"] == 0


def test_an_error_message_is_one_line_and_keeps_its_brackets(tmp_path):
    """`error: ...` from main(): a message quoting a config table ([keys]) lost it to rich markup, and wrapped at
    80 columns when stderr is not a terminal."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(KSEARCH_HOME=str(fresh_home(tmp_path / "home")), KSEARCH_CONFIG=str(tmp_path / "none.toml"), COLUMNS="80")
    p = subprocess.run([sys.executable, "-m", "ksearch", "run", "selective-scan", "--model", "gpt-4.1"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no API key"), p.stderr
    assert "under [keys] in" in lines[0] and str(tmp_path / "none.toml") in lines[0]


def test_max_cost_on_a_model_without_a_price_is_refused_before_a_run_exists(tmp_path):
    """--max-cost with an unpriced model failed at the run's first call (after the naive baseline), leaving an
    'interrupted' run; with the command backend it was accepted and never bound."""
    import os

    env = dict(os.environ, KSEARCH_HOME=str(fresh_home(tmp_path / "home")))
    for args, match in ((["--model", "my-finetune", "--base-url", "http://127.0.0.1:9/v1"],
                         "'my-finetune' has no price"),
                        (["--backend", "command", "--command", "cat"], "cannot limit the command backend")):
        p = subprocess.run([sys.executable, "-m", "ksearch", "run", "selective-scan", "--max-cost", "1", *args],
                           capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 2 and match in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


def test_llm_flags_that_contradict_each_other_are_refused_on_one_line(tmp_path, monkeypatch):
    """Flags silently dropped before: --proposer patterns with --model (the model won), --command with
    --queue-dir (the queue was ignored), a backend's flag under another backend, --context / --llm-timeout
    without the llm proposer. Each refusal is one `error:` line, exit 2, and no run."""
    monkeypatch.setenv("KSEARCH_HOME", str(fresh_home(tmp_path / "home")))
    cases = [
        (["--proposer", "patterns", "--model", "gpt-4o"], "not --proposer patterns"),
        (["--command", "cat", "--queue-dir", str(tmp_path / "q")], "give one"),
        (["--backend", "openai", "--command", "cat"], "--command is for the command backend"),
        (["--backend", "command", "--queue-dir", str(tmp_path / "q")], "--queue-dir is for the queue backend"),
        (["--command", "cat", "--base-url", "http://127.0.0.1:9/v1"], "not command"),
        (["--queue-dir", str(tmp_path / "q"), "--api-key-env", "K"], "not queue"),
        (["--context", "none"], "are for the llm proposer"),
        (["--llm-timeout", "5"], "are for the llm proposer"),
        (["--model", "gpt-4o", "--max-cost", "0"], "--max-cost: Input should be greater than 0"),
        # no scheme: the run was created, then stopped after five connection failures, and a resume kept the URL
        (["--model", "m", "--base-url", "localhost:8000/v1"], "--base-url must be an http:// or https:// URL"),
        (["--model", "m", "--base-url", "ftp://example.com/v1"], "not 'ftp://example.com/v1'"),
    ]
    for args, msg in cases:
        r = runner.invoke(app, ["run", "selective-scan", *args])
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], (args, r.output)
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
    assert not (tmp_path / "q").exists()


def test_a_relative_queue_dir_and_price_file_are_saved_absolute(tmp_path, monkeypatch):
    """`--queue-dir ./prompts` (the README's example) was saved as written: `ksearch resume` from another
    directory wrote its prompts to another ./prompts and waited there forever. Same for --prices."""
    from ksearch.cli import run_cmd
    from ksearch.errors import SearchError

    saved = []

    def create(cfg, progress=None):
        saved.append(cfg)
        raise SearchError("stop before the run")

    monkeypatch.setattr(run_cmd.Session, "create", create)
    monkeypatch.chdir(tmp_path)
    runner.invoke(app, ["run", "--queue-dir", "./prompts"])
    runner.invoke(app, ["run", "--model", "gpt-4o", "--prices", "p.yaml"])
    assert saved[0].llm.queue_dir == str(tmp_path / "prompts")
    assert saved[1].llm.prices_file == str(tmp_path / "p.yaml")


def test_knowledge_render_writes_the_candidate_the_proposer_would_judge(tmp_path):
    from ksearch.records import Candidate
    from ksearch.knowledge import load_pack
    from ksearch.tasks import load_task

    out = tmp_path / "c.json"
    r = runner.invoke(app, ["knowledge", "render", "attention-prefill", "--target", "triton", "--path",
                            "family=flash,exp=exp2,num_stages=2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    cand = Candidate.model_validate_json(out.read_text())
    want = load_pack("attention-prefill", "triton").render(load_task("attention-prefill").definition,
                                                           {"family": "flash", "exp": "exp2"}, {"num_stages": 2})
    assert cand.sources == want.sources and cand.meta["knobs"]["num_stages"] == 2
    bad = runner.invoke(app, ["knowledge", "render", "attention-prefill", "--target", "triton", "--path", "exp=nope"])
    assert "unknown choice 'nope'" in str(bad.exception)  # main() prints KnowledgeError as one line, exit 2


def test_knowledge_render_to_a_path_it_cannot_write_is_a_user_error(tmp_path):
    from ksearch.errors import KnowledgeError

    r = runner.invoke(app, ["knowledge", "render", "attention-prefill", "--path", "family=naive-rows",
                            "-o", str(tmp_path / "missing" / "c.json")])
    assert isinstance(r.exception, KnowledgeError) and "cannot write" in str(r.exception)  # main(): exit 2


def test_knowledge_render_refuses_a_name_given_twice():
    r = runner.invoke(app, ["knowledge", "render", "attention-prefill",
                            "--path", "family=online-tiles,family=naive-rows"])
    assert r.exit_code == 2 and "given twice" in r.output


def _record_judged(monkeypatch) -> list:
    """`ksearch eval`'s judge replaced by one that records each candidate it is given and stops (Ctrl-C, exit 130)
    without judging; the list of those candidates."""
    import ksearch.cli.eval_cmd as eval_cmd
    import ksearch.targets.base as base

    judged: list = []

    class Judge:
        def __init__(self, *a, **k):
            pass

        def evaluate(self, candidate, names, references=()):
            judged.append(candidate)
            raise KeyboardInterrupt

    monkeypatch.setattr(base, "spec_for_target", lambda target: None)
    monkeypatch.setattr(eval_cmd, "Evaluator", Judge)
    return judged


def test_eval_takes_a_rendered_candidate_json_as_it_is(tmp_path, monkeypatch):
    from ksearch.records import Candidate

    judged = _record_judged(monkeypatch)
    c = tmp_path / "c.json"
    r = runner.invoke(app, ["knowledge", "render", "attention-prefill", "--path", "family=online-tiles", "-o", str(c)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["eval", "attention-prefill", str(c), "-w", "mha-odd", "--no-naive"])
    assert r.exit_code == 130 and judged[0] == Candidate.model_validate_json(c.read_text())  # not a C file "c.json"
    r = runner.invoke(app, ["eval", "attention-prefill", str(c), "--target", "mlx-metal"])
    assert "is a candidate for target 'cpu'" in str(r.exception)


def test_eval_of_a_run_best_dir_judges_its_candidate_and_a_bare_source_beside_it_warns(tmp_path, monkeypatch):
    from ksearch.records import Candidate
    from ksearch.tasks import load_task

    judged = _record_judged(monkeypatch)
    best = tmp_path / "run" / "best"  # as `Session.finish` writes it
    best.mkdir(parents=True)
    kept = Candidate(target="cpu", sources={"kernel.c": load_task("selective-scan").naive_sources["cpu"]},
                     compile_flags=["-ffast-math"])
    (best / "kernel.c").write_text(kept.sources["kernel.c"])
    (best / "candidate.json").write_text(kept.model_dump_json())
    for where in (best, best.parent):  # best/ or the run directory: the judged kernel, flags included
        r = runner.invoke(app, ["eval", "selective-scan", str(where), "-w", "tiny", "--no-naive"])
        assert r.exit_code == 130 and judged[-1].id == kept.id and "warning" not in r.output
    r = runner.invoke(app, ["eval", "selective-scan", str(best / "kernel.c"), "-w", "tiny", "--no-naive"])
    assert judged[-1].compile_flags == [] and "not the same kernel" in " ".join(r.output.split())
    assert "-ffast-math" in r.output
    r = runner.invoke(app, ["eval", "selective-scan", str(best / "kernel.c"), "-w", "tiny", "--no-naive",
                            "--flags", "-ffast-math"])
    assert judged[-1].id == kept.id and "warning" not in r.output
    r = runner.invoke(app, ["eval", "selective-scan", str(tmp_path), "--no-naive"])
    assert "without a candidate.json" in str(r.exception)  # a TaskError: one line, exit 2 (`ksearch.cli.main`)


def test_the_reproduce_command_names_the_candidate_target_and_workloads():
    from ksearch.run.controller import RunConfig
    from ksearch.run.session import reproduce_command

    cfg = RunConfig(task="selective-scan", target="cpu", workloads=["tiny", "odd"])
    assert reproduce_command(cfg, "/r/my run/best/candidate.json") == \
        "ksearch eval selective-scan '/r/my run/best/candidate.json' --target cpu -w tiny,odd"


def test_a_typoed_task_name_gets_a_did_you_mean():
    r = runner.invoke(app, ["tasks", "show", "selectve-scan"])
    assert "no task 'selectve-scan' (did you mean 'selective-scan'?)" in str(r.exception)
    r = runner.invoke(app, ["tasks", "show", "zzzz"])
    assert "did you mean" not in str(r.exception)


def test_eval_runs_the_naive_kernel_only_beside_the_candidate(tmp_path, monkeypatch):
    """The naive kernel is timed (and checked) in the paired rounds alone: no evaluation of it on its own first."""
    import ksearch.cli.eval_cmd as eval_cmd
    import ksearch.targets.base as base
    from ksearch.records import Candidate

    calls = []

    class Judge:
        def __init__(self, *a, **k):
            pass

        def naive_candidate(self):
            return Candidate(target="cpu", sources={"kernel.c": "naive"})

        def evaluate(self, candidate, names, references=()):
            calls.append((candidate.sources, [r.role for r in references]))
            raise KeyboardInterrupt

    monkeypatch.setattr(base, "spec_for_target", lambda target: None)
    monkeypatch.setattr(eval_cmd, "Evaluator", Judge)
    k = tmp_path / "k.c"
    k.write_text(kernels.WRONG)
    runner.invoke(app, ["eval", "selective-scan", str(k), "-w", "tiny"])
    assert calls == [({"k.c": kernels.WRONG}, ["naive"])]


@pytest.mark.parametrize("command", [["run", "selective-scan", "--target", "null", "--budget", "1"],
                                     ["eval", "selective-scan", "KERNEL", "--target", "null"],
                                     ["compare", "selective-scan", "--target", "null", "--budget", "1"],
                                     ["ablate", "selective-scan", "--target", "null", "--budget", "1"]],
                         ids=["run", "eval", "compare", "ablate"])
@pytest.mark.parametrize("value", ["", ",", " , "])
def test_an_empty_workload_list_is_refused_not_read_as_all(command, value, tmp_path, capsys, monkeypatch):
    """``-w "$NAMES"`` with an empty variable: one error line and exit 2 before anything starts (it used to run
    every workload, the long ones included), and no run directory left behind."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text("def run(*args):\n    pass\n")
    args = [str(kernel) if a == "KERNEL" else a for a in command] + ["-w", value]
    code, _, err = ksearch_main(args, capsys, monkeypatch, {"KSEARCH_HOME": str(tmp_path / "home")})
    assert code == 2, err
    assert "names no workload" in err and "Traceback" not in err
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
