"""ksearch.integrations.mlx_lm: a tiny mlx-lm Mamba-1 model with random weights, stock against patched with
the reference scan: logits and caches through a full prompt, a prompt in two chunks (the cached state as the
scan's initial state h0) and decode steps; unpatching; errors; loading a scan module from a path."""

import textwrap

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")
mamba = pytest.importorskip("mlx_lm.models.mamba")

import ksearch.integrations.mlx_lm as integ  # noqa: E402
from ksearch.integrations.mlx_lm import is_patched, patch_mamba, reference_scan, unpatch_mamba  # noqa: E402

pytestmark = pytest.mark.mlx

VOCAB = 64
#: logits tolerance relative to the largest logit: float32 agrees to rounding; float16 stock rounds its
#: state to float16 at every token where the scan keeps float32, so a few float16 ulps
TOL = {mx.float32: 1e-5, mx.float16: 4e-3}


def tiny_model(dtype=mx.float32, *, layers=2, bcdt_rms=False, seed=0):
    """A 2-layer Mamba-1 (hidden 16, d_inner 32, d_state 4) with random weights, slow enough decays that a
    state carried over a chunk boundary still matters, and D != 1."""
    mx.random.seed(seed)
    cfg = dict(model_type="falcon_mamba" if bcdt_rms else "mamba", vocab_size=VOCAB, hidden_size=16,
               intermediate_size=32, state_size=4, num_hidden_layers=layers, conv_kernel=4, use_bias=False,
               use_conv_bias=True, time_step_rank=4)
    model = mamba.Model(mamba.ModelArgs.from_dict(cfg))
    for layer in model.layers:
        m = layer.mixer
        m.A_log = mx.log(mx.random.uniform(0.05, 1.0, m.A_log.shape))
        m.D = mx.random.uniform(0.5, 1.5, m.D.shape)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def tokens(batch=2, T=40, seed=1):
    return mx.random.randint(0, VOCAB, (batch, T), key=mx.random.key(seed))


def forward(model, toks, chunks, decode=3):
    """Logits of each prefill chunk and of ``decode`` one-token steps, and the final cache."""
    cache = model.make_cache()
    outs, t0 = [], 0
    for c in chunks:
        outs.append(model(toks[:, t0:t0 + c], cache))
        t0 += c
    assert t0 == toks.shape[1]
    step = toks[:, -1:]
    for _ in range(decode):
        logits = model(step, cache)
        outs.append(logits)
        step = mx.argmax(logits[:, -1:], axis=-1)
    mx.eval(outs, [c.cache for c in cache])
    return outs, cache


def assert_close(a, b, dtype, what):
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    scale = max(1.0, float(np.abs(a).max()))
    err = float(np.abs(a - b).max())
    assert err <= TOL[dtype] * scale, f"{what}: max |stock - patched| = {err:.3g} (scale {scale:.3g})"


class Spy:
    """A scan that counts its calls and the token counts it sees."""

    def __init__(self, fn=reference_scan):
        self.fn, self.seqlens = fn, []

    def __call__(self, u, *rest):
        self.seqlens.append(u.shape[-1])
        return self.fn(u, *rest)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("chunks", [[40], [25, 15]], ids=["one-chunk", "two-chunks"])
def test_patched_matches_stock(dtype, chunks):
    model, toks = tiny_model(dtype), tokens()
    stock, stock_cache = forward(model, toks, chunks)
    spy = Spy()
    assert patch_mamba(model, spy) == 2
    patched, patched_cache = forward(model, toks, chunks)
    assert spy.seqlens == [c for c in chunks for _ in range(2)]  # every layer of every chunk; no decode step
    for i, (s, p) in enumerate(zip(stock, patched)):
        assert s.dtype == p.dtype == dtype
        assert_close(s, p, dtype, f"logits of forward {i}")
    for i, (cs, cp) in enumerate(zip(stock_cache, patched_cache)):
        for name, s, p in zip(("conv", "state"), cs.cache, cp.cache):
            assert s.shape == p.shape and s.dtype == p.dtype == dtype, (name, s.shape, p.shape, s.dtype, p.dtype)
            assert_close(s, p, dtype, f"layer {i} {name} cache")


def test_the_initial_state_is_what_makes_chunks_agree():
    """A scan that drops h0 gets the second chunk's logits wrong: the two-chunk test can fail."""
    model, toks = tiny_model(), tokens()
    stock, _ = forward(model, toks, [25, 15], decode=0)
    seen = []

    def scan_from_zero(*args):
        seen.append(float(mx.abs(args[-1]).max()))
        return reference_scan(*args[:-1])

    patch_mamba(model, scan_from_zero)
    patched, _ = forward(model, toks, [25, 15], decode=0)
    assert_close(stock[0], patched[0], mx.float32, "first chunk")
    with pytest.raises(AssertionError, match="second"):
        assert_close(stock[1], patched[1], mx.float32, "second chunk")
    assert seen[:2] == [0.0, 0.0] and min(seen[2:]) > 0  # h0: zeros for the first chunk, the cache's after


