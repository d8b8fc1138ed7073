// Naive GQA decode attention, float16, as an MLX custom CUDA kernel body (mx.fast.cuda_kernel; format:
// docs/mlx-target.md): the naive.cuda.cu algorithm. One warp per (sequence, query head); lane t takes keys t,
// t+32, ...: fp32 scores (a full dot product per key), the max over the warp by shuffles, a second pass
// recomputing the scores for p = expf(s - max), the lane's exp sum and p-weighted value rows in a local fp32
// accumulator, summed over the warp by shuffles. MLX generates the signature: inputs `const __half* q, k, v`,
// output `__half* o`, and the axes batch, q_heads, kv_heads, kv_len, head_dim as `constexpr int`.
// Layouts: q, o [batch][q_heads][head_dim]; k, v [batch][kv_heads][kv_len][head_dim]; query head h reads kv head
// h / (q_heads / kv_heads); scale 1/sqrt(head_dim).
const long long bh = blockIdx.x;  // (b, h): one 32-thread block each
const int lane = threadIdx.x;
if (bh >= (long long)batch * q_heads) return;
const long long h = bh % q_heads, b = bh / q_heads;
const long long kvh = b * kv_heads + h / (q_heads / kv_heads);
const __half* kh = k + kvh * kv_len * head_dim;
const __half* vh = v + kvh * kv_len * head_dim;
const float scale = 1.0f / sqrtf((float)head_dim);
float acc[head_dim];
for (int d = 0; d < head_dim; d++) acc[d] = 0.0f;
float m = __int_as_float(0xff800000)  /* -inf (NVRTC has no INFINITY) */;
for (long long j = lane; j < kv_len; j += 32) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += __half2float(q[bh * head_dim + d]) * __half2float(kh[j * head_dim + d]);
    m = fmaxf(m, s * scale);
}
for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
float l = 0.0f;
for (long long j = lane; j < kv_len; j += 32) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += __half2float(q[bh * head_dim + d]) * __half2float(kh[j * head_dim + d]);
    float p = expf(s * scale - m);
    l += p;
    for (int d = 0; d < head_dim; d++) acc[d] += p * __half2float(vh[j * head_dim + d]);
}
for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
for (int d = 0; d < head_dim; d++) {
    float a = acc[d];
    for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0) o[bh * head_dim + d] = __float2half(a / l);
}
