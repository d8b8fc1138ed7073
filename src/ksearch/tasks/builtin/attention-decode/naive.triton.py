"""Naive GQA decode attention for the triton target: the baseline GPU speedups are measured against. One program
(one warp) per (sequence, query head); two passes over the cached keys in blocks of BLOCK_N: the max score
first, then p = exp(s - max), the exp sum and the p-weighted sum of value rows, scores recomputed in the second
pass (nothing stored). Scores are q . k as an elementwise product summed over head_dim, all in fp32; each query
head reads its kv head's K and V on its own (not once per GQA group).

ABI (docs/triton-target.md): run(q, k, v, o) with torch CUDA tensors, contiguous: q, o [batch, q_heads,
head_dim]; k, v [batch, kv_heads, kv_len, head_dim]; float16. Query head h reads kv head h // (q_heads //
kv_heads); scale 1/sqrt(head_dim).
"""

import math

import triton
import triton.language as tl


@triton.jit
def _naive_decode(q, k, v, o, q_heads, kv_heads, kv_len, head_dim, scale,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)                    # (batch, query head)
    b = bh // q_heads
    kvh = b * kv_heads + (bh % q_heads) // (q_heads // kv_heads)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    md = offs_d < head_dim
    qv = tl.load(q + bh.to(tl.int64) * head_dim + offs_d, mask=md, other=0.0).to(tl.float32)
    kv_base = kvh.to(tl.int64) * kv_len * head_dim
    m = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)
    for start_n in range(0, kv_len, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(k + kv_base + cols[:, None] * head_dim + offs_d[None, :],
                     mask=(cols < kv_len)[:, None] & md[None, :], other=0.0).to(tl.float32)
        s = tl.where(cols < kv_len, tl.sum(kt * qv[None, :], axis=1) * scale, float("-inf"))
        m = tl.maximum(m, tl.max(s, axis=0))
    l = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start_n in range(0, kv_len, BLOCK_N):
        cols = start_n + offs_n
        kvmask = (cols < kv_len)[:, None] & md[None, :]
        kt = tl.load(k + kv_base + cols[:, None] * head_dim + offs_d[None, :], mask=kvmask, other=0.0).to(tl.float32)
        vt = tl.load(v + kv_base + cols[:, None] * head_dim + offs_d[None, :], mask=kvmask, other=0.0).to(tl.float32)
        s = tl.where(cols < kv_len, tl.sum(kt * qv[None, :], axis=1) * scale, float("-inf"))
        p = tl.exp(s - m)
        l += tl.sum(p, axis=0)
        acc += tl.sum(p[:, None] * vt, axis=0)
    tl.store(o + bh.to(tl.int64) * head_dim + offs_d, (acc / l).to(o.dtype.element_ty), mask=md)


def run(q, k, v, o):
    """Grid (batch * q_heads,), one warp per program."""
    batch, q_heads, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    _naive_decode[(batch * q_heads,)](q, k, v, o, q_heads, kv_heads, kv_len, head_dim, 1.0 / math.sqrt(head_dim),
                                      BLOCK_N=32, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), num_warps=1)
