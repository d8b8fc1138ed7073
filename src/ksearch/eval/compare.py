"""Compare a candidate's outputs with the reference's, in the parent process.

Pass rule per element: finite, and |got - want| <= atol + rtol * |want| (NumPy's allclose rule, but NaN- and
Inf-aware: a non-finite value where the reference is finite fails; so does a finite value where it is not).
Large outputs are compared in float32 (rounding ~6e-8 relative, far below any task tolerance); small ones in
float64.
"""

from __future__ import annotations

import numpy as np

from ksearch.eval.records import Status
from ksearch.tasks.definition import Tolerance

_FLOAT64_UP_TO = 1 << 20  # elements


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[Status, float, float, str]:
    """Check one output.

    Args:
        got: the candidate's output (any float dtype; bfloat16 already decoded).
        want: the reference output (float64, or float32 for large outputs).
        tol: the output dtype's tolerance.

    Returns:
        (status, max_abs_err, max_rel_err, message). ``max_rel_err`` is max |got - want| / |want| over elements
        with |want| > atol (relative error is meaningless where the reference is about zero).
    """
    if got.shape != want.shape:
        return Status.INCORRECT_SHAPE, float("nan"), float("nan"), f"shape {got.shape}, expected {want.shape}"
    if got.size == 0:
        return Status.PASSED, 0.0, 0.0, ""
    work = np.float64 if want.size <= _FLOAT64_UP_TO else np.float32
    g = got.astype(work, copy=False)
    w = want.astype(work, copy=False)
    g_finite, w_finite = np.isfinite(g), np.isfinite(w)
    bad_finite = w_finite & ~g_finite
    if bad_finite.any():
        n = int(bad_finite.sum())
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad_finite)), got.shape))
        return (Status.INCORRECT_NUMERICAL, float("inf"), float("inf"),
                f"{n} non-finite values where the reference is finite (first at {first}: {got[first]})")
    if not w_finite.all():
        if (~w_finite & ~(g == w)).any():
            return Status.INCORRECT_NUMERICAL, float("inf"), float("inf"), "non-finite reference values not reproduced"
        g, w = np.where(w_finite, g, 0), np.where(w_finite, w, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.subtract(g, w)
        np.abs(diff, out=diff)
        mag = np.abs(w)
        bound = mag * work(tol.rtol)
        bound += work(tol.atol)
    max_abs = float(diff.max())
    significant = mag > tol.atol
    max_rel = float((diff[significant] / mag[significant]).max()) if significant.any() else 0.0
    over = diff > bound
    if over.any():
        excess = diff - bound
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), got.shape))
        n = int(over.sum())
        return (Status.INCORRECT_NUMERICAL, max_abs, max_rel,
                f"{n} of {got.size} elements outside atol={tol.atol:g} rtol={tol.rtol:g}; worst at {worst}: "
                f"got {float(got[worst]):.6g}, expected {float(want[worst]):.6g}")
    return Status.PASSED, max_abs, max_rel, ""
