// Naive attention prefill (causal or not, GQA), float16, as an MLX custom CUDA kernel body (mx.fast.cuda_kernel;
// format: docs/mlx-target.md): the naive.cuda.cu algorithm. One thread per query row, fp32 arithmetic: a pass over
// the keys the row sees for the max score, a second recomputing each score for p = expf(s - max), the exp sum and
// the p-weighted sum of value rows in a local fp32 accumulator. MLX generates the signature: inputs
// `const __half* q, k, v`, output `__half* o`, and the axes batch, q_heads, kv_heads, seqlen, head_dim, causal as
// `constexpr int` (the same body serves attention-prefill, causal = 1, and attention-prefill-noncausal, 0).
// Layouts: q, o [batch][q_heads][seqlen][head_dim]; k, v [batch][kv_heads][seqlen][head_dim]; query head h reads
// kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim).
const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, i) row
if (r >= (long long)batch * q_heads * seqlen) return;
const long long i = r % seqlen, bh = r / seqlen, h = bh % q_heads, b = bh / q_heads;
const long long kvh = b * kv_heads + h / (q_heads / kv_heads);
const __half* kh = k + kvh * seqlen * head_dim;
const __half* vh = v + kvh * seqlen * head_dim;
const float scale = 1.0f / sqrtf((float)head_dim);
float qf[head_dim], acc[head_dim];
for (int d = 0; d < head_dim; d++) {
    qf[d] = __half2float(q[r * head_dim + d]) * scale;
    acc[d] = 0.0f;
}
const long long n = causal ? i + 1 : seqlen;  // keys row i sees
float m = __int_as_float(0xff800000)  /* -inf (NVRTC has no INFINITY) */;
for (long long j = 0; j < n; j++) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += qf[d] * __half2float(kh[j * head_dim + d]);
    m = fmaxf(m, s);
}
float l = 0.0f;
for (long long j = 0; j < n; j++) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += qf[d] * __half2float(kh[j * head_dim + d]);
    float p = expf(s - m);
    l += p;
    for (int d = 0; d < head_dim; d++) acc[d] += p * __half2float(vh[j * head_dim + d]);
}
for (int d = 0; d < head_dim; d++) o[r * head_dim + d] = __float2half(acc[d] / l);
