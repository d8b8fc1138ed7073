"""A run measures against the spec it stored: a resumed run uses it (no probing) unless it is provisional,
implausible or another device's; then it is probed again and the run's record updated."""

from __future__ import annotations

import pytest

from ksearch.errors import HardwareError
from ksearch.hardware.cpu import detect_cpu
from ksearch.targets import base
from ksearch.targets.base import spec_for_run


@pytest.fixture
def here(tiny_spec):
    """tiny_spec as a spec of this machine's CPU (model, cores, threads as detected)."""
    info = detect_cpu()
    return tiny_spec.model_copy(update={"model": info.model, "cores": info.cores, "threads": info.threads})


@pytest.fixture
def probes(monkeypatch, here):
    """Count calls of spec_for_target (the probing path); each returns `here` with 99 GB/s."""
    calls = []

    def fake(target):
        calls.append(target)
        return here.model_copy(update={"memory_bandwidth_gbs": 99.0})

    monkeypatch.setattr(base, "spec_for_target", fake)
    return calls


def test_a_trusted_stored_spec_of_this_device_is_used_as_it_is(here, probes):
    stored = here.model_dump(mode="json")
    assert spec_for_run("cpu", stored) == here and probes == []


@pytest.mark.parametrize("change, why", [
    ({"provisional": "probed under load"}, "provisional"),
    ({"memory_bandwidth_gbs": 0.01}, "implausible"),
    ({"model": "Another CPU"}, "another device"),
    ({"kind": "gpu"}, "a GPU spec for the cpu target"),
    ({"peak_flops": "not a dict"}, "does not validate"),
])
def test_a_stored_spec_that_cannot_be_trusted_is_probed_again(here, probes, change, why):
    stored = {**here.model_dump(mode="json"), **change}
    assert spec_for_run("cpu", stored).memory_bandwidth_gbs == 99.0 and probes == ["cpu"], why


def test_no_stored_spec_probes(probes):
    assert spec_for_run("cpu", None).memory_bandwidth_gbs == 99.0 and probes == ["cpu"]


def test_a_resumed_session_uses_the_runs_spec_and_stores_a_reprobed_one(here, probes, monkeypatch):
    from ksearch.run.controller import RunConfig
    from ksearch.run.session import Session
    from ksearch.store.db import Store
    from ksearch.store.runs import run_dir

    with Session.create(RunConfig(task="selective-scan", workloads=["tiny"], budget=1)) as s:
        run_id = s.run_id
        assert s.hardware.memory_bandwidth_gbs == 99.0 and probes == ["cpu"]
    store = Store(run_dir(run_id) / "run.sqlite")
    store.set_hardware(here.model_copy(update={"memory_bandwidth_gbs": 42.0}).model_dump(mode="json"))
    store.close()

    def refuse(target):
        raise HardwareError("resume must not probe: the run has a trusted spec")

    monkeypatch.setattr(base, "spec_for_target", refuse)
    with Session.resume(run_id) as s:
        assert s.hardware.memory_bandwidth_gbs == 42.0 and s.evaluator.hardware is s.hardware

    store = Store(run_dir(run_id) / "run.sqlite")
    store.set_hardware(here.model_copy(update={"provisional": "probed under load"}).model_dump(mode="json"))
    store.close()
    monkeypatch.setattr(base, "spec_for_target", lambda target: here.model_copy(update={"memory_bandwidth_gbs": 7.0}))
    with Session.resume(run_id) as s:
        assert s.hardware.memory_bandwidth_gbs == 7.0
    store = Store(run_dir(run_id) / "run.sqlite")
    assert store.hardware()["memory_bandwidth_gbs"] == 7.0 and store.hardware()["provisional"] is None
    store.close()
