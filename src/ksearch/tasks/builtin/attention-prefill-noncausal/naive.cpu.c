/* Naive attention prefill (causal or not, GQA), float16 q, k, v, o with fp32 arithmetic: the baseline every CPU
 * speedup is measured against. One query row at a time: its scores against every key it sees in a float
 * buffer, the max subtracted before expf, the exp-weighted sum of the value rows, divided by the exp sum.
 * OpenMP over (batch, query head). The same file serves attention-prefill (causal = 1) and
 * attention-prefill-noncausal (causal = 0): the mask is the const axis `causal`.
 * ABI (ksearch cpu target): inputs in definition order, outputs, then every axis as int64_t.
 * Layouts: q, o: [batch][q_heads][seqlen][head_dim]; k, v: [batch][kv_heads][seqlen][head_dim]; query head h
 * reads kv head h / (q_heads / kv_heads); scale 1/sqrt(head_dim). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void run(const _Float16 *q, const _Float16 *k, const _Float16 *v, _Float16 *o, int64_t batch, int64_t q_heads,
         int64_t kv_heads, int64_t seqlen, int64_t head_dim, int64_t causal) {
    const int64_t group = q_heads / kv_heads;
    const float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < q_heads; h++) {
            float *s = malloc(sizeof(float) * (size_t)seqlen);
            float *acc = malloc(sizeof(float) * (size_t)head_dim);
            const _Float16 *qh = q + (b * q_heads + h) * seqlen * head_dim;
            const _Float16 *kh = k + (b * kv_heads + h / group) * seqlen * head_dim;
            const _Float16 *vh = v + (b * kv_heads + h / group) * seqlen * head_dim;
            _Float16 *oh = o + (b * q_heads + h) * seqlen * head_dim;
            for (int64_t i = 0; i < seqlen; i++) {
                const int64_t n = causal ? i + 1 : seqlen; /* keys query i sees */
                float m = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    float dot = 0.0f;
                    for (int64_t d = 0; d < head_dim; d++)
                        dot += (float)qh[i * head_dim + d] * (float)kh[j * head_dim + d];
                    s[j] = dot * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
                float l = 0.0f;
                for (int64_t j = 0; j < n; j++) {
                    float p = expf(s[j] - m);
                    l += p;
                    for (int64_t d = 0; d < head_dim; d++) acc[d] += p * (float)vh[j * head_dim + d];
                }
                for (int64_t d = 0; d < head_dim; d++) oh[i * head_dim + d] = (_Float16)(acc[d] / l);
            }
            free(s);
            free(acc);
        }
    }
}
