"""Token-by-token selective scan in NumPy float32: what a straightforward framework implementation does
(mlx-lm's Mamba walks the prompt one token at a time the same way). A baseline, not the reference."""

import numpy as np


def run(u, delta, A, B, C, D, z, delta_bias, h0):
    f = np.float32
    u, delta, z, B, C = (np.asarray(x, f) for x in (u, delta, z, B, C))
    A, D, delta_bias = (np.asarray(x, f) for x in (A, D, delta_bias))
    batch, dim, L = u.shape
    x = delta + delta_bias[None, :, None]
    dt = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(f)  # softplus
    h = np.array(h0, f)  # the initial state (batch, dim, N), copied
    y = np.empty((batch, dim, L), f)
    for t in range(L):
        dA = np.exp(dt[:, :, t, None] * A[None])
        h = dA * h + (dt[:, :, t] * u[:, :, t])[:, :, None] * B[:, None, :, t]
        y[:, :, t] = np.einsum("bdn,bn->bd", h, C[:, :, t])
    out = (y + D[None, :, None] * u) * (z / (1 + np.exp(-z)))
    return out, h
