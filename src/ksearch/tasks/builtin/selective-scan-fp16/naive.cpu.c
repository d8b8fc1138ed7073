/* Naive selective scan (Mamba-1 S6 forward), the baseline every CPU speedup is measured against.
 * Float16 activations (u, delta, B, C, z, out), float32 A, D, delta_bias, last_state and arithmetic.
 * Plain scalar loops, one (b, d) row at a time, token by token, state in a float array.
 * ABI (ksearch cpu target): inputs in definition order, outputs, then every axis as int64_t.
 * Layouts: u, delta, z, out: [batch][dim][seqlen]; A: [dim][dstate]; B, C: [batch][dstate][seqlen];
 * D, delta_bias: [dim]; h0 (the initial state), last_state: [batch][dim][dstate]. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void run(const _Float16 *u, const _Float16 *delta, const float *A, const _Float16 *B, const _Float16 *C,
         const float *D, const _Float16 *z, const float *delta_bias,
         const float *h0, _Float16 *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {
    float *h = malloc(sizeof(float) * dstate);
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t d = 0; d < dim; d++) {
            for (int64_t n = 0; n < dstate; n++) h[n] = h0[(b * dim + d) * dstate + n];
            const int64_t row = (b * dim + d) * seqlen;
            for (int64_t t = 0; t < seqlen; t++) {
                float x = (float)delta[row + t] + delta_bias[d];
                float dt = x > 20.0f ? x : log1pf(expf(x)); /* softplus */
                float ut = (float)u[row + t];
                float y = 0.0f;
                for (int64_t n = 0; n < dstate; n++) {
                    int64_t bn = (b * dstate + n) * seqlen + t;
                    h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * (float)B[bn] * ut;
                    y += (float)C[bn] * h[n];
                }
                y += D[d] * ut;
                float zt = (float)z[row + t];
                out[row + t] = (_Float16)(y * (zt / (1.0f + expf(-zt))));
            }
            for (int64_t n = 0; n < dstate; n++) last_state[(b * dim + d) * dstate + n] = h[n];
        }
    }
    free(h);
}
