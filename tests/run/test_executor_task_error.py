"""A host whose job fails in the task's own code (a reference that hangs or raises: a TaskError) stops the run
with that error (ksearch/run/host.py sends it as ``task-error``, ksearch/run/executor.py raises it), rather than
being lost, retried and recorded as the kernel's RUNTIME_ERROR."""

from __future__ import annotations

import multiprocessing as mp
from types import SimpleNamespace

import pytest

from ksearch.errors import TaskError
from ksearch.run.executor import LocalPool, Placement, _Slot


def test_a_task_error_from_a_local_host_is_raised_by_the_pool_not_recorded_against_the_kernel():
    ours, host = mp.Pipe()
    pool = LocalPool.__new__(LocalPool)  # no host processes: the slot's pipe is answered by hand
    pool._events, pool.progress = [], lambda msg: None
    slot = _Slot(0, Placement(cpus=None))
    slot.conn, slot.proc, slot.ready = ours, SimpleNamespace(is_alive=lambda: True), True
    slot.state.job = SimpleNamespace(node_id="n1")
    host.send(("task-error", "the reference of 'hang' on workload 'n=8' (seed 0001) did not finish in 300 s"))
    with pytest.raises(TaskError, match=r"^the reference of 'hang' .* did not finish in 300 s$"):
        pool._drain(slot)
    assert pool._events == [] and slot.state.job is None
