"""A killed controller leaves no worker behind (the worker dies with it, whatever its kernel does)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = r"""
import sys
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.records import Candidate
from ksearch.jail.sandbox import Policy
from ksearch.tasks import load_task
from tests.eval import kernels
ev = Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[1], timeout_s=600, static_checks=False,
                                                            sandbox=Policy(namespaces=sys.argv[2])))
print("start", flush=True)
ev.evaluate(Candidate(target="cpu", sources={"kernel.c": kernels.ENDLESS}), ["tiny"], timing=False)
"""


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("namespaces", ["auto", "off"])
def test_worker_dies_with_its_controller(tmp_path, namespaces):
    scratch = tmp_path / f"scratch-{namespaces}"
    scratch.mkdir()
    root = Path(__file__).resolve().parents[2]
    before = set(_procs_mentioning("ksearch.eval.worker"))
    ctl = subprocess.Popen([sys.executable, "-c", SCRIPT, str(scratch), namespaces], stdout=subprocess.PIPE,
                           text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert ctl.stdout.readline().strip() == "start"
    def workers():
        return set(_procs_mentioning("ksearch.eval.worker")) - before

    deadline = time.monotonic() + 30
    while not workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers(), "the worker never started"
    time.sleep(3)  # inside the endless kernel by now
    os.kill(ctl.pid, signal.SIGKILL)
    ctl.wait()
    deadline = time.monotonic() + 10
    while workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workers(), "a worker outlived its controller"
