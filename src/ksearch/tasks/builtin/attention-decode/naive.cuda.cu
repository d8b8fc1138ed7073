/* Naive GQA decode attention, float16 q, k, v, o, for the cuda target: the baseline GPU speedups are measured
 * against. One warp per (sequence, query head); lane t takes keys t, t+32, ...: each lane computes its keys'
 * scores in fp32 (a full dot product per key), the max over the warp by shuffles, then a second pass
 * recomputing the scores for p = expf(s - max), the lane's exp sum and p-weighted sum of its value rows in a
 * local fp32 accumulator (head_dim <= 256, the task's axis maximum), summed over the warp by shuffles at the
 * end. No shared memory, no vector loads, the kv head's K and V read once per query head (not once per group).
 * Launch plan: naive.cuda.launch.yaml (one 32-thread block per (batch, query head)).
 * ABI (docs/cuda-target.md): inputs in definition order, outputs, then every axis as long long.
 * Layouts (half): q, o [batch][q_heads][head_dim]; k, v [batch][kv_heads][kv_len][head_dim]; query head h reads
 * kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim). */
#include <cuda_fp16.h>
#define MAX_HEAD_DIM 256

extern "C" __global__ void naive_decode(const __half *q, const __half *k, const __half *v, __half *o,
                                        long long batch, long long q_heads, long long kv_heads, long long kv_len,
                                        long long head_dim) {
    const long long bh = blockIdx.x; /* (b, h) */
    const int lane = threadIdx.x;
    if (bh >= batch * q_heads || head_dim > MAX_HEAD_DIM) return;
    const long long h = bh % q_heads, b = bh / q_heads;
    const long long kvh = b * kv_heads + h / (q_heads / kv_heads);
    const __half *kh = k + kvh * kv_len * head_dim, *vh = v + kvh * kv_len * head_dim;
    const float scale = 1.0f / sqrtf((float)head_dim);
    float acc[MAX_HEAD_DIM];
    for (long long d = 0; d < head_dim; d++) acc[d] = 0.0f;
    float m = __int_as_float(0xff800000)  /* -inf (NVRTC has no INFINITY) */;
    for (long long j = lane; j < kv_len; j += 32) {
        float s = 0.0f;
        for (long long d = 0; d < head_dim; d++) s += __half2float(q[bh * head_dim + d]) * __half2float(kh[j * head_dim + d]);
        m = fmaxf(m, s * scale);
    }
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.0f;
    for (long long j = lane; j < kv_len; j += 32) {
        float s = 0.0f;
        for (long long d = 0; d < head_dim; d++) s += __half2float(q[bh * head_dim + d]) * __half2float(kh[j * head_dim + d]);
        float p = expf(s * scale - m);
        l += p;
        for (long long d = 0; d < head_dim; d++) acc[d] += p * __half2float(vh[j * head_dim + d]);
    }
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    for (long long d = 0; d < head_dim; d++) {
        float a = acc[d];
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) o[bh * head_dim + d] = __float2half(a / l);
    }
}
