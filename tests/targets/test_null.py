"""The null target (ksearch/targets/null.py): Python kernels on NumPy arrays, no compiler, the whole stack end to end.

It is one module plus data (a knowledge pack for selective-scan): the registry finds it, the judge compiles, checks
and times its kernels in the sandboxed worker on the controller's clock, every task has a naive kernel derived from
its reference, and `ksearch eval` and `ksearch run` work on it as on the cpu target.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import shutil
from importlib import resources

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.hardware.spec import HardwareSpec
from ksearch.knowledge import load_pack
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.targets import get_target, target_names
from ksearch.targets.null import naive_source
from ksearch.tasks import builtin_names, load_task

#: timing that decides in a few rounds: these tests check that the stack runs, not the figures
QUICK = TimingPlan(warmup=1, min_repeats=2, max_repeats=3, min_time_s=0.0, max_time_s=0.2, flush_bytes=0,
                   max_rounds=4)
TASK = load_task("selective-scan")
NULL = get_target("null")
runner = CliRunner()
#: a hand-made CPU spec: the commands' tests need no probing of this machine (~4 s on 2 cores, more under load)
SPEC = HardwareSpec(name="test-cpu", kind="cpu", cores=2, threads=2, simd_width=8, memory_bandwidth_gbs=20.0,
                    peak_flops={"float32": 1e11}, exp_rate_per_s=1e9, source="hand-made for tests")


def kernel(body: str, name: str = "kernel.py") -> Candidate:
    return Candidate(target="null", sources={name: body})


def pack_kernel(**choices) -> str:
    k = load_pack("selective-scan", "null").render(TASK.definition, {"family": "token-loop", **choices})
    return k.sources["kernel.py"]


@pytest.fixture(scope="module")
def judge():
    ev = Evaluator(TASK, "null", config=EvalConfig(seeds=[5], timeout_s=10.0, timing=QUICK, busy_wait_s=0.0))
    yield ev
    ev.close()


def test_the_registry_lists_it_last_and_the_default_target_stays_cpu():
    from ksearch.cli.eval_cmd import eval_command
    from ksearch.cli.run_cmd import run_command

    assert target_names()[-1] == "null" and NULL.name == "null"
    for command in (eval_command, run_command):
        assert inspect.signature(command).parameters["target"].default.default == "cpu"
    assert NULL.available() is None and NULL.rule_family is None and NULL.hardware_kind == "cpu"


@pytest.mark.parametrize("name", builtin_names())
def test_every_task_has_a_naive_kernel_derived_from_its_reference(name):
    task = load_task(name)
    assert "null" not in task.naive_sources  # none is shipped: derived
    naive = NULL.naive_candidate(task)
    assert naive.sources == {"kernel.py": naive_source(task.definition)} and naive.meta == {"role": "naive"}
    assert NULL.naive_candidate(load_task(name)).id == naive.id  # deterministic: the same id in every process
    assert NULL.compile(naive, task.definition).ok


def test_a_shipped_naive_null_kernel_is_taken_over_the_derived_one(tmp_path):
    shutil.copytree(str(resources.files("ksearch.tasks") / "builtin" / "selective-scan"), tmp_path / "scan")
    (tmp_path / "scan" / "naive.null.py").write_text(pack_kernel())
    task = load_task(tmp_path / "scan")
    assert NULL.naive_candidate(task).sources == {"kernel.py": pack_kernel()}


@pytest.mark.parametrize("candidate, why", [
    (kernel("def run(*args)\n    pass\n"), r"kernel.py:1:\d+: SyntaxError"),
    (kernel("def run(u, delta):\n    pass\n"), "takes 2 positional parameters; the judge calls it with 15"),
    (kernel("x = 1\n"), "defines no function 'run'"),
    (kernel("def run(*a):\n    pass\n", "kernel.c"), "one Python file"),
    (Candidate(target="null", sources={"kernel.py": "def run(*a): pass\n"}, compile_flags=["-O3"]), "no compile flags"),
    (Candidate(target="null", sources={"kernel.py": "def run(*a): pass\n"}, launch={"grid": [1]}), "no launch plan"),
])
def test_compile_refuses_what_cannot_be_a_kernel_with_the_reason(candidate, why):
    built = NULL.compile(candidate, TASK.definition)
    assert not built.ok and re.search(why, built.log), built.log


def test_the_derived_naive_and_a_pack_kernel_pass_and_are_timed(judge):
    naive = judge.measure_naive(TASK.select(["tiny"]))
    assert naive.status is Status.PASSED, naive.message
    # the reference itself, rounded to the outputs' float32
    assert naive.workloads[0].median_ms > 0 and naive.workloads[0].max_abs_err < 1e-6
    ev = judge.evaluate(kernel(pack_kernel(precision="float32")), ["tiny", "odd"])
    assert ev.status is Status.PASSED, ev.message
    assert all(r.median_ms > 0 and r.speedup_vs_naive for r in ev.workloads if r.workload == "tiny")


@pytest.mark.parametrize("body, status, match", [
    ("def run(*a):\n    a[9][...] = 0\n    a[10][...] = 0\n", Status.INCORRECT_NUMERICAL, "outside atol"),
    ("def run(*a):\n    pass\n", Status.INCORRECT_NUMERICAL, "non-finite"),  # the outputs' NaN poison stays
    ("def run(*a):\n    a[0][...] = 0\n", Status.RUNTIME_ERROR, "read-only"),  # inputs cannot be written
    ("def run(*a):\n    raise ValueError('boom')\n", Status.RUNTIME_ERROR, r"kernel.py:2 in run.*ValueError: boom"),
    ("import not_a_module\ndef run(*a):\n    pass\n", Status.COMPILE_ERROR, "kernel.py does not import"),
])
def test_broken_kernels_get_their_status(judge, body, status, match):
    ev = judge.evaluate(kernel(body), ["tiny"], timing=False)
    assert ev.status is status, ev.message
    assert re.search(match, ev.message, re.S), ev.message


def test_a_bfloat16_task_runs_its_derived_naive_kernel():
    task = load_task("attention-prefill-bf16")
    small = min(task.workloads, key=lambda w: task.definition.cost_of(w).bytes)
    ev = Evaluator(task, "null", config=EvalConfig(seeds=[3], timeout_s=30.0, timing=QUICK, busy_wait_s=0.0))
    try:
        res = ev.evaluate(ev.naive_candidate(), [small.name], timing=False)
    finally:
        ev.close()
    assert res.status is Status.PASSED, res.message


def test_ksearch_eval_judges_a_kernel_file_on_the_null_target(tmp_path, monkeypatch):
    import ksearch.cli.eval_cmd as eval_cmd

    monkeypatch.setattr(eval_cmd, "EvalConfig", functools.partial(EvalConfig, timing=QUICK, busy_wait_s=0.0))
    monkeypatch.setattr(type(NULL), "hardware_spec", lambda self: SPEC)
    path = tmp_path / "scan.py"
    path.write_text(pack_kernel(precision="float32"))
    r = runner.invoke(app, ["eval", "selective-scan", str(path), "--target", "null", "-w", "tiny", "--seeds", "1",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["status"] == "PASSED" and out["target"] == "null"


def test_ksearch_run_searches_on_the_null_target_end_to_end(tmp_path, monkeypatch):
    """The offline proposer's pack, the judge, the store and the final stage (hidden workloads included)."""
    from tests.quick_ksearch import use_quick_timing

    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KSEARCH_BUSY_WAIT_S", "0")
    use_quick_timing(monkeypatch.setattr, checks=1)
    monkeypatch.setattr(type(NULL), "hardware_spec", lambda self: SPEC)
    r = runner.invoke(app, ["run", "selective-scan", "--target", "null", "-w", "tiny", "--budget", "3", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["target"] == "null" and s["status"] == "finished" and s["evaluations"] == 3
    assert s["workloads"][0]["name"] == "tiny" and s["workloads"][0]["naive_ms"] > 0
    if s["best_candidate_id"] is not None:  # timing noise on tiny may leave none above the naive kernel
        assert s["best_status"] == "PASSED" and s["hidden_workloads"]["status"] == "PASSED"
        assert open(s["best_source"]).read().startswith('"""Selective scan (Mamba-1 S6 forward) in NumPy')


def test_no_c_compiler_is_needed(tmp_path, monkeypatch):
    """Without a C compiler (no probes, no eviction library) the null target still judges a kernel: its hardware
    spec's ceilings come from NumPy (provisional) and the runner evicts by writing a buffer."""
    import ksearch.cli.eval_cmd as eval_cmd

    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "home"))
    spec = NULL.hardware_spec()
    assert spec.provisional and "NumPy" in spec.source and spec.memory_bandwidth_gbs > 0
    assert NULL.evict_library() is None
    monkeypatch.setattr(eval_cmd, "EvalConfig", functools.partial(EvalConfig, timing=QUICK, busy_wait_s=0.0))
    path = tmp_path / "scan.py"
    path.write_text(pack_kernel(precision="float32"))
    r = runner.invoke(app, ["eval", "selective-scan", str(path), "--target", "null", "-w", "tiny", "--seeds", "1",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "PASSED"
