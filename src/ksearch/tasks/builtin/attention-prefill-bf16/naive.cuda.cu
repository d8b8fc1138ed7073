/* Naive attention prefill (causal or not, GQA), bfloat16 q, k, v, o, for the cuda target: the baseline GPU
 * speedups are measured against. attention-prefill's naive cuda kernel with bfloat16 loads and stores: one thread
 * per query row, fp32 arithmetic, the query row in a local fp32 array, a first pass over the keys it sees for the
 * max score, a second pass recomputing each score for p = expf(s - max), the exp sum and the p-weighted sum of
 * value rows in a local fp32 accumulator (head_dim <= 256, the task's axis maximum); no shared memory, no tiling.
 * The same file serves attention-prefill-bf16 (causal = 1) and attention-prefill-noncausal-bf16 (causal = 0): the
 * mask is the const axis `causal`. Stores round to nearest even (__float2bfloat16).
 * Launch plan: naive.cuda.launch.yaml (1-D grid over batch*q_heads*seqlen rows).
 * ABI (docs/cuda-target.md): inputs in definition order, outputs, then every axis as long long.
 * Layouts (__nv_bfloat16): q, o [batch][q_heads][seqlen][head_dim]; k, v [batch][kv_heads][seqlen][head_dim];
 * query head h reads kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim). */
#include <cuda_bf16.h>
#define MAX_HEAD_DIM 256

extern "C" __global__ void naive_attention(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                           __nv_bfloat16 *o, long long batch, long long q_heads, long long kv_heads,
                                           long long seqlen, long long head_dim, long long causal) {
    long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;  /* (b, h, i) row */
    if (r >= batch * q_heads * seqlen || head_dim > MAX_HEAD_DIM) return;
    const long long i = r % seqlen, bh = r / seqlen, h = bh % q_heads, b = bh / q_heads;
    const long long kvh = b * kv_heads + h / (q_heads / kv_heads);
    const __nv_bfloat16 *kh = k + kvh * seqlen * head_dim, *vh = v + kvh * seqlen * head_dim;
    const float scale = 1.0f / sqrtf((float)head_dim);
    float qf[MAX_HEAD_DIM], acc[MAX_HEAD_DIM];
    for (long long d = 0; d < head_dim; d++) {
        qf[d] = __bfloat162float(q[r * head_dim + d]) * scale;
        acc[d] = 0.0f;
    }
    const long long n = causal ? i + 1 : seqlen; /* keys row i sees */
    float m = __int_as_float(0xff800000) /* -inf (NVRTC has no INFINITY) */;
    for (long long j = 0; j < n; j++) {
        float s = 0.0f;
        for (long long d = 0; d < head_dim; d++) s += qf[d] * __bfloat162float(kh[j * head_dim + d]);
        m = fmaxf(m, s);
    }
    float l = 0.0f;
    for (long long j = 0; j < n; j++) {
        float s = 0.0f;
        for (long long d = 0; d < head_dim; d++) s += qf[d] * __bfloat162float(kh[j * head_dim + d]);
        float p = expf(s - m);
        l += p;
        for (long long d = 0; d < head_dim; d++) acc[d] += p * __bfloat162float(vh[j * head_dim + d]);
    }
    for (long long d = 0; d < head_dim; d++) o[r * head_dim + d] = __float2bfloat16(acc[d] / l);
}
