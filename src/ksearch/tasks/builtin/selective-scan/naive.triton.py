"""Naive selective scan (Mamba-1 S6 forward) for the triton target: the baseline GPU speedups are measured
against. One program (one warp) per (batch, channel) row, sequential over the tokens; the row's states are the
lanes of a BLOCK_N vector, its fp32 state h. The same algorithm as the cuda target's naive kernel.

ABI (docs/triton-target.md): run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state) with torch CUDA
tensors, contiguous, of the task's shapes: u, delta, z, out [batch, dim, seqlen]; A [dim, dstate]; B, C
[batch, dstate, seqlen]; D, delta_bias [dim]; h0 (the initial state), last_state [batch, dim, dstate] fp32. The activations' dtype
(float32 or float16) comes from the tensors; state and arithmetic are fp32.
"""

import triton
import triton.language as tl


@triton.jit
def _naive_scan(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state, dim, dstate, seqlen,
                BLOCK_N: tl.constexpr):
    r = tl.program_id(0)                      # the (batch, channel) row
    b = r // dim
    d = r % dim
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < dstate
    a_row = tl.load(A + d * dstate + offs_n, mask=mn, other=0.0).to(tl.float32)
    d_skip = tl.load(D + d).to(tl.float32)
    bias = tl.load(delta_bias + d).to(tl.float32)
    row = r.to(tl.int64) * seqlen
    bc = (b * dstate + offs_n).to(tl.int64) * seqlen
    h = tl.load(h0 + r.to(tl.int64) * dstate + offs_n, mask=mn, other=0.0).to(tl.float32)
    for t in range(0, seqlen):
        x = tl.load(delta + row + t).to(tl.float32) + bias
        dt = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))    # softplus
        ut = tl.load(u + row + t).to(tl.float32)
        bt = tl.load(B + bc + t, mask=mn, other=0.0).to(tl.float32)
        ct = tl.load(C + bc + t, mask=mn, other=0.0).to(tl.float32)
        h = tl.exp(dt * a_row) * h + dt * bt * ut
        y = tl.sum(ct * h, axis=0) + d_skip * ut
        zt = tl.load(z + row + t).to(tl.float32)
        o = y * (zt / (1.0 + tl.exp(-zt)))                    # y * silu(z)
        tl.store(out + row + t, o.to(out.dtype.element_ty))
    tl.store(last_state + r.to(tl.int64) * dstate + offs_n, h, mask=mn)


def run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state):
    """One program per (batch, channel) row: grid (batch * dim,), one warp each."""
    batch, dim, seqlen = u.shape
    dstate = A.shape[1]
    _naive_scan[(batch * dim,)](u, delta, A, B, C, D, z, delta_bias, h0, out, last_state, dim, dstate,
                                seqlen, BLOCK_N=max(2, triton.next_power_of_2(dstate)), num_warps=1)
