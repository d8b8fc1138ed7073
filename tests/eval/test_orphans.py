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


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        parent = _parent(pid)
        if parent is None or parent <= 1:
            return False
        if parent == ancestor:
            return True
        pid = parent
    return False


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
    ctl = subprocess.Popen([sys.executable, "-c", SCRIPT, str(scratch), namespaces], stdout=subprocess.PIPE,
                           text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert ctl.stdout.readline().strip() == "start"
    # this controller's workers only: other tests (pytest -n) may run workers of their own meanwhile
    deadline, ours = time.monotonic() + 30, set()
    while not ours and time.monotonic() < deadline:
        ours = {p for p in _procs_mentioning("ksearch.eval.worker") if _descends_from(p, ctl.pid)}
        time.sleep(0.05)
    assert ours, "the worker never started"

    def workers():
        return ours & set(_procs_mentioning("ksearch.eval.worker"))

    time.sleep(3)  # inside the endless kernel by now
    os.kill(ctl.pid, signal.SIGKILL)
    ctl.wait()
    deadline = time.monotonic() + 10
    while workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not workers(), "a worker outlived its controller"
