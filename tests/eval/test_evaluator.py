import re

import numpy as np
import pytest

from ksearch.eval.compare import compare
from ksearch.eval.evaluator import EvalConfig, Evaluator
from ksearch.protocol import TimingPlan
from ksearch.records import Candidate, Status
from ksearch.tasks import load_task
from ksearch.tasks.definition import Tolerance

from . import kernels

SMALL = ["tiny", "small-b2", "odd"]
QUICK = TimingPlan(warmup=1, min_repeats=3, max_repeats=5, min_time_s=0.0, max_time_s=1.0, flush_bytes=1 << 20)


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator(load_task("selective-scan"), config=EvalConfig(seeds=[11, 12, 13], timeout_s=5.0, timing=QUICK))


def cand(src, name="kernel.c", **kw):
    return Candidate(target="cpu", sources={name: src}, **kw)


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
def test_naive_kernel_passes_and_is_timed(task):
    ev = Evaluator(load_task(task), config=EvalConfig(seeds=[1, 2, 3], timing=QUICK))
    res = ev.measure_naive(ev.task.select(SMALL))
    assert res.status is Status.PASSED, res.message
    for r in res.workloads:
        assert r.status is Status.PASSED and r.checks == 3
        assert r.median_ms > 0 and r.repeats >= 3 and r.achieved_gbs > 0
        assert r.max_abs_err < (1e-3 if task == "selective-scan" else 1e-2)  # fp16 output rounding
    assert set(ev.naive_ms) == set(SMALL)


def test_cxx_kernel_passes_with_speedup_vs_naive(evaluator):
    evaluator.measure_naive(evaluator.task.select(["small-b2"]))
    res = evaluator.evaluate(cand(kernels.CXX, "kernel.cpp"), ["small-b2"])
    assert res.status is Status.PASSED, res.message
    assert res.workloads[0].speedup_vs_naive > 0


def test_a_kernel_that_ignores_the_initial_state_fails_the_h0_workloads(evaluator):
    """Right from a zero state, wrong from a drawn one: the h0 check workloads catch it, the others cannot."""
    ignores = cand(kernels.IGNORES_H0)
    assert evaluator.evaluate(ignores, SMALL, timing=False).status is Status.PASSED
    for workload in ("h0", "h0-short"):
        res = evaluator.evaluate(ignores, [workload], timing=False)
        assert res.status is Status.INCORRECT_NUMERICAL, (workload, res.message)
    honest = evaluator.evaluate(cand(kernels.CXX, "kernel.cpp"), ["h0", "h0-short"], timing=False)
    assert honest.status is Status.PASSED, honest.message


@pytest.mark.parametrize("source, status, match", [
    (kernels.WRONG, Status.INCORRECT_NUMERICAL, "outside atol"),
    (kernels.ZEROS, Status.INCORRECT_NUMERICAL, "outside atol"),
    (kernels.NAN, Status.INCORRECT_NUMERICAL, "non-finite"),
    (kernels.SKIP_OUTPUT, Status.INCORRECT_NUMERICAL, "non-finite"),
    (kernels.SEGFAULT, Status.RUNTIME_ERROR, "SIGSEGV"),
    (kernels.ABORT, Status.RUNTIME_ERROR, "SIGABRT"),
    (kernels.MUTATE_INPUT, Status.RUNTIME_ERROR, "SIGSEGV|SIGBUS"),  # inputs are mapped read-only
    (kernels.SYNTAX_ERROR, Status.COMPILE_ERROR, "error"),
    (kernels.NO_ENTRY, Status.RUNTIME_ERROR, "no function 'run'"),
])
def test_broken_kernels_get_their_status(evaluator, source, status, match):
    res = evaluator.evaluate(cand(source), SMALL)
    assert res.status is status, res.message
    assert re.search(match, res.message), res.message
    if status is not Status.COMPILE_ERROR:
        assert res.workloads[0].status is status
        assert all(r.status is Status.SKIPPED for r in res.workloads[1:])


