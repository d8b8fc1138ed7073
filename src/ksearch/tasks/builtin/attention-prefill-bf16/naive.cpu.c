/* Naive attention prefill (causal or not, GQA), bfloat16 q, k, v, o with fp32 arithmetic: the baseline every CPU
 * speedup is measured against. attention-prefill's naive kernel with bfloat16 loads and stores: one query row at a
 * time, its scores against every key it sees in a float buffer, the max subtracted before expf, the exp-weighted
 * sum of the value rows, divided by the exp sum. OpenMP over (batch, query head). The same file serves
 * attention-prefill-bf16 (causal = 1) and attention-prefill-noncausal-bf16 (causal = 0): the const axis `causal`.
 * ABI (ksearch cpu target): inputs in definition order, outputs, then every axis as int64_t; bfloat16 arrays are
 * uint16_t (the bits: C has no portable bfloat16 type).
 * Layouts: q, o: [batch][q_heads][seqlen][head_dim]; k, v: [batch][kv_heads][seqlen][head_dim]; query head h
 * reads kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* bfloat16 -> float: the bits are a float's upper half (exact). */
static inline float bf2f(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float -> bfloat16, rounded to nearest even (as ksearch.tasks.inputs.bf16_from_f32 and __float2bfloat16 do);
 * a NaN stays a NaN (quiet bit forced, so the rounding carry cannot turn it into an infinity). */
static inline uint16_t f2bf(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void run(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *o, int64_t batch, int64_t q_heads,
         int64_t kv_heads, int64_t seqlen, int64_t head_dim, int64_t causal) {
    const int64_t group = q_heads / kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < q_heads; h++) {
            float *s = malloc(sizeof(float) * (size_t)seqlen);
            float *acc = malloc(sizeof(float) * (size_t)head_dim);
            const uint16_t *qh = q + (b * q_heads + h) * seqlen * head_dim;
            const uint16_t *kh = k + (b * kv_heads + h / group) * seqlen * head_dim;
            const uint16_t *vh = v + (b * kv_heads + h / group) * seqlen * head_dim;
            uint16_t *oh = o + (b * q_heads + h) * seqlen * head_dim;
            for (int64_t i = 0; i < seqlen; i++) {
                const int64_t n = causal ? i + 1 : seqlen; /* keys query i sees */
                float m = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    float dot = 0.0f;
                    for (int64_t d = 0; d < head_dim; d++)
                        dot += bf2f(qh[i * head_dim + d]) * bf2f(kh[j * head_dim + d]);
                    s[j] = dot * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
                float l = 0.0f;
                for (int64_t j = 0; j < n; j++) {
                    float p = expf(s[j] - m);
                    l += p;
                    for (int64_t d = 0; d < head_dim; d++) acc[d] += p * bf2f(vh[j * head_dim + d]);
                }
                for (int64_t d = 0; d < head_dim; d++) oh[i * head_dim + d] = f2bf(acc[d] / l);
            }
            free(s);
            free(acc);
        }
    }
}
