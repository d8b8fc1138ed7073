"""The cpu target's Runner (ksearch.targets.cpu_runtime) and its argument mapping (ksearch.targets.host_args), in this
process; and the Runner bases' refusals of the other clock's ops (ksearch.targets.base)."""

import numpy as np
import pytest

from ksearch.errors import UnsupportedOp
from ksearch.protocol import ArgRef, ArrayRef, ScalarRef, TimingPlan
from ksearch.records import Candidate
from ksearch.targets import host_args
from ksearch.targets.base import DeviceClockRunner
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

#: out = u + 1, last_state = 0 (the selective-scan ABI, fp32)
PLUS_ONE = """#include <stdint.h>
void run(const float *u, const float *delta, const float *A, const float *B, const float *C, const float *D,
         const float *z, const float *delta_bias, const float *h0, float *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {
    for (int64_t i = 0; i < batch * dim * seqlen; i++) out[i] = u[i] + 1.0f;
    for (int64_t i = 0; i < batch * dim * dstate; i++) last_state[i] = 0.0f;
}"""
AXES = {"batch": 1, "dim": 3, "dstate": 2, "seqlen": 5}


@pytest.fixture(scope="module")
def definition():
    return load_task("selective-scan").definition


@pytest.fixture(scope="module")
def runner(definition):
    cand = Candidate(target="cpu", sources={"kernel.c": PLUS_ONE})
    built = CpuTarget().compile(cand, definition)
    assert built.ok, built.log
    return CpuTarget().load(built.artifact, cand, definition)


def arg_refs(definition, tmp_path) -> tuple[list[ArgRef], np.ndarray]:
    refs: list[ArgRef] = []
    u = None
    for name, spec in definition.inputs.items():
        a = np.random.default_rng(len(refs)).standard_normal(definition.shape_of(spec, AXES)).astype(np.float32)
        u = a if name == "u" else u
        a.tofile(tmp_path / name)
        refs.append(ArrayRef(path=str(tmp_path / name), dtype=a.dtype.str, shape=a.shape))
    for name, spec in definition.outputs.items():
        shape = tuple(definition.shape_of(spec, AXES))
        np.full(shape, np.nan, np.float32).tofile(tmp_path / name)
        refs.append(ArrayRef(path=str(tmp_path / name), dtype="<f4", shape=shape, writable=True))
    return refs + [ScalarRef(value=AXES[a]) for a in definition.axes], u


def test_an_untimed_call_writes_the_output_files(runner, definition, tmp_path):
    args, u = arg_refs(definition, tmp_path)
    assert runner.clock == "controller"
    runner.call(args)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "out", np.float32).reshape(u.shape), u + 1)
    with pytest.raises(UnsupportedOp, match="go before prepare"):  # an untimed call leaves nothing prepared
        runner.go()


def test_prepare_evicts_every_argument_buffer_then_go_calls(runner, definition, tmp_path):
    args, u = arg_refs(definition, tmp_path)
    seen: list = []
    runner.evict = lambda addr, nbytes: seen.append(nbytes)
    try:
        runner.prepare(args, flush_bytes=1 << 20)
        sizes = sorted(a.size * 4 for a in args if isinstance(a, ArrayRef))
        assert sorted(seen) == sizes  # the inputs' mappings and the outputs, each once
        runner.go()
        np.testing.assert_array_equal(np.fromfile(tmp_path / "out", np.float32).reshape(u.shape), u + 1)
        seen.clear()
        runner.prepare(args, flush_bytes=0)  # no flush asked: nothing evicted
        assert seen == []
    finally:
        runner.evict = None


def test_without_the_library_prepare_writes_a_buffer_and_inputs_move(runner, definition, tmp_path):
    args, _ = arg_refs(definition, tmp_path)
    addresses = set()
    for _ in range(3):
        runner.prepare(args, flush_bytes=4096)
        addresses.add(runner._args[0])
    assert runner._flush.buffer is not None and runner._flush.buffer.nbytes == 4096
    assert len(addresses) > 1  # a fresh random address each time (a collision of all three: ~1e-7)


def test_a_runner_refuses_the_other_clocks_ops(runner):
    with pytest.raises(UnsupportedOp, match="CpuRunner is timed by the controller's clock"):
        runner.timed([], None, TimingPlan())

    class Device(DeviceClockRunner):
        pass

    dev = Device()
    assert dev.clock == "device" and dev.evict is None
    for op in (lambda: dev.prepare([], 0), dev.go):
        with pytest.raises(UnsupportedOp, match="Device is timed by the device's events"):
            op()


def test_inputs_are_mapped_read_only_at_a_random_address(tmp_path):
    data = np.arange(1000, dtype=np.float32)
    data.tofile(tmp_path / "x")
    m = host_args.RandomMap(str(tmp_path / "x"), data.nbytes)
    try:
        assert m.base <= m.addr < m.base + m.total and (m.addr - m.base) % 4096 == 0
        view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * 1000).from_address(m.addr))
        np.testing.assert_array_equal(view, data)
    finally:
        m.close()
    assert m.base is None
    args, outputs, keep = host_args.map_args([ArrayRef(path="unused", dtype="<f4", shape=(0, 3)), ScalarRef(value=2.5)])
    assert args[1] == 2.5 and outputs == [] and list(host_args.buffers(keep)) == [(args[0], 0)]
    host_args.release(keep)
