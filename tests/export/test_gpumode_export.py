"""`ksearch export --format gpumode` (ksearch.export.gpumode): a cpu kernel's submission.py passes the problem's own
``check_implementation`` on ``generate_input``'s data (the look-alike folders of tests/fixtures/gpumode), and a wrong
kernel fails it."""

from __future__ import annotations

import importlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="GPU MODE problems are PyTorch code: pip install torch==2.13.0")

from ksearch.export import export_candidate  # noqa: E402
from ksearch.export.gpumode import data_layout  # noqa: E402
from ksearch.records import Candidate  # noqa: E402
from ksearch.tasks import load_task  # noqa: E402
from tests.export.test_kernelbench_export import load_module  # noqa: E402
from tests.tasks.test_gpumode_import import GPUMODE, ROWSUM, VECTORADD  # noqa: E402

KERNELS = {"vectoradd_py": (VECTORADD.replace("EPS", "0.0f"), VECTORADD.replace("EPS", "1e-3f")),
           "rowsum_py": (ROWSUM.replace("SKIP", "0"), ROWSUM.replace("SKIP", "1"))}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def problem(folder: str, monkeypatch):
    """The folder's own reference module (generate_input, check_implementation), imported as GPU MODE's harness
    does: the folder and its parent (utils.py) on the path."""
    for name in ("reference", "task", "utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(GPUMODE))
    monkeypatch.syspath_prepend(str(GPUMODE / folder))
    return importlib.import_module("reference")


@pytest.mark.parametrize("folder", sorted(KERNELS))
def test_submission_passes_the_problems_own_check(folder, tmp_path, monkeypatch):
    task = load_task(GPUMODE / folder)
    good, wrong = KERNELS[folder]
    sub = load_module(export_candidate(Candidate(target="cpu", sources={"kernel.c": good}), task.definition,
                                       tmp_path / "submission.py", {"test": folder}, "gpumode"))
    bad = load_module(export_candidate(Candidate(target="cpu", sources={"kernel.c": wrong}), task.definition,
                                       tmp_path / "bad" / "submission.py", {}, "gpumode"))
    ref = problem(folder, monkeypatch)
    for i, wl in enumerate(task.workloads):
        data = ref.generate_input(**wl.axes, seed=100 + i)
        ok, message = ref.check_implementation(data, sub.custom_kernel(data))
        assert ok, (wl.name, message)
        data = ref.generate_input(**wl.axes, seed=100 + i)
        ok, _ = ref.check_implementation(data, bad.custom_kernel(data))
        assert not ok, wl.name


def test_data_layout_follows_the_import_and_plain_tasks_take_a_tuple_of_inputs():
    assert data_layout(load_task(GPUMODE / "vectoradd_py").definition) == (True, False)
    d = load_task(GPUMODE / "rowsum_py").definition
    assert data_layout(d) == (True, False)
    plain = d.model_copy(update={"tags": [], "reference": "def run(x, out):\n    return x.sum(1)\n"})
    assert data_layout(plain) == (True, False)  # two inputs: a tuple; one output: itself


def test_submission_copies_nothing_of_the_problems_files(tmp_path):
    task = load_task(GPUMODE / "vectoradd_py")
    text = export_candidate(Candidate(target="cpu", sources={"kernel.c": KERNELS["vectoradd_py"][0]}),
                            task.definition, tmp_path / "submission.py", {}, "gpumode").read_text()
    assert "def custom_kernel(data)" in text
    assert "generate_input" not in text and "make_match_reference" not in text and "_KSEARCH_SOURCES" not in text
