"""ksearch.integrations.mlx_scan: the reference scan against the task's float64 reference, and the exact
initial-state correction (a scan split in two == the scan in one piece)."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from ksearch.integrations.mlx_scan import initial_state_terms, reference_scan  # noqa: E402
from ksearch.tasks.definition import Workload  # noqa: E402
from ksearch.tasks.inputs import make_inputs  # noqa: E402
from ksearch.tasks.loader import load_task  # noqa: E402
from ksearch.tasks.reference import run_reference  # noqa: E402

pytestmark = pytest.mark.mlx


def _inputs(task, seed, **axes):
    d = load_task(task).definition
    inp = make_inputs(d, Workload(axes=axes), seed)
    return d, inp, {k: mx.array(v) for k, v in inp.items()}


def _close(got, want, rtol, atol):
    got = np.array(got.astype(mx.float32), dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
@pytest.mark.parametrize("axes,chunk", [(dict(batch=1, dim=3, dstate=2, seqlen=1), 128),
                                        (dict(batch=2, dim=5, dstate=4, seqlen=37), 8),
                                        (dict(batch=2, dim=7, dstate=16, seqlen=300), 128)])
def test_reference_scan_matches_the_task_reference(task, axes, chunk):
    d, inp, args = _inputs(task, 1, **axes)
    want = run_reference(d, inp)
    out, last = reference_scan(**args, chunk=chunk)
    assert out.dtype == args["u"].dtype and last.dtype == mx.float32
    tol = d.tolerance[str(args["u"].dtype).split(".")[-1]]
    _close(out, want["out"], tol.rtol, tol.atol)
    _close(last, want["last_state"], tol.rtol, tol.atol)


def test_reference_scan_rejects_a_bad_shape():
    _, _, args = _inputs("selective-scan", 0, batch=1, dim=4, dstate=2, seqlen=5)
    args["B"] = args["B"].transpose(0, 2, 1)  # [batch, seqlen, dstate]: mlx-lm's layout, not the task's
    with pytest.raises(ValueError, match="B has shape"):
        reference_scan(**args)


@pytest.mark.parametrize("split", [1, 17, 39])
def test_initial_state_terms_continue_a_scan_exactly(split):
    """scan(tokens[:split]) then scan(tokens[split:]) + the correction from its state == scan(all tokens)."""
    _, _, a = _inputs("selective-scan", 2, batch=2, dim=6, dstate=4, seqlen=40)
    a["A"] = a["A"] / 16  # slow decay, so the first part's state still matters at the end
    out, last = reference_scan(**a)

    def part(t0, t1):
        return {k: (v[..., t0:t1] if k in ("u", "delta", "z", "B", "C") else v) for k, v in a.items()}

    _, h = reference_scan(**part(0, split))
    second = part(split, 40)
    out2, last2 = reference_scan(**second)
    extra, state_extra = initial_state_terms(h, second["delta"], second["A"], second["C"], second["z"],
                                             second["delta_bias"], chunk=7)
    assert float(mx.abs(extra).max()) > 1e-2  # the correction is not negligible here
    np.testing.assert_allclose(np.array(out2 + extra), np.array(out[..., split:]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(last2 + state_extra), np.array(last), rtol=1e-4, atol=1e-5)
