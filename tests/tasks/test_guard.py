"""Running a task's own code (ksearch/tasks/guard.py): failures and hangs become one-line task errors, and the
judge bounds the task code it runs (its reference, its input generator) so that a hung one ends `ksearch eval`."""

from __future__ import annotations

import json
import sys
import time

import pytest

from ksearch.errors import TaskError, TaskTimeout
from ksearch.eval.casedata import CaseData
from ksearch.eval.evaluator import EvalConfig
from ksearch.tasks.definition import Definition, Workload
from ksearch.tasks.guard import TimeUp, task_code, time_limit


def test_an_exception_or_exit_in_task_code_is_a_one_line_task_error():
    with pytest.raises(TaskError, match=r"^problem.py: get_inputs\(\) raised ValueError: first$"):
        with task_code("problem.py: get_inputs() raised"):
            raise ValueError("first\nsecond line of a long message")
    with pytest.raises(TaskError, match=r"^reference of 'x' failed: SystemExit: 3$"):
        with task_code("reference of 'x' failed:"):
            raise SystemExit(3)
    own = TaskError("ksearch's own words")
    with pytest.raises(TaskError) as e, task_code("outer:"):
        raise own
    assert e.value is own


def test_a_hang_is_a_task_timeout_and_an_outer_limit_keeps_its_deadline():
    with pytest.raises(TaskTimeout, match=r"^reference of 'x' did not finish in 0.1 s$"):
        with task_code("reference of 'x' failed:", 0.1):
            while True:
                time.sleep(0.005)
    t0 = time.monotonic()  # the inner limit is longer than what the outer has left: the outer's fires, and says so
    with pytest.raises(TaskTimeout, match="outer did not finish in 0.2 s"):
        with task_code("outer failed:", 0.2, late="outer did not finish"), task_code("inner failed:", 5.0):
            while True:
                time.sleep(0.005)
    assert time.monotonic() - t0 < 2
    with time_limit(None) as token:  # no limit: nothing is armed
        time.sleep(0.01)
    assert token is not None and not issubclass(TimeUp, Exception)


HANG = "import time\ndef run(x):\n    while True:\n        time.sleep(0.005)\n"


def _definition(reference: str = "def run(x):\n    return x\n", generator: str | None = None) -> Definition:
    return Definition.model_validate({
        "name": "hang", "axes": {"n": {"type": "var"}}, "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n"], "dtype": "float32"}}, "reference": reference, "reference_backend": "numpy",
        **({"input_generator": generator} if generator else {})})


def test_the_judge_bounds_the_reference_and_the_input_generator():
    wl = Workload(axes={"n": 8})
    data = CaseData(_definition(HANG), 1 << 20, 1 << 20, task_limit_s=0.2)
    try:
        inputs, _ = data.inputs(wl, 1)
        with pytest.raises(TaskTimeout, match=r"the reference of 'hang' on workload 'n=8' \(seed 0001\) did not "
                                              r"finish in 0.2 s"):
            data.reference(wl, 1, inputs)
    finally:
        data.close()
    stuck = _definition(generator="def generate(seed, **axes):\n    while True:\n        pass\n")
    data = CaseData(stuck, 1 << 20, 1 << 20, task_limit_s=0.2)
    try:
        with pytest.raises(TaskTimeout, match=r"making the inputs of 'hang'.s workload 'n=8' \(seed 0001\) did not"):
            data.inputs(wl, 1)
    finally:
        data.close()
    assert EvalConfig(timeout_s=2).task_limit_s() == 60 and EvalConfig(timeout_s=30).task_limit_s() == 150
    assert EvalConfig(reference_timeout_s=0.5).task_limit_s() == 0.5


def test_eval_of_a_task_whose_reference_hangs_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from ksearch.cli import main

    (tmp_path / "hang.json").write_text(json.dumps(_definition(HANG).model_dump(exclude_none=True)))
    (tmp_path / "hang.jsonl").write_text('{"axes": {"n": 8}}\n')
    (tmp_path / "k.py").write_text("def run(x, y, n):\n    y[:] = x\n")
    monkeypatch.setattr(sys, "argv", ["ksearch", "eval", str(tmp_path / "hang.json"), str(tmp_path / "k.py"),
                                      "--target", "null", "--workloads-file", str(tmp_path / "hang.jsonl"),
                                      "--no-naive", "--reference-timeout", "0.3"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the reference of 'hang'") and last.endswith("did not finish in 0.3 s"), err
    assert "Traceback" not in err


def test_a_timeout_that_the_interrupted_code_turns_into_another_error_is_still_a_timeout():
    """torch's C code may hand the alarm's exception back as a SystemError: once the limit fired, the error that
    comes out is the timeout, also through an inner guard without a limit (run_reference's inside CaseData's)."""
    def swallowing():
        try:
            while True:
                time.sleep(0.005)
        except TimeUp:
            raise SystemError("bad call flags") from None

    with pytest.raises(TaskTimeout, match=r"^outer did not finish in 0.1 s$"):
        with task_code("outer failed:", 0.1, late="outer did not finish"), task_code("inner failed:"):
            swallowing()
    # a caller that turns the inner TaskError into a verdict (run_checker does) never sees it: the outer's TimeUp
    with pytest.raises(TaskTimeout, match=r"^outer did not finish in 0.1 s$"):
        with task_code("outer failed:", 0.1, late="outer did not finish"):
            try:
                with task_code("the task's check raised"):
                    swallowing()
            except TaskError:
                pass