def test_a_scan_without_h0_is_refused(tmp_path):
    """A scan of the 8-input contract (exported before h0) is refused by name, not run with a wrong state."""
    model = tiny_model(layers=1)
    with pytest.raises(ValueError, match="h0"):
        patch_mamba(model, lambda u, delta, A, B, C, D, z, delta_bias: (u, A))
    old = tmp_path / "old_export.py"
    old.write_text("INPUTS = ['u', 'delta', 'A', 'B', 'C', 'D', 'z', 'delta_bias']\n"
                   "def selective_scan(*inputs): pass\n")
    with pytest.raises(ValueError, match="no initial state `h0`"):
        patch_mamba(model, old)
    assert not is_patched(model)


def test_falcon_mamba_bcdt_rms_is_supported():
    model, toks = tiny_model(bcdt_rms=True), tokens()
    assert all(layer.mixer.use_bcdt_rms for layer in model.layers)
    stock, _ = forward(model, toks, [30, 10])
    patch_mamba(model, reference_scan)
    patched, _ = forward(model, toks, [30, 10])
    for s, p in zip(stock, patched):
        assert_close(s, p, mx.float32, "falcon_mamba logits")


def test_min_tokens_keeps_short_forwards_stock():
    model, toks = tiny_model(), tokens(T=12)
    spy = Spy()
    patch_mamba(model, spy, min_tokens=8)
    forward(model, toks, [5, 7], decode=1)
    assert spy.seqlens == []
    forward(model, toks, [4, 8], decode=1)
    assert spy.seqlens == [8, 8]


def test_unpatch_restores_stock():
    model, toks = tiny_model(), tokens()
    stock, _ = forward(model, toks, [25, 15])
    spy = Spy()
    patch_mamba(model, spy)
    assert is_patched(model)
    assert "_process_sequence" not in dict(model.parameters())  # the patch is not a parameter
    assert unpatch_mamba(model) == 2
    assert not is_patched(model) and unpatch_mamba(model) == 0
    again, _ = forward(model, toks, [25, 15])
    assert spy.seqlens == []
    for s, a in zip(stock, again):
        assert mx.array_equal(s, a)


def test_patch_is_per_instance():
    patched, other = tiny_model(), tiny_model()
    patch_mamba(patched, reference_scan)
    assert is_patched(patched) and not is_patched(other)


class NotMamba(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4)]


@pytest.mark.parametrize("bad", [NotMamba(), nn.Linear(2, 2)])
def test_a_model_without_mamba_blocks_is_refused(bad):
    with pytest.raises(TypeError, match="no mlx_lm.models.mamba.MambaBlock"):
        patch_mamba(bad, reference_scan)


def test_bad_arguments_are_refused(tmp_path):
    model = tiny_model(layers=1)
    with pytest.raises(TypeError, match="expects an mlx-lm Mamba model"):
        patch_mamba("mamba-370m", reference_scan)
    with pytest.raises(ValueError, match="min_tokens"):
        patch_mamba(model, reference_scan, min_tokens=0)
    with pytest.raises(TypeError, match="scan must be"):
        patch_mamba(model, 42)
    with pytest.raises(FileNotFoundError, match="nope.py"):
        patch_mamba(model, tmp_path / "nope.py")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines no callable `selective_scan"):
        patch_mamba(model, str(empty))
    bad_dtypes = tmp_path / "bad_dtypes.py"
    bad_dtypes.write_text("def selective_scan(*a): pass\nINPUT_DTYPES = {'u': 'half-ish'}\n")
    with pytest.raises(ValueError, match="half-ish"):
        patch_mamba(model, bad_dtypes)
    assert not is_patched(model)


def test_a_scan_with_the_wrong_layout_is_reported():
    model, toks = tiny_model(layers=1), tokens()
    patch_mamba(model, lambda u, *rest: (u.transpose(0, 2, 1), mx.zeros((1,))))
    with pytest.raises(ValueError, match="expected"):
        model(toks)


SCAN_MODULE = textwrap.dedent('''
    """What `ksearch export` writes, in miniature: the task's fp16 dtypes and a `selective_scan`."""
    import mlx.core as mx
    from ksearch.integrations.mlx_scan import reference_scan

    INPUT_DTYPES = {"u": "float16", "delta": "float16", "A": "float32", "B": "float16", "C": "float16",
                    "D": "float32", "z": "float16", "delta_bias": "float32", "h0": "float32"}
    SEEN = []

    def selective_scan(u, delta, A, B, C, D, z, delta_bias, h0):
        SEEN.append({k: str(v.dtype) for k, v in zip(INPUT_DTYPES, (u, delta, A, B, C, D, z, delta_bias, h0))})
        return reference_scan(u, delta, A, B, C, D, z, delta_bias, h0)
''')


def test_a_scan_module_path_loads_and_its_input_dtypes_apply(tmp_path):
    path = tmp_path / "scan.py"
    path.write_text(SCAN_MODULE)
    model, toks = tiny_model(mx.float32), tokens()
    stock, _ = forward(model, toks, [25, 15])
    assert patch_mamba(model, str(path)) == 2
    patched, _ = forward(model, toks, [25, 15])
    module = integ._load_module(str(path.resolve()))
    assert len(module.SEEN) == 4
    assert module.SEEN[0] == {k: f"mlx.core.{v}" for k, v in module.INPUT_DTYPES.items()}
    for s, p in zip(stock, patched):
        assert p.dtype == mx.float32  # the model's dtype, whatever the scan's
        assert_close(s, p, mx.float16, "logits with an fp16 scan in a float32 model")
