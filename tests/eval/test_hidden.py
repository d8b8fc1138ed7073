"""Hidden workloads: drawn from the axes' valid ranges, reproducible from their seed, never a public shape,
never larger than the public ones, always valid."""

import pytest

from ksearch.errors import TaskError
from ksearch.eval.hidden import axis_ranges, draw_hidden_workloads
from ksearch.tasks import load_task
from ksearch.tasks.definition import Definition, Workload

TASK = load_task("selective-scan")
PUBLIC = TASK.select(["tiny", "small-b2"])


def test_draws_are_valid_fresh_and_bounded():
    d = TASK.definition
    limit = max(d.cost_of(w).bytes for w in PUBLIC)
    shown = [w.axes for w in TASK.workloads]
    for seed in range(20):
        for w in draw_hidden_workloads(d, seed, 4, PUBLIC):
            d.axis_values(w)  # satisfies the constraints
            assert w.purpose == "check" and w.axes not in shown
            assert d.cost_of(w).bytes <= limit
            for name, (lo, hi) in axis_ranges(d, PUBLIC).items():
                assert lo <= w.axes[name] <= hi


def test_same_seed_same_workloads_other_seed_other_ones():
    a = [w.axes for w in draw_hidden_workloads(TASK.definition, 42, 4, PUBLIC)]
    assert a == [w.axes for w in draw_hidden_workloads(TASK.definition, 42, 4, PUBLIC)]
    assert a != [w.axes for w in draw_hidden_workloads(TASK.definition, 43, 4, PUBLIC)]
    assert len({tuple(sorted(x.items())) for x in a}) == 4


def _definition(axes: dict, constraints: list[str]) -> Definition:
    return Definition(name="t", axes=axes, inputs={"x": {"shape": ["n", "m"], "dtype": "float32"}},
                      outputs={"y": {"shape": ["n"], "dtype": "float32"}}, constraints=constraints,
                      reference="def run(x):\n    return x.sum(1)\n")


def test_ranges_fall_back_to_the_public_workloads_and_constraints_hold():
    d = _definition({"n": {"type": "var"}, "m": {"type": "var", "min": 2, "max": 64}}, ["m % 2 == 0"])
    public = [Workload(axes={"n": 10, "m": 8}), Workload(axes={"n": 300, "m": 16})]
    assert axis_ranges(d, public) == {"n": (10, 300), "m": (2, 64)}
    for w in draw_hidden_workloads(d, 1, 5, public):
        assert 10 <= w.axes["n"] <= 300 and w.axes["m"] % 2 == 0


def test_impossible_constraints_raise():
    d = _definition({"n": {"type": "var", "min": 1, "max": 4}, "m": {"type": "var", "min": 1, "max": 4}}, ["n > 10"])
    with pytest.raises(TaskError, match="no valid hidden workload"):
        draw_hidden_workloads(d, 0, 1, [], tries=20)
