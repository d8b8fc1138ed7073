"""Naive cpu kernels (C) for the flashinfer-bench definitions under tests/fixtures/flashinfer_trace.

ABI (cpu target): inputs in definition order (scalars as double), outputs, then every axis as int64_t. bfloat16 is
uint16_t bits; float accumulation."""

BF16 = """#include <stdint.h>
#include <string.h>
#include <math.h>
static inline float bf(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t to_bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
"""

GEMM = """#include <stdint.h>
void run(const _Float16 *A, const _Float16 *B, _Float16 *C, int64_t M, int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += (float)A[m * K + k] * (float)B[n * K + k];
            C[m * N + n] = (_Float16)acc;
        }
}
"""

RMSNORM = BF16 + """
void run(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t batch_size, int64_t hidden_size) {
    for (int64_t b = 0; b < batch_size; b++) {
        float ss = 0.0f;
        for (int64_t i = 0; i < hidden_size; i++) { float v = bf(x[b * hidden_size + i]); ss += v * v; }
        float inv = 1.0f / sqrtf(ss / (float)hidden_size + 1e-6f);
        for (int64_t i = 0; i < hidden_size; i++)
            out[b * hidden_size + i] = to_bf(bf(x[b * hidden_size + i]) * inv * bf(w[i]));
    }
}
"""

GQA_DECODE = BF16 + """#include <stdlib.h>
void run(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *kv_indptr,
         const int32_t *kv_indices, double sm_scale, uint16_t *output, float *lse,
         int64_t batch_size, int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_pages,
         int64_t page_size, int64_t len_indptr, int64_t num_kv_indices) {
    int64_t group = num_qo_heads / num_kv_heads;
    for (int64_t b = 0; b < batch_size; b++)
        for (int64_t h = 0; h < num_qo_heads; h++) {
            int64_t beg = kv_indptr[b], end = kv_indptr[b + 1], n = end - beg, kh = h / group;
            uint16_t *o = output + (b * num_qo_heads + h) * head_dim;
            if (n <= 0) { for (int64_t d = 0; d < head_dim; d++) o[d] = 0; lse[b * num_qo_heads + h] = -INFINITY; continue; }
            float *s = malloc(sizeof(float) * n), m = -INFINITY, sum = 0.0f;
            const uint16_t *qh = q + (b * num_qo_heads + h) * head_dim;
            for (int64_t j = 0; j < n; j++) {
                const uint16_t *kr = k_cache + ((int64_t)kv_indices[beg + j] * num_kv_heads + kh) * head_dim;
                float dot = 0.0f;
                for (int64_t d = 0; d < head_dim; d++) dot += bf(qh[d]) * bf(kr[d]);
                s[j] = dot * (float)sm_scale;
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = 0; j < n; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
            for (int64_t d = 0; d < head_dim; d++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; j++)
                    acc += s[j] * bf(v_cache[((int64_t)kv_indices[beg + j] * num_kv_heads + kh) * head_dim + d]);
                o[d] = to_bf(acc / sum);
            }
            lse[b * num_qo_heads + h] = (m + logf(sum)) / logf(2.0f);
            free(s);
        }
}
"""

MLA_DECODE = BF16 + """#include <stdlib.h>
void run(const uint16_t *q_nope, const uint16_t *q_pe, const uint16_t *ckv, const uint16_t *kpe,
         const int32_t *kv_indptr, const int32_t *kv_indices, double sm_scale, uint16_t *output, float *lse,
         int64_t batch_size, int64_t num_qo_heads, int64_t dc, int64_t dp, int64_t page_size, int64_t num_pages,
         int64_t len_indptr, int64_t num_kv_indices) {
    for (int64_t b = 0; b < batch_size; b++)
        for (int64_t h = 0; h < num_qo_heads; h++) {
            int64_t beg = kv_indptr[b], n = kv_indptr[b + 1] - beg;
            uint16_t *o = output + (b * num_qo_heads + h) * dc;
            if (n <= 0) { for (int64_t d = 0; d < dc; d++) o[d] = 0; lse[b * num_qo_heads + h] = -INFINITY; continue; }
            float *s = malloc(sizeof(float) * n), m = -INFINITY, sum = 0.0f;
            const uint16_t *qn = q_nope + (b * num_qo_heads + h) * dc, *qp = q_pe + (b * num_qo_heads + h) * dp;
            for (int64_t j = 0; j < n; j++) {
                int64_t t = kv_indices[beg + j];
                float dot = 0.0f;
                for (int64_t d = 0; d < dc; d++) dot += bf(qn[d]) * bf(ckv[t * dc + d]);
                for (int64_t d = 0; d < dp; d++) dot += bf(qp[d]) * bf(kpe[t * dp + d]);
                s[j] = dot * (float)sm_scale;
                if (s[j] > m) m = s[j];
            }
            for (int64_t j = 0; j < n; j++) { s[j] = expf(s[j] - m); sum += s[j]; }
            for (int64_t d = 0; d < dc; d++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; j++) acc += s[j] * bf(ckv[(int64_t)kv_indices[beg + j] * dc + d]);
                o[d] = to_bf(acc / sum);
            }
            lse[b * num_qo_heads + h] = (m + logf(sum)) / logf(2.0f);
            free(s);
        }
}
"""

MOE_FP8 = BF16 + """
static float f8(uint8_t b) {  /* float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN */
    int e = (b >> 3) & 15, m = b & 7;
    float v = e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    if (e == 15 && m == 7) v = NAN;
    return (b & 0x80) ? -v : v;
}
void run(const float *logits, const uint8_t *hs, const float *scale, const uint16_t *w13, const uint16_t *w2,
         uint16_t *out, int64_t T, int64_t E, int64_t H, int64_t I, int64_t G) {
    float x[64], g[64], acc[64];
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float mx = l[0], sum = 0.0f;
        for (int64_t e = 1; e < E; e++) if (l[e] > mx) mx = l[e];
        for (int64_t e = 0; e < E; e++) sum += expf(l[e] - mx);
        int64_t a = 0, b = -1;
        for (int64_t e = 1; e < E; e++) if (l[e] > l[a]) a = e;
        for (int64_t e = 0; e < E; e++) if (e != a && (b < 0 || l[e] > l[b])) b = e;
        float pa = expf(l[a] - mx) / sum, pb = expf(l[b] - mx) / sum;
        for (int64_t k = 0; k < H; k++) { x[k] = f8(hs[t * H + k]) * scale[t]; acc[k] = 0.0f; }
        int64_t ex[2] = {a, b};
        float wt[2] = {pa / (pa + pb), pb / (pa + pb)};
        for (int r = 0; r < 2; r++) {
            const uint16_t *W1 = w13 + ex[r] * G * H, *W2 = w2 + ex[r] * H * I;
            for (int64_t j = 0; j < G; j++) {
                float s = 0.0f;
                for (int64_t k = 0; k < H; k++) s += x[k] * bf(W1[j * H + k]);
                g[j] = s;
            }
            for (int64_t j = 0; j < I; j++) g[j] = g[j] * (g[I + j] / (1.0f + expf(-g[I + j])));
            for (int64_t k = 0; k < H; k++) {
                float s = 0.0f;
                for (int64_t j = 0; j < I; j++) s += g[j] * bf(W2[k * I + j]);
                acc[k] += wt[r] * s;
            }
        }
        for (int64_t k = 0; k < H; k++) out[t * H + k] = to_bf(acc[k]);
    }
}
"""
