"""Compare a candidate's outputs with the reference's, in the parent process.

Pass rule per element: finite, and |got - want| <= atol + rtol * |want| (NumPy's allclose rule, but NaN- and
Inf-aware: a non-finite value where the reference is finite fails; so does a finite value where it is not).
"""

from __future__ import annotations

import numpy as np

from ksearch.eval.records import Status
from ksearch.tasks.definition import Tolerance


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[Status, float, float, str]:
    """Check one output.

    Args:
        got: the candidate's output, widened to float64.
        want: the reference output, float64.
        tol: the output dtype's tolerance.

    Returns:
        (status, max_abs_err, max_rel_err, message). ``max_rel_err`` is max |got - want| / |want| over elements
        with |want| > atol (relative error is meaningless where the reference is about zero).
    """
    if got.shape != want.shape:
        return Status.INCORRECT_SHAPE, float("nan"), float("nan"), f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return Status.PASSED, 0.0, 0.0, ""
    want_finite = np.isfinite(want)
    got_finite = np.isfinite(got)
    bad_finite = want_finite & ~got_finite
    if bad_finite.any():
        n = int(bad_finite.sum())
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad_finite)), got.shape))
        return (Status.INCORRECT_NUMERICAL, float("inf"), float("inf"),
                f"{n} non-finite values where the reference is finite (first at {first}: {got[first]})")
    if (~want_finite & ~(got == want)).any():
        return Status.INCORRECT_NUMERICAL, float("inf"), float("inf"), "non-finite reference values not reproduced"
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(np.where(want_finite, got - want, 0.0))
    mag = np.abs(np.where(want_finite, want, 0.0))
    max_abs = float(diff.max())
    significant = mag > tol.atol
    max_rel = float((diff[significant] / mag[significant]).max()) if significant.any() else 0.0
    excess = diff - (tol.atol + tol.rtol * mag)
    if (excess > 0).any():
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), got.shape))
        n = int((excess > 0).sum())
        return (Status.INCORRECT_NUMERICAL, max_abs, max_rel,
                f"{n} of {got.size} elements outside atol={tol.atol:g} rtol={tol.rtol:g}; worst at {worst}: "
                f"got {got[worst]:.6g}, expected {want[worst]:.6g}")
    return Status.PASSED, max_abs, max_rel, ""
