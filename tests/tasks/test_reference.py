import math

import numpy as np
import pytest

from ksearch.tasks import load_task
from ksearch.tasks.inputs import bf16_from_f32, make_inputs, to_float64
from ksearch.tasks.reference import run_reference


def softplus(x):
    return math.log1p(math.exp(x))


def silu(x):
    return x / (1 + math.exp(-x))


def test_reference_matches_hand_computed_case():
    """batch 1, dim 1, dstate 2, seqlen 2, worked out by hand from the S6 recurrence."""
    d = load_task("selective-scan").definition
    u = np.array([[[1.0, -2.0]]])
    delta = np.array([[[0.3, -0.1]]])
    A = np.array([[-1.0, -0.5]])
    B = np.array([[[0.5, 1.0], [2.0, -1.0]]])  # (batch, dstate, seqlen)
    C = np.array([[[1.0, 0.0], [-1.0, 3.0]]])
    D = np.array([0.25])
    z = np.array([[[0.7, -1.2]]])
    bias = np.array([0.2])
    dt = [softplus(0.3 + 0.2), softplus(-0.1 + 0.2)]
    h0 = np.array([[[0.5, -2.0]]])  # (batch, dim, dstate): the state before the first token
    h = list(h0[0, 0])
    ys = []
    for t in range(2):
        h = [math.exp(dt[t] * A[0, n]) * h[n] + dt[t] * B[0, n, t] * u[0, 0, t] for n in range(2)]
        y = sum(C[0, n, t] * h[n] for n in range(2)) + D[0] * u[0, 0, t]
        ys.append(y * silu(z[0, 0, t]))
    out = run_reference(d, dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=bias, h0=h0))
    np.testing.assert_allclose(out["out"][0, 0], ys, rtol=1e-12)
    np.testing.assert_allclose(out["last_state"][0, 0], h, rtol=1e-12)