def test_endless_loop_times_out_and_is_killed(evaluator):
    import time

    t0 = time.monotonic()
    res = Evaluator(evaluator.task, config=EvalConfig(seeds=[1], timeout_s=1.5, timing=QUICK)).evaluate(
        cand(kernels.ENDLESS), ["tiny"])
    assert res.status is Status.TIMEOUT
    assert "1.5 s" in res.message
    assert time.monotonic() - t0 < 20


def test_evaluation_after_failures_still_works(evaluator):
    """A crashed worker does not poison the next evaluation."""
    evaluator.evaluate(cand(kernels.SEGFAULT), ["tiny"])
    res = evaluator.evaluate(evaluator.naive_candidate(), ["tiny"], timing=False)
    assert res.status is Status.PASSED


def test_candidate_id_is_content_hash():
    a = cand("int x;")
    assert a.id == cand("int x;", parent_id="p", meta={"k": 1}).id  # provenance does not change identity
    assert a.id != cand("int y;").id
    assert a.id != cand("int x;", compile_flags=["-ffast-math"]).id


def test_forbidden_compile_flags_are_refused(evaluator):
    res = evaluator.evaluate(cand(kernels.WRONG, compile_flags=["-o/tmp/evil.so"]), ["tiny"])
    assert res.status is Status.COMPILE_ERROR and "not allowed" in res.message


TOL = Tolerance(rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("n", [7, (1 << 20) + 3])  # float64 and float32 comparisons
def test_compare_without_errors_gives_the_same_verdict(n):
    rng = np.random.default_rng(n)
    want = rng.standard_normal(n)
    cases = [want.copy(), want + 1e-4, want * (1 + 2e-3), np.where(rng.random(n) < 1e-3, np.nan, want),
             np.where(rng.random(n) < 1e-3, np.inf, want), want.astype(np.float32)]
    ref_inf = want.copy()
    ref_inf[::5] = -np.inf
    cases_inf = [ref_inf.copy(), np.where(np.isinf(ref_inf), 0.0, ref_inf)]
    for got, ref in [(g, want) for g in cases] + [(g, ref_inf) for g in cases_inf]:
        full = compare(got, ref, TOL)
        quick = compare(got, ref, TOL, errors=False)
        assert quick[0] is full[0]
        if full[0] is Status.PASSED:
            finite = np.isfinite(ref)
            assert full[1] == pytest.approx(float(np.abs(got[finite] - ref[finite]).max()), rel=1e-5, abs=1e-6)  # float32 rounding
            assert np.isnan(quick[1]) and quick[3] == ""
        else:
            assert quick[3] == full[3]


def test_compare_takes_0d_outputs():
    one = np.array(1.0)
    for errors in (True, False):
        assert compare(one.copy(), one, TOL, errors)[0] is Status.PASSED
        assert compare(np.array(np.nan), one, TOL, errors)[0] is Status.INCORRECT_NUMERICAL
        assert compare(np.array(1.5), one, TOL, errors)[0] is Status.INCORRECT_NUMERICAL


def test_compare_statuses():
    want = np.array([1.0, -2.0, 1e-9])
    assert compare(want.copy(), want, TOL)[0] is Status.PASSED
    assert compare(want + 1e-4, want, TOL)[0] is Status.PASSED
    status, abs_err, rel_err, msg = compare(want * 1.01, want, TOL)
    assert status is Status.INCORRECT_NUMERICAL and abs_err == pytest.approx(0.02) and rel_err == pytest.approx(0.01)
    assert compare(np.array([np.nan, -2.0, 0.0]), want, TOL)[0] is Status.INCORRECT_NUMERICAL
    assert compare(np.array([np.inf, -2.0, 0.0]), want, TOL)[0] is Status.INCORRECT_NUMERICAL
    assert compare(want[:2], want, TOL)[0] is Status.INCORRECT_SHAPE
    # the reference's own non-finite values must be reproduced exactly
    ref = np.array([np.inf, 1.0])
    assert compare(np.array([np.inf, 1.0]), ref, TOL)[0] is Status.PASSED
    assert compare(np.array([1e30, 1.0]), ref, TOL)[0] is Status.INCORRECT_NUMERICAL
