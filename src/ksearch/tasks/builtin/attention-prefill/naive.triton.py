"""Naive causal attention prefill (GQA) for the triton target: the baseline GPU speedups are measured against.
One program per (batch, query head, block of BLOCK_M query rows); two passes over the keys the block sees, in
blocks of BLOCK_N: the rows' max score first, then p = exp(s - max), the exp sum and P @ V, scores recomputed
in the second pass (nothing stored). Scores and the accumulator are fp32 (tl.dot of the 16-bit tiles accumulates in
fp32; P is rounded to the inputs' dtype for the P @ V product); no online softmax, no pipelining tricks.

ABI (docs/triton-target.md): run(q, k, v, o) with torch CUDA tensors, contiguous: q, o [batch, q_heads, seqlen,
head_dim]; k, v [batch, kv_heads, seqlen, head_dim]; float16, or bfloat16 for the -bf16 tasks (which link this
file: the dtype comes from the tensors). Query head h reads kv head h // (q_heads //
kv_heads); scale 1/sqrt(head_dim). The mask is this module's CAUSAL: the task's `causal` axis is not passed to
`run` (axes are the tensors' shapes), and attention-prefill-noncausal's naive module sets it to False.
"""

import math

import triton
import triton.language as tl

CAUSAL = True


@triton.jit
def _naive_attention(q, k, v, o, q_heads, kv_heads, seqlen, head_dim, scale,
                     CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)                    # (batch, query head)
    start_m = tl.program_id(1) * BLOCK_M
    b = bh // q_heads
    kvh = b * kv_heads + (bh % q_heads) // (q_heads // kv_heads)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mm, md = offs_m < seqlen, offs_d < head_dim
    q_base = bh.to(tl.int64) * seqlen * head_dim
    kv_base = kvh.to(tl.int64) * seqlen * head_dim
    qt = tl.load(q + q_base + offs_m[:, None] * head_dim + offs_d[None, :], mask=mm[:, None] & md[None, :], other=0.0)
    hi = tl.minimum(seqlen, start_m + BLOCK_M) if CAUSAL else seqlen
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k + kv_base + cols[:, None] * head_dim + offs_d[None, :], mask=(cols < seqlen)[:, None] & md[None, :],
                     other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * scale
        keep = (cols < seqlen)[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_i = tl.maximum(m_i, tl.max(s, axis=1))
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kvmask = (cols < seqlen)[:, None] & md[None, :]
        kt = tl.load(k + kv_base + cols[:, None] * head_dim + offs_d[None, :], mask=kvmask, other=0.0)
        vt = tl.load(v + kv_base + cols[:, None] * head_dim + offs_d[None, :], mask=kvmask, other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * scale
        keep = (cols < seqlen)[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        p = tl.exp(tl.where(keep, s, float("-inf")) - m_i[:, None])
        l_i += tl.sum(p, axis=1)
        acc += tl.dot(p.to(vt.dtype), vt)
    out = acc / l_i[:, None]
    tl.store(o + q_base + offs_m[:, None] * head_dim + offs_d[None, :], out.to(o.dtype.element_ty),
             mask=mm[:, None] & md[None, :])


def run(q, k, v, o):
    """Grid (batch * q_heads, ceil(seqlen / BLOCK_M)), 4 warps per program."""
    batch, q_heads, seqlen, head_dim = q.shape
    kv_heads = k.shape[1]
    block_m = 32
    grid = (batch * q_heads, triton.cdiv(seqlen, block_m))
    _naive_attention[grid](q, k, v, o, q_heads, kv_heads, seqlen, head_dim, 1.0 / math.sqrt(head_dim),
                           CAUSAL=CAUSAL, BLOCK_M=block_m, BLOCK_N=32, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
                           num_warps=4)
