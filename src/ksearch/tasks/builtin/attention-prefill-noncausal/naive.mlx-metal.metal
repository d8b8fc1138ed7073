// Naive attention prefill (causal or not, GQA), float16, as an MLX custom Metal kernel body (mx.fast.metal_kernel;
// format: docs/mlx-target.md): the naive.cuda.cu algorithm. One thread per query row, fp32 arithmetic: a pass over
// the keys the row sees for the max score, a second recomputing each score for p = exp(s - max), the exp sum and
// the p-weighted sum of value rows in a thread-local fp32 accumulator. MLX generates the signature: inputs
// `const device float16_t* q, k, v`, output `device float16_t* o`, the thread attribute used below, and the axes
// batch, q_heads, kv_heads, seqlen, head_dim, causal as int template constants (the same body serves
// attention-prefill, causal = 1, and attention-prefill-noncausal, 0).
// Layouts: q, o [batch][q_heads][seqlen][head_dim]; k, v [batch][kv_heads][seqlen][head_dim]; query head h reads
// kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim).
// Not run on an Apple GPU by this project (none available): checked statically only.
const uint r = thread_position_in_grid.x;  // (b, h, i) row
if (r >= uint(batch * q_heads * seqlen)) return;
const uint i = r % uint(seqlen), bh = r / uint(seqlen), h = bh % uint(q_heads), b = bh / uint(q_heads);
const uint kvh = b * uint(kv_heads) + h / uint(q_heads / kv_heads);
const uint kbase = kvh * uint(seqlen) * uint(head_dim);
const float scale = 1.0f / metal::sqrt(float(head_dim));
float qf[head_dim], acc[head_dim];
for (int d = 0; d < head_dim; d++) {
    qf[d] = float(q[r * uint(head_dim) + uint(d)]) * scale;
    acc[d] = 0.0f;
}
const uint n = causal ? i + 1 : uint(seqlen);  // keys row i sees
float m = -INFINITY;
for (uint j = 0; j < n; j++) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += qf[d] * float(k[kbase + j * uint(head_dim) + uint(d)]);
    m = metal::max(m, s);
}
float l = 0.0f;
for (uint j = 0; j < n; j++) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += qf[d] * float(k[kbase + j * uint(head_dim) + uint(d)]);
    float p = metal::exp(s - m);
    l += p;
    for (int d = 0; d < head_dim; d++) acc[d] += p * float(v[kbase + j * uint(head_dim) + uint(d)]);
}
for (int d = 0; d < head_dim; d++) o[r * uint(head_dim) + uint(d)] = float16_t(acc[d] / l);
