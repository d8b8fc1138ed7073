"""ksearch.integrations.mlx_scan: the reference scan against the task's float64 reference (from a zero and from
a drawn initial state), and a scan split in two, the second half from the first's last state, == the scan in one
piece."""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from ksearch.integrations.mlx_scan import reference_scan  # noqa: E402
from ksearch.tasks.definition import Distribution, Workload  # noqa: E402
from ksearch.tasks.inputs import make_inputs  # noqa: E402
from ksearch.tasks.loader import load_task  # noqa: E402
from ksearch.tasks.reference import run_reference  # noqa: E402

pytestmark = pytest.mark.mlx


def _inputs(task, seed, h0_std=0.0, **axes):
    d = load_task(task).definition
    dists = {"h0": Distribution(kind="normal", std=h0_std)} if h0_std else {}
    inp = make_inputs(d, Workload(axes=axes, distributions=dists), seed)
    return d, inp, {k: mx.array(v) for k, v in inp.items()}


def _close(got, want, rtol, atol):
    got = np.array(got.astype(mx.float32), dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
@pytest.mark.parametrize("axes,chunk,h0_std", [(dict(batch=1, dim=3, dstate=2, seqlen=1), 128, 0.0),
                                               (dict(batch=2, dim=5, dstate=4, seqlen=37), 8, 0.0),
                                               (dict(batch=2, dim=5, dstate=4, seqlen=37), 8, 1.0),
                                               (dict(batch=2, dim=7, dstate=16, seqlen=300), 128, 0.0),
                                               (dict(batch=1, dim=7, dstate=16, seqlen=130), 64, 2.0)])
def test_reference_scan_matches_the_task_reference(task, axes, chunk, h0_std):
    d, inp, args = _inputs(task, 1, h0_std, **axes)
    assert (np.abs(inp["h0"]).max() > 0.1) == bool(h0_std)
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


def test_reference_scan_rejects_a_bad_initial_state():
    _, _, args = _inputs("selective-scan", 0, batch=1, dim=4, dstate=2, seqlen=5)
    args["h0"] = args["h0"].transpose(0, 2, 1)
    with pytest.raises(ValueError, match="h0 has shape"):
        reference_scan(**args)


@pytest.mark.parametrize("split", [1, 17, 39])
def test_a_scan_continued_from_its_last_state_is_the_scan_in_one_piece(split):
    """scan(tokens[:split]) then scan(tokens[split:], h0 = its last state) == scan(all tokens)."""
    _, _, a = _inputs("selective-scan", 2, batch=2, dim=6, dstate=4, seqlen=40)
    a["A"] = a["A"] / 16  # slow decay, so the first part's state still matters at the end
    out, last = reference_scan(**a)

    def part(t0, t1):
        return {k: (v[..., t0:t1] if k in ("u", "delta", "z", "B", "C") else v) for k, v in a.items()}

    out1, h = reference_scan(**part(0, split))
    out2, last2 = reference_scan(**{**part(split, 40), "h0": h}, chunk=7)
    _, last_zero = reference_scan(**part(split, 40), chunk=7)
    assert float(mx.abs(last2 - last_zero).max()) > 1e-2  # the initial state is not negligible here
    np.testing.assert_allclose(np.array(mx.concatenate([out1, out2], axis=2)), np.array(out), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(last2), np.array(last), rtol=1e-4, atol=1e-5)
