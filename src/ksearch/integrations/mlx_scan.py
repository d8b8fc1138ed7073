"""Selective-scan math in plain MLX ops: a reference scan with the task contract (an associative scan: chunks of
doubling steps, the state carried between chunks), which is also the vectorized MLX baseline of
bench/mlx/mamba_prefill.py.

Contract (the ``selective-scan`` / ``selective-scan-fp16`` tasks; Gu & Dao, "Mamba" (2023), Algorithm 2,
mamba_ssm's ``selective_scan_ref`` with delta_softplus=True, z and D given, one group)::

    dt_t  = softplus(delta_t + delta_bias)                    # per (b, d, t)
    h_t   = exp(dt_t * A[d, :]) * h_{t-1} + dt_t * B_t * u_t  # h_{-1} = h0, per (b, d, n)
    y_t   = sum_n C_t[n] * h_t[n]
    out_t = (y_t + D[d] * u_t) * silu(z_t)
    last_state = h_{L-1}

Layouts: u, delta, z, out: [batch, dim, seqlen]; A: [dim, dstate]; B, C: [batch, dstate, seqlen];
D, delta_bias: [dim]; h0 (the initial state: zeros for a fresh sequence, the cached state for the next chunk of a
prefill), last_state: [batch, dim, dstate]. Arithmetic and state are float32 whatever the input dtypes.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

#: tokens per chunk of the reference scan: its temporaries are ~batch*dim*chunk*dstate float32s (8 MiB at
#: dim 2048, dstate 16, batch 1), its work ~log2(chunk) passes over them, its graph ~5*log2(chunk) + 8 nodes per
#: chunk. 64: on 2 CPU cores (dim 2048, L 512) 32 took 1.3 s, 128 1.8 s; fewer nodes favour larger on a GPU.
SCAN_CHUNK = 64

_F32 = mx.float32


def softplus_dt(delta: mx.array, delta_bias: mx.array) -> mx.array:
    """dt = softplus(delta + delta_bias) in float32.

    Args:
        delta: [batch, dim, seqlen], any float dtype (dt before softplus).
        delta_bias: [dim].
    Returns:
        [batch, dim, seqlen] float32.
    """
    return nn.softplus(delta.astype(_F32) + delta_bias.astype(_F32)[None, :, None])


def _scan_chunk(a: mx.array, b: mx.array, h: mx.array) -> mx.array:
    """Inclusive scan of h_t = a_t * h_{t-1} + b_t over axis 2 of a, b ([batch, dim, T, dstate], float32),
    starting from h ([batch, dim, dstate]); Hillis-Steele doubling, ceil(log2 T) steps, no division and no
    exp of a growing sum, so it is stable for any decay. Returns every h_t: [batch, dim, T, dstate]."""
    T = a.shape[2]
    k = 1
    while k < T:
        pad = [(0, 0), (0, 0), (k, 0), (0, 0)]
        b = b + a * mx.pad(b[:, :, : T - k], pad)  # uses the old a: (a, b) after (a_prev, b_prev)
        a = a * mx.pad(a[:, :, : T - k], pad, constant_values=1.0)
        k *= 2
    return b + a * h[:, :, None, :]


def reference_scan(u, delta, A, B, C, D, z, delta_bias, h0=None, *, chunk: int = SCAN_CHUNK):
    """Selective scan with the task contract (see the module docstring), in MLX ops.

    Chunked over time: within a chunk of ``chunk`` tokens the recurrence is a doubling scan over
    [batch, dim, chunk, dstate] float32 arrays; chunks are chained through the state. Runs on any MLX device
    (it is the fallback and the test oracle); it is not fast.

    Args:
        u, delta, z: [batch, dim, seqlen], float16/bfloat16/float32.
        A: [dim, dstate], float32, negative.
        B, C: [batch, dstate, seqlen].
        D, delta_bias: [dim], float32.
        h0: [batch, dim, dstate], the state before the first token (any float dtype; computed in float32);
            None: zeros.
        chunk: tokens per chunk (>= 1).
    Returns:
        (out [batch, dim, seqlen] in u's dtype, last_state [batch, dim, dstate] float32).
    Raises:
        ValueError: shapes that do not fit the contract, or chunk < 1.
    """
    batch, dim, L = u.shape
    N = A.shape[-1]
    _check_shapes(u, delta, A, B, C, D, z, delta_bias, h0)
    if chunk < 1:
        raise ValueError(f"reference_scan: chunk must be >= 1, got {chunk}")
    dt = softplus_dt(delta, delta_bias)
    uf = u.astype(_F32)
    A = A.astype(_F32)
    Bt = B.astype(_F32).transpose(0, 2, 1)  # [batch, seqlen, dstate]
    Ct = C.astype(_F32).transpose(0, 2, 1)
    h = mx.zeros((batch, dim, N), dtype=_F32) if h0 is None else h0.astype(_F32)
    ys = []
    for t0 in range(0, L, chunk):
        t1 = min(L, t0 + chunk)
        dtc = dt[:, :, t0:t1]
        a = mx.exp(dtc[..., None] * A[None, :, None, :])
        b = (dtc * uf[:, :, t0:t1])[..., None] * Bt[:, None, t0:t1, :]
        hs = _scan_chunk(a, b, h)
        ys.append((hs * Ct[:, None, t0:t1, :]).sum(axis=-1))
        h = hs[:, :, -1, :]
    y = mx.concatenate(ys, axis=2) if len(ys) > 1 else ys[0]
    out = (y + D.astype(_F32)[None, :, None] * uf) * nn.silu(z.astype(_F32))
    return out.astype(u.dtype), h


def _check_shapes(u, delta, A, B, C, D, z, delta_bias, h0=None) -> None:
    """Raise ValueError naming the first argument whose shape does not fit the contract."""
    if u.ndim != 3 or A.ndim != 2:
        raise ValueError(f"selective scan: u must be [batch, dim, seqlen] and A [dim, dstate]; "
                         f"got u {tuple(u.shape)}, A {tuple(A.shape)}")
    batch, dim, L = u.shape
    N = A.shape[1]
    want = {"delta": (batch, dim, L), "z": (batch, dim, L), "A": (dim, N), "B": (batch, N, L),
            "C": (batch, N, L), "D": (dim,), "delta_bias": (dim,)}
    got = {"delta": delta, "z": z, "A": A, "B": B, "C": C, "D": D, "delta_bias": delta_bias}
    if h0 is not None:
        want["h0"], got["h0"] = (batch, dim, N), h0
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise ValueError(f"selective scan: {name} has shape {tuple(got[name].shape)}, expected {shape} "
                             f"(batch {batch}, dim {dim}, seqlen {L}, dstate {N})")
