"""bench/gpu/ss_baselines.py off the GPU (CPU torch tensors): the float64 reference, the token loop and the pscan
baseline agree with the task's NumPy reference from a drawn initial state h0, and a sequence scanned in two halves
(the second from the first's last state) is the sequence scanned whole. Skipped where torch is missing (CI)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ksearch.tasks import load_task  # noqa: E402
from ksearch.tasks.reference import run_reference  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "ss_baselines.py"
NAMES = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]


@pytest.fixture(scope="module")
def ss():
    spec = importlib.util.spec_from_file_location("ss_baselines", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_baselines_start_from_h0_as_the_task_does(ss):
    x = ss.make_inputs(2, 6, 4, 37, dtype=torch.float32, device="cpu", seed=1, h0_std=1.0)
    assert len(x) == 9 and x[-1].shape == (2, 6, 4) and float(x[-1].abs().max()) > 0.5
    want = run_reference(load_task("selective-scan").definition, {k: v.numpy() for k, v in zip(NAMES, x)})
    for fn in (ss.reference_f64, ss.token_loop, ss.pscan_scan):
        out, last = fn(*x)
        np.testing.assert_allclose(out.double().numpy(), want["out"], rtol=1e-4, atol=1e-4, err_msg=fn.__name__)
        np.testing.assert_allclose(last.double().numpy(), want["last_state"], rtol=1e-4, atol=1e-4,
                                   err_msg=fn.__name__)
    zero = ss.make_inputs(2, 6, 4, 37, dtype=torch.float32, device="cpu", seed=1)
    assert not zero[-1].any() and all(torch.equal(a, b) for a, b in zip(zero[:-1], x[:-1]))  # same other draws
    assert float((ss.token_loop(*zero)[0] - ss.token_loop(*x)[0]).abs().max()) > 1e-2


def test_two_halves_from_the_first_last_state_are_the_whole(ss):
    x = ss.make_inputs(1, 5, 3, 40, dtype=torch.float32, device="cpu", seed=2)
    out, last = ss.reference_f64(*x)
    seq = {0, 1, 3, 4, 6}  # u, delta, B, C, z

    def part(t0, t1, h0):
        return [v[..., t0:t1] if i in seq else v for i, v in enumerate(x[:-1])] + [h0]

    o1, h1 = ss.reference_f64(*part(0, 15, x[-1]))
    o2, h2 = ss.reference_f64(*part(15, 40, h1))
    torch.testing.assert_close(torch.cat([o1, o2], dim=-1), out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h2, last, rtol=1e-6, atol=1e-6)
