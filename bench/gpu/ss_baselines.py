"""PyTorch baselines and a float64 reference for the selective scan (Mamba-1 S6 forward), used by
selective_scan_h200.py. Plain torch: runs on CPU tensors too (that is how it is tested off the GPU).

Shapes (mamba_ssm's convention): u, delta, z: (batch, dim, L); A: (dim, N) fp32; B, C: (batch, N, L);
D, delta_bias: (dim,) fp32; h0 (the initial state; None: zeros): (batch, dim, N) fp32. Every function returns (out (batch, dim, L) in u's dtype, last_state (batch, dim, N)
fp32); arithmetic in fp32 (reference: fp64). dt = softplus(delta + delta_bias); out = (C.h + D u) silu(z).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _dt(delta, delta_bias, dtype):
    return F.softplus(delta.to(dtype) + delta_bias.to(dtype)[None, :, None])


def _h0(h0, u, N, dtype):
    """The initial state as ``dtype`` (a copy), zeros when h0 is None."""
    if h0 is None:
        return torch.zeros(u.shape[0], u.shape[1], N, dtype=dtype, device=u.device)
    return h0.to(dtype=dtype, device=u.device).clone()


def reference_f64(u, delta, A, B, C, D, z, delta_bias, h0=None, chunk: int = 256):
    """Float64 reference (the task's definition.yaml, in torch): sequential over tokens, chunked exps, from h0."""
    f = torch.float64
    u64, z64, A64, B64, C64, D64 = (x.to(f) for x in (u, z, A, B, C, D))
    dt = _dt(delta, delta_bias, f)
    batch, dim, L = u.shape
    h = _h0(h0, u, A.shape[1], f)
    y = torch.empty(batch, dim, L, dtype=f, device=u.device)
    for t0 in range(0, L, chunk):
        t1 = min(L, t0 + chunk)
        dA = torch.exp(torch.einsum("bdt,dn->tbdn", dt[:, :, t0:t1], A64))
        dBu = torch.einsum("bdt,bnt->tbdn", (dt * u64)[:, :, t0:t1], B64[:, :, t0:t1])
        for i in range(t1 - t0):
            h = dA[i] * h + dBu[i]
            y[:, :, t0 + i] = torch.einsum("bdn,bn->bd", h, C64[:, :, t0 + i])
    out = (y + D64[None, :, None] * u64) * F.silu(z64)
    return out.to(u.dtype), h.float()


def token_loop(u, delta, A, B, C, D, z, delta_bias, h0=None):
    """One step per token, as mlx-lm's Mamba-1 does it in prefill: exp(dt A) h + dt B u, y = C.h, fp32."""
    f = torch.float32
    dt = _dt(delta, delta_bias, f)
    dtu = dt * u.to(f)
    Bf, Cf = B.to(f), C.to(f)
    batch, dim, L = u.shape
    h = _h0(h0, u, A.shape[1], f)
    ys = []
    for t in range(L):
        h = torch.exp(dt[:, :, t, None] * A) * h + dtu[:, :, t, None] * Bf[:, None, :, t]
        ys.append((h * Cf[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1)
    out = (y + D[None, :, None] * u.to(f)) * F.silu(z.to(f))
    return out.to(u.dtype), h


def pscan(a, b):
    """Inclusive scan of h_t = a_t h_{t-1} + b_t (h_{-1} = 0) along dim 2 of (batch, dim, L, N) tensors,
    work-efficient (Blelloch 1990): an up-sweep builds block aggregates with (a1, b1) o (a2, b2) =
    (a1 a2, a2 b1 + b2), a down-sweep completes the prefixes; 2 log2(L) vectorized steps. Returns h."""
    L = a.shape[2]
    Lp = 1 << max(0, (L - 1).bit_length())
    if Lp != L:
        pad = (0, 0, 0, Lp - L)
        a, b = F.pad(a, pad, value=1.0), F.pad(b, pad, value=0.0)
    else:
        a, b = a.clone(), b.clone()
    dev = a.device
    s = 1
    while s < Lp:                                          # up-sweep: i = 2s-1, 4s-1, ... absorb i - s
        i = torch.arange(2 * s - 1, Lp, 2 * s, device=dev)
        b[:, :, i] = a[:, :, i] * b[:, :, i - s] + b[:, :, i]
        a[:, :, i] = a[:, :, i] * a[:, :, i - s]
        s *= 2
    s = Lp // 4
    while s >= 1:                                          # down-sweep: i = 3s-1, 5s-1, ... take prefix at i - s
        i = torch.arange(3 * s - 1, Lp, 2 * s, device=dev)
        b[:, :, i] = a[:, :, i] * b[:, :, i - s] + b[:, :, i]
        a[:, :, i] = a[:, :, i] * a[:, :, i - s]
        s //= 2
    return b[:, :, :L]


def pscan_scan(u, delta, A, B, C, D, z, delta_bias, h0=None):
    """The selective scan through :func:`pscan` (what mamba.py's PyTorch path does): materializes
    (batch, dim, L, N) fp32 decays and inputs, scans them in parallel, contracts with C. The initial state enters
    the first token's input: h_0 = a_0 h0 + b_0."""
    f = torch.float32
    dt = _dt(delta, delta_bias, f)
    a = torch.exp(dt.unsqueeze(-1) * A[None, :, None, :])                       # (b, d, L, N)
    bx = (dt * u.to(f)).unsqueeze(-1) * B.to(f).transpose(1, 2)[:, None, :, :]  # (b, d, L, N)
    if h0 is not None:
        bx[:, :, 0] = bx[:, :, 0] + a[:, :, 0] * h0.to(f)
    h = pscan(a, bx)
    y = (h * C.to(f).transpose(1, 2)[:, None, :, :]).sum(-1)
    out = (y + D[None, :, None] * u.to(f)) * F.silu(z.to(f))
    return out.to(u.dtype), h[:, :, -1]


def make_inputs(batch, dim, dstate, L, dtype=torch.float16, device="cuda", seed=0, h0_std=0.0):
    """Inputs drawn as the task's definition.yaml draws them (u, B, C, z ~ N(0,1); delta ~ N(0, 0.5);
    A ~ -U(1, 16); D ~ U(0.5, 1.5); delta_bias ~ U(-4, -1); h0 zeros, or ~ N(0, h0_std) as the task's h0 check
    workloads draw it). Returns the 9 inputs in ABI order (h0 last, fp32)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    U = lambda lo, hi, *s: lo + (hi - lo) * torch.rand(*s, generator=g)
    act = lambda x: x.to(dtype).to(device).contiguous()
    f32 = lambda x: x.float().to(device).contiguous()
    return [act(r(batch, dim, L)), act(0.5 * r(batch, dim, L)), f32(-U(1, 16, dim, dstate)),
            act(r(batch, dstate, L)), act(r(batch, dstate, L)), f32(U(0.5, 1.5, dim)), act(r(batch, dim, L)),
            f32(U(-4, -1, dim)), f32(h0_std * r(batch, dim, dstate) if h0_std else torch.zeros(batch, dim, dstate))]
