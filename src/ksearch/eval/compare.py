"""Compare a candidate's outputs with the reference's, in the parent process.

Pass rule per element: finite, and |got - want| <= atol + rtol * |want| (NumPy's allclose rule, but NaN- and
Inf-aware: a non-finite value where the reference is finite fails; so does a finite value where it is not).
A tolerance with ``rule: either`` (flashinfer-bench's) bounds each element by max(atol, rtol * (|want| + 1e-8))
instead, and one with ``matched_ratio`` below 1 lets that share of finite elements be outside the bound
(`ksearch.tasks.definition.Tolerance`). Large outputs are compared in float32 (rounding ~6e-8 relative, far below
any task tolerance); small ones in float64.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ksearch.records import Status
from ksearch.tasks.definition import Tolerance

_FLOAT64_UP_TO = 1 << 20  # elements


#: (want, dtype, atol, rtol) -> atol + rtol * |want| (None: want is not finite everywhere), the latest few: the
#: kernels of a timed round are checked one after another against the same reference (held here, so no id repeats)
_BOUNDS: OrderedDict[tuple, tuple[np.ndarray, np.ndarray | None]] = OrderedDict()
_BOUNDS_KEEP = 4


def _bound_of(mag: np.ndarray, work, tol: Tolerance) -> np.ndarray:
    """Each element's bound on |got - want| from |want| (``mag``, reused as the result)."""
    if tol.rule == "either":  # flashinfer-bench: abs <= atol or abs / (|want| + 1e-8) <= rtol
        mag += work(1e-8)
        mag *= work(tol.rtol)
        return np.maximum(mag, work(tol.atol), out=mag)
    mag *= work(tol.rtol)
    mag += work(tol.atol)
    return mag


def _allowed(size: int, tol: Tolerance) -> int:
    """How many elements of an output of ``size`` may be outside their bound (flashinfer-bench: an output fails
    when the share of matched elements is below ``required_matched_ratio``)."""
    return 0 if tol.matched_ratio >= 1 else int(size - tol.matched_ratio * size + 1e-9)


def _bound(want: np.ndarray, work, tol: Tolerance) -> np.ndarray | None:
    key = (id(want), np.dtype(work).str, tol.atol, tol.rtol, tol.rule)
    hit = _BOUNDS.get(key)
    if hit is not None:
        _BOUNDS.move_to_end(key)
        return hit[1]
    w = want.astype(work, copy=False)
    bound = None
    if np.isfinite(w).all():
        bound = _bound_of(np.abs(w), work, tol)
    _BOUNDS[key] = (want, bound)
    while len(_BOUNDS) > _BOUNDS_KEEP:
        _BOUNDS.popitem(last=False)
    return bound


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance, errors: bool = True,
            used: list[float] | None = None) -> tuple[Status, float, float, str]:
    """Check one output.

    Args:
        got: the candidate's output (any float dtype; bfloat16 already decoded).
        want: the reference output (float64, or float32 for large outputs).
        tol: the output dtype's tolerance.
        errors: compute the largest errors of a passing output (False: the verdict only, as the timed calls'
            checks need it; about half the passes over the data).
        used: when a list is given and the errors are computed, the share of the tolerance the worst element
            takes is appended to it: max |got - want| / (atol + rtol |want|) (1.0: at the tolerance; above 1:
            failed).

    Returns:
        (status, max_abs_err, max_rel_err, message). ``max_rel_err`` is max |got - want| / |want| over elements
        with |want| > atol (relative error is meaningless where the reference is about zero); both NaN for a
        passing output checked with ``errors=False``.
    """
    if got.shape != want.shape:
        return Status.INCORRECT_SHAPE, float("nan"), float("nan"), f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return Status.PASSED, 0.0, 0.0, ""
    got, want = np.atleast_1d(got), np.atleast_1d(want)  # a 0-d output: NumPy's ufuncs give scalars for 0-d arrays
    work = np.float64 if want.size <= _FLOAT64_UP_TO else np.float32
    g = got.astype(work, copy=False)
    if not errors:
        bound = _bound(want, work, tol)
        if bound is not None:  # a finite reference: |got - want| <= bound everywhere (false for NaN) is a pass
            with np.errstate(over="ignore", invalid="ignore"):
                diff = np.subtract(g, want.astype(work, copy=False))
                np.abs(diff, out=diff)
            if np.less_equal(diff, bound).all() or (
                    _allowed(got.size, tol) and np.isfinite(diff).all()
                    and int(np.count_nonzero(~np.less_equal(diff, bound))) <= _allowed(got.size, tol)):
                return Status.PASSED, float("nan"), float("nan"), ""
    w = want.astype(work, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.subtract(g, w)
    if not np.isfinite(diff).all():  # a non-finite value on either side (or an overflow): the careful path
        g_finite, w_finite = np.isfinite(g), np.isfinite(w)
        bad_finite = w_finite & ~g_finite
        if bad_finite.any():
            n = int(bad_finite.sum())
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad_finite)), got.shape))
            return (Status.INCORRECT_NUMERICAL, float("inf"), float("inf"),
                    f"{n} non-finite values where the reference is finite (first at {first}: {got[first]})")
        if not w_finite.all():
            if (~w_finite & ~(g == w)).any():
                return (Status.INCORRECT_NUMERICAL, float("inf"), float("inf"),
                        "non-finite reference values not reproduced")
            g, w = np.where(w_finite, g, 0), np.where(w_finite, w, 0)
        with np.errstate(over="ignore", invalid="ignore"):
            diff = np.subtract(g, w)
    with np.errstate(over="ignore", invalid="ignore"):
        np.abs(diff, out=diff)
        mag = np.abs(w)
        bound = _bound_of(mag.copy(), work, tol)
    over = diff > bound
    failed = int(np.count_nonzero(over)) > _allowed(got.size, tol)
    if not failed and not errors:
        return Status.PASSED, float("nan"), float("nan"), ""
    max_abs = float(diff.max())
    if used is not None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            used.append(float(np.divide(diff, bound).max()))
    significant = mag > tol.atol
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        rel = np.divide(diff, mag, out=np.zeros_like(diff), where=significant)
    max_rel = float(rel.max())
    if failed:
        excess = diff - bound
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), got.shape))
        n = int(over.sum())
        rule = "" if tol.rule == "sum" else f" ({tol.rule})"
        share = "" if tol.matched_ratio >= 1 else f", more than the {1 - tol.matched_ratio:.3g} share allowed"
        return (Status.INCORRECT_NUMERICAL, max_abs, max_rel,
                f"{n} of {got.size} elements outside atol={tol.atol:g} rtol={tol.rtol:g}{rule}{share}; worst at "
                f"{worst}: got {float(got[worst]):.6g}, expected {float(want[worst]):.6g}")
    return Status.PASSED, max_abs, max_rel, ""
