// Naive GQA decode attention, float16, as an MLX custom Metal kernel body (mx.fast.metal_kernel; format:
// docs/mlx-target.md): the naive.cuda.cu algorithm. One SIMD-group (a 32-thread threadgroup) per (sequence, query
// head); lane t takes keys t, t+32, ...: fp32 scores (a full dot product per key), the max over the SIMD-group
// (simd_max), a second pass recomputing the scores for p = exp(s - max), the lane's exp sum and p-weighted value
// rows in a thread-local fp32 accumulator, summed with simd_sum. MLX generates the signature: inputs
// `const device float16_t* q, k, v`, output `device float16_t* o`, the thread attributes used below, and the
// axes batch, q_heads, kv_heads, kv_len, head_dim as int template constants.
// Layouts: q, o [batch][q_heads][head_dim]; k, v [batch][kv_heads][kv_len][head_dim]; query head h reads kv head
// h / (q_heads / kv_heads); scale 1/sqrt(head_dim).
// Not run on an Apple GPU by this project (none available): checked statically only.
const uint bh = threadgroup_position_in_grid.x;  // (b, h)
const uint lane = thread_index_in_simdgroup;
if (bh >= uint(batch * q_heads)) return;
const uint h = bh % uint(q_heads), b = bh / uint(q_heads);
const uint kvh = b * uint(kv_heads) + h / uint(q_heads / kv_heads);
const uint kbase = kvh * uint(kv_len) * uint(head_dim);
const float scale = 1.0f / metal::sqrt(float(head_dim));
float acc[head_dim];
for (int d = 0; d < head_dim; d++) acc[d] = 0.0f;
float m = -INFINITY;
for (uint j = lane; j < uint(kv_len); j += 32) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += float(q[bh * uint(head_dim) + uint(d)]) * float(k[kbase + j * uint(head_dim) + uint(d)]);
    m = metal::max(m, s * scale);
}
m = metal::simd_max(m);
float l = 0.0f;
for (uint j = lane; j < uint(kv_len); j += 32) {
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += float(q[bh * uint(head_dim) + uint(d)]) * float(k[kbase + j * uint(head_dim) + uint(d)]);
    float p = metal::exp(s * scale - m);
    l += p;
    for (int d = 0; d < head_dim; d++) acc[d] += p * float(v[kbase + j * uint(head_dim) + uint(d)]);
}
l = metal::simd_sum(l);
for (int d = 0; d < head_dim; d++) {
    float a = metal::simd_sum(acc[d]);
    if (lane == 0) o[bh * uint(head_dim) + uint(d)] = float16_t(a / l);
}
