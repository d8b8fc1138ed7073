"""The judge's cache eviction (targets/native/evict.c): built in the compile jail, loaded by the worker before the
kernel, and harmless to the data it evicts."""

import ctypes
import platform

import numpy as np
import pytest

from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import LoadReply, LoadRequest
from ksearch.tasks import load_task

NATIVE = platform.machine() in ("x86_64", "aarch64", "arm64")


@pytest.fixture(scope="module")
def judge():
    ev = Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[1]))
    yield ev
    ev.close()


@pytest.mark.skipif(not NATIVE, reason="eviction instructions are written for x86-64 and AArch64 only")
def test_the_library_builds_once_and_leaves_the_data_as_it_was(judge):
    lib_path = judge.evict_library()
    assert lib_path is not None and lib_path.is_file() and lib_path.name.startswith("evict-")
    assert judge.target.evict_library() == lib_path  # cached: the same file
    lib = ctypes.CDLL(str(lib_path))
    assert lib.ksearch_evict_supported() == 1
    evict = lib.ksearch_evict
    evict.argtypes, evict.restype = [ctypes.c_void_p, ctypes.c_size_t], None
    data = np.random.default_rng(0).standard_normal(300_001)  # not a whole number of lines or pages
    want = data.copy()
    evict(data.ctypes.data + 3, data.nbytes - 3)  # unaligned start
    evict(data.ctypes.data, 0)
    assert np.array_equal(data, want)


def test_the_worker_says_whether_it_evicts_with_the_library(judge, tmp_path):
    cand = judge.naive_candidate()
    built = judge.target.compile(cand, judge.definition)
    assert built.ok, built.log
    lib = judge.evict_library()
    for evict in ([lib] if lib is not None else []) + [None]:
        worker = judge.start_worker(tmp_path / f"w{evict is None}", built.artifact, 1)
        try:
            reply = worker.request(LoadRequest(target="cpu", artifact=str(built.artifact),
                                               evict=str(evict) if evict else None, candidate=cand,
                                               definition=judge.definition.model_dump(mode="json")), 60.0)
        finally:
            worker.close()
        assert isinstance(reply, LoadReply), reply
        assert reply.evict is (evict is not None) and reply.clock == "controller"
    assert lib is not None or not NATIVE


def test_the_buffer_written_without_the_library_is_capped():
    from ksearch.eval.evaluator import FLUSH_CAP_BYTES

    class BigL3:  # a VM's CPU reporting its host's whole L3
        def last_level_cache_bytes(self):
            return 480 << 20

    ev = Evaluator(load_task("selective-scan"), hardware=BigL3(), config=EvalConfig(seeds=[1]))
    wl = ev.task.select(["tiny"])[0]
    assert ev.flush_bytes(wl) == FLUSH_CAP_BYTES < 2 * (480 << 20)
    ev.close()


def test_a_damaged_library_leaves_the_worker_on_its_buffer(judge, tmp_path):
    cand = judge.naive_candidate()
    built = judge.target.compile(cand, judge.definition)
    junk = built.artifact.parent / "evict-junk-for-test.so"
    junk.write_bytes(b"not a shared object")
    worker = judge.start_worker(tmp_path / "w", built.artifact, 1)
    try:
        reply = worker.request(LoadRequest(target="cpu", artifact=str(built.artifact), evict=str(junk), candidate=cand,
                                           definition=judge.definition.model_dump(mode="json")), 60.0)
    finally:
        worker.close()
        junk.unlink()
    assert isinstance(reply, LoadReply) and reply.evict is False, reply
