"""Naive null-target kernels (Python on NumPy) for the upstream flashinfer-bench definitions under
tests/fixtures/flashinfer_trace_upstream, written from each definition's description, not from its reference code.

ABI (null target, as the cpu target's): inputs in definition order (scalars as numbers), outputs (filled in place),
then every axis as an int in definition order. bfloat16 arrays are their uint16 bits; accumulation in float32."""

BF16 = '''import numpy as np


def f32(bits):
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def bf16(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
'''

GEMM = '''import numpy as np


def run(A, B, C, M, N, K):
    C[...] = (A.astype(np.float32) @ B.astype(np.float32).T).astype(np.float16)
'''

#: eps 1e-5, as the definition's description says
RMSNORM = BF16 + '''

def run(hidden_states, weight, output, batch_size, hidden_size):
    x = f32(hidden_states)
    inv = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5)
    output[...] = bf16(x * inv * f32(weight))
'''

GQA_DECODE = BF16 + '''

def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, output, lse,
        batch_size, num_qo_heads, num_kv_heads, head_dim, num_pages, page_size, len_indptr, num_kv_indices):
    k_all = f32(k_cache).reshape(-1, num_kv_heads, head_dim)  # page_size 1: a page is a token
    v_all = f32(v_cache).reshape(-1, num_kv_heads, head_dim)
    kv_head = np.arange(num_qo_heads) // (num_qo_heads // num_kv_heads)
    for b in range(batch_size):
        idx = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        if idx.size == 0:
            output[b] = 0
            lse[b] = -np.inf
            continue
        k = k_all[idx][:, kv_head, :]  # [tokens, num_qo_heads, head_dim]
        v = v_all[idx][:, kv_head, :]
        s = np.einsum("hd,thd->ht", f32(q[b]), k) * np.float32(sm_scale)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        total = p.sum(axis=1)
        lse[b] = (m[:, 0] + np.log(total)) / np.log(2.0)
        output[b] = bf16(np.einsum("ht,thd->hd", p, v) / total[:, None])
'''

MLA_DECODE = BF16 + '''

def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale, output, lse,
        batch_size, num_qo_heads, head_dim_ckv, head_dim_kpe, page_size, num_pages, len_indptr, num_kv_indices):
    ckv = f32(ckv_cache).reshape(-1, head_dim_ckv)  # page_size 1: a page is a token
    kpe = f32(kpe_cache).reshape(-1, head_dim_kpe)
    for b in range(batch_size):
        idx = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        if idx.size == 0:
            output[b] = 0
            lse[b] = -np.inf
            continue
        s = (f32(q_nope[b]) @ ckv[idx].T + f32(q_pe[b]) @ kpe[idx].T) * np.float32(sm_scale)  # [heads, tokens]
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        total = p.sum(axis=1)
        lse[b] = (m[:, 0] + np.log(total)) / np.log(2.0)
        output[b] = bf16((p @ ckv[idx]) / total[:, None])  # the compressed cache is both keys and values
'''

#: DeepSeek-V3 FP8 block-scale MoE (128-wide blocks, no-aux routing: 8 groups, top-2 sum ranks them, 4 kept,
#: top 8 experts by biased score, weights from the unbiased sigmoid normalised and scaled; GEMM1, SwiGLU with the
#: gate in the second half, GEMM2), per the definition's description
MOE_FP8_DS = BF16 + '''
_codes = np.arange(256)
_exp, _man = (_codes >> 3) & 15, _codes & 7
E4M3 = np.where(_codes & 0x80, -1.0, 1.0) * np.where(_exp == 0, _man / 8 * 2.0 ** -6,
                                                     (1 + _man / 8) * 2.0 ** (_exp - 7.0))
E4M3 = np.where((_exp == 15) & (_man == 7), np.nan, E4M3).astype(np.float32)


def dequant(codes, scale, block=128):
    """fp8 codes [R, C] times their [R / block, C / block] scales -> float32 [R, C]."""
    return E4M3[codes] * np.repeat(np.repeat(scale, block, axis=0), block, axis=1)


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor, output,
        seq_len, num_experts, num_local_experts, hidden_size, intermediate_size, gemm1_out_size,
        num_hidden_blocks, num_intermediate_blocks, num_gemm1_out_blocks):
    T, E, inter = seq_len, num_experts, intermediate_size
    rows = np.arange(T)[:, None]
    s = (1.0 / (1.0 + np.exp(-routing_logits.astype(np.float64)))).astype(np.float32)
    biased = s + f32(routing_bias)
    group_score = np.sort(biased.reshape(T, 8, E // 8), axis=2)[:, :, -2:].sum(axis=2)
    kept = np.zeros((T, 8), bool)
    kept[rows, np.argsort(-group_score, axis=1, kind="stable")[:, :4]] = True
    pruned = np.where(np.repeat(kept, E // 8, axis=1), biased, np.finfo(np.float32).min)
    top = np.argsort(-pruned, axis=1, kind="stable")[:, :8]
    weight = np.zeros((T, E), np.float32)
    weight[rows, top] = s[rows, top]
    weight = weight / (weight.sum(axis=1, keepdims=True) + 1e-20) * np.float32(routed_scaling_factor)
    a = E4M3[hidden_states] * np.repeat(hidden_states_scale.T, 128, axis=1)  # [T, hidden]
    out = np.zeros((T, hidden_size), np.float32)
    for le in range(num_local_experts):
        ge = int(local_expert_offset) + le
        tok = np.nonzero((top == ge).any(axis=1))[0]
        if ge >= E or tok.size == 0:
            continue
        g = a[tok] @ dequant(gemm1_weights[le], gemm1_weights_scale[le]).T  # [tokens, 2 * inter]
        up, gate = g[:, :inter], g[:, inter:]
        h = up * gate / (1.0 + np.exp(-gate))
        out[tok] += (h @ dequant(gemm2_weights[le], gemm2_weights_scale[le]).T) * weight[tok, ge][:, None]
    output[...] = bf16(out)
'''