def test_reference_chunks_carry_state_across_chunk_boundaries():
    """seqlen 300 spans two of the reference's 256-token chunks: same as one token at a time."""
    t = load_task("selective-scan")
    w = t.workload("odd")
    x = make_inputs(t.definition, w, seed=5)
    got = run_reference(t.definition, x)
    f = {k: np.asarray(v, np.float64) for k, v in x.items()}
    dt = np.logaddexp(0, f["delta"] + f["delta_bias"][None, :, None])
    h = np.zeros((1, 37, 5))
    for i in range(333):
        h = np.exp(dt[:, :, i, None] * f["A"]) * h + (dt[:, :, i] * f["u"][:, :, i])[..., None] * f["B"][:, None, :, i]
    np.testing.assert_allclose(got["last_state"], h, rtol=1e-10)


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
def test_reference_from_h0_continues_a_split_sequence(task):
    """The sequence in two halves, the second from the first half's last_state as h0, == the sequence whole
    (the contract a chunked prefill relies on); and the h0 check workload draws a state that matters."""
    t = load_task(task)
    x = make_inputs(t.definition, t.workload("small-b2"), seed=3)
    assert not x["h0"].any()  # the default: start from zero
    whole = run_reference(t.definition, x)
    cut = 50
    seq = ("u", "delta", "z", "B", "C")
    first = run_reference(t.definition, {k: v[..., :cut] if k in seq else v for k, v in x.items()})
    second = run_reference(t.definition, {**{k: v[..., cut:] if k in seq else v for k, v in x.items()},
                                          "h0": first["last_state"]})
    np.testing.assert_allclose(np.concatenate([first["out"], second["out"]], axis=-1), whole["out"],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(second["last_state"], whole["last_state"], rtol=1e-12, atol=1e-12)
    from_zero = run_reference(t.definition, {**{k: v[..., cut:] if k in seq else v for k, v in x.items()}})
    assert np.abs(from_zero["out"] - second["out"]).max() > 1e-2  # h0 changes the answer

    drawn = make_inputs(t.definition, t.workload("h0"), seed=3)
    assert drawn["h0"].dtype == np.float32 and drawn["h0"].shape == (2, 64, 16)
    assert 0.8 < float(np.std(drawn["h0"])) < 1.2
    with_h0 = run_reference(t.definition, drawn)
    without = run_reference(t.definition, {**drawn, "h0": np.zeros_like(drawn["h0"])})
    assert np.abs(with_h0["out"] - without["out"]).max() > 0.1


def test_inputs_are_deterministic_fresh_and_follow_distributions():
    t = load_task("selective-scan-fp16")
    w = t.workload("small-b2")
    a, b, c = (make_inputs(t.definition, w, s) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["u"], c["u"])
    assert a["u"].dtype == np.float16 and a["A"].dtype == np.float32
    assert a["u"].shape == (2, 64, 128) and a["B"].shape == (2, 16, 128)
    assert (a["A"] < 0).all() and (a["D"] >= 0.5).all() and (a["delta_bias"] <= -1).all()
    assert 0.8 < float(np.std(a["u"].astype(np.float32))) < 1.2


def test_bfloat16_round_trip():
    x = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    back = to_float64(bf16_from_f32(x), "bfloat16")
    np.testing.assert_allclose(back, x, rtol=2 ** -8)
    assert back[0] == 1.0 and back[1] == -2.5


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
def test_reference_output_magnitude_is_not_trivial(task):
    """Outputs well above atol: a kernel writing zeros cannot pass (see reward-hacks.md, near-zero output)."""
    t = load_task(task)
    w = t.workload("small-b2")
    out = run_reference(t.definition, make_inputs(t.definition, w, 3))
    tol = t.definition.tolerance_for(t.definition.outputs["out"].dtype)
    assert np.mean(np.abs(out["out"])) > 50 * tol.atol


def test_an_input_too_large_to_allocate_is_a_task_error():
    from ksearch.errors import TaskError
    from ksearch.tasks.definition import Definition, Workload

    d = Definition.model_validate({"name": "huge", "axes": {"n": {"type": "var"}},
                                   "inputs": {"x": {"shape": ["n", "n", "n"], "dtype": "float32"}},
                                   "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
                                   "reference": "def run(x):\n    return x[0, 0]\n"})
    with pytest.raises(TaskError, match="does not fit in memory"):
        make_inputs(d, Workload(name="w", axes={"n": 1 << 20}), 0)


@pytest.mark.parametrize("mode", ["float64", "native"])
def test_reference_inputs_native_hands_float16_as_stored_and_still_decodes_bfloat16(mode, monkeypatch):
    """reference_inputs: float64 widens every array before run; native passes float16 as stored (the decode
    reference widens a sequence at a time) and still decodes bfloat16 bits (NumPy has no bfloat16)."""
    import ksearch.tasks.reference as reference

    d = load_task("attention-decode").definition
    d = d.model_copy(update={"reference_inputs": mode,
                             "inputs": {**d.inputs, "v": d.inputs["v"].model_copy(update={"dtype": "bfloat16"})}})
    seen = {}

    def run(q, k, v):   # the reference, spied: what run_reference hands it
        seen.update(q=q.dtype, k=k.dtype, v=v.dtype, v0=float(v.flat[0]))
        return np.zeros(1)
    monkeypatch.setattr(reference, "_entry", lambda definition: run)
    v = bf16_from_f32(np.full((1, 1, 1, 2), 1.5, np.float32))
    run_reference(d, {"q": np.ones((1, 1, 2), np.float16), "k": np.ones((1, 1, 1, 2), np.float16), "v": v})
    want = np.float64 if mode == "float64" else np.float16
    assert seen["q"] == want and seen["k"] == want
    assert seen["v"] == np.float64 and seen["v0"] == 1.5   # bfloat16 bits decoded either way


def test_the_decode_reference_gives_the_same_output_from_native_and_widened_inputs():
    d = load_task("attention-decode").definition
    assert d.reference_inputs == "native"
    w = load_task("attention-decode").workload("odd-b7")
    inputs = make_inputs(d, w, seed=3)
    native = run_reference(d, inputs)["o"]
    widened = run_reference(d.model_copy(update={"reference_inputs": "float64"}), inputs)["o"]
    assert np.array_equal(native, widened)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_a_reference_that_calls_sys_exit_is_a_task_error_not_the_commands_exit(backend):
    """`ksearch eval` exited with the reference's status and no message."""
    from ksearch.errors import TaskError
    from ksearch.tasks.definition import Definition

    if backend == "torch":
        pytest.importorskip("torch")
    d = Definition.model_validate({
        "name": "leaves", "axes": {"n": {"type": "const", "value": 3}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        "reference": "import sys\ndef run(x):\n    sys.exit(3)\n", "reference_backend": backend})
    with pytest.raises(TaskError, match="failed: SystemExit: 3"):
        run_reference(d, {"x": np.zeros(3, np.float32)})
