"""Small C kernels for the selective-scan task (fp32 ABI), honest and broken."""

SIG = """#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <signal.h>
void run(const float *u, const float *delta, const float *A, const float *B, const float *C,
         const float *D, const float *z, const float *delta_bias, const float *h0, float *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen)"""

WRONG = SIG + """ {
    for (int64_t i = 0; i < batch * dim * seqlen; i++) out[i] = u[i];
    for (int64_t i = 0; i < batch * dim * dstate; i++) last_state[i] = 0.0f;
}"""

ZEROS = SIG + """ {
    for (int64_t i = 0; i < batch * dim * seqlen; i++) out[i] = 0.0f;
    for (int64_t i = 0; i < batch * dim * dstate; i++) last_state[i] = 0.0f;
}"""

NAN = SIG + """ {
    for (int64_t i = 0; i < batch * dim * seqlen; i++) out[i] = NAN;
    for (int64_t i = 0; i < batch * dim * dstate; i++) last_state[i] = NAN;
}"""

SKIP_OUTPUT = SIG + """ { /* writes nothing: the poisoned outputs must fail */ }"""

SEGFAULT = SIG + """ { volatile float *p = 0; out[0] = *p; }"""

ABORT = SIG + """ { abort(); }"""

ENDLESS = SIG + """ { volatile int64_t i = 0; for (;;) i++; }"""

MUTATE_INPUT = SIG + """ { ((float *)u)[0] = 42.0f; }"""

SYNTAX_ERROR = SIG + """ { this is not C; }"""

NO_ENTRY = """void not_run(void) {}"""

CXX = """#include <cstdint>
#include <cmath>
#include <vector>
extern "C" void run(const float *u, const float *delta, const float *A, const float *B, const float *C,
         const float *D, const float *z, const float *delta_bias, const float *h0, float *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {
    std::vector<float> h(dstate);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t d = 0; d < dim; d++) {
            std::copy(h0 + (b * dim + d) * dstate, h0 + (b * dim + d + 1) * dstate, h.begin());
            for (int64_t t = 0; t < seqlen; t++) {
                int64_t i = (b * dim + d) * seqlen + t;
                float dt = std::log1p(std::exp(delta[i] + delta_bias[d])), y = D[d] * u[i];
                for (int64_t n = 0; n < dstate; n++) {
                    int64_t bn = (b * dstate + n) * seqlen + t;
                    h[n] = std::exp(dt * A[d * dstate + n]) * h[n] + dt * B[bn] * u[i];
                    y += C[bn] * h[n];
                }
                out[i] = y * z[i] / (1.0f + std::exp(-z[i]));
            }
            for (int64_t n = 0; n < dstate; n++) last_state[(b * dim + d) * dstate + n] = h[n];
        }
}"""

#: the naive scan with two loops after it per row: one GCC vectorizes (the skip term, a versioned loop: ``out``
#: may alias ``u``), one it cannot (the gate: expf without -ffast-math); the recurrence itself is not vectorized
VECTOR_SPLIT = SIG + """ {
    float *h = malloc(sizeof(float) * dstate);
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t d = 0; d < dim; d++) {
            for (int64_t n = 0; n < dstate; n++) h[n] = h0[(b * dim + d) * dstate + n];
            const int64_t row = (b * dim + d) * seqlen;
            for (int64_t t = 0; t < seqlen; t++) {
                float x = delta[row + t] + delta_bias[d];
                float dt = x > 20.0f ? x : log1pf(expf(x));
                float y = 0.0f;
                for (int64_t n = 0; n < dstate; n++) {
                    int64_t bn = (b * dstate + n) * seqlen + t;
                    h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * B[bn] * u[row + t];
                    y += C[bn] * h[n];
                }
                out[row + t] = y;
            }
            for (int64_t t = 0; t < seqlen; t++) out[row + t] += D[d] * u[row + t];
            for (int64_t t = 0; t < seqlen; t++) out[row + t] *= z[row + t] / (1.0f + expf(-z[row + t]));
            for (int64_t n = 0; n < dstate; n++) last_state[(b * dim + d) * dstate + n] = h[n];
        }
    }
    free(h);
}"""


#: the naive scan, honest except that it starts every row from h = 0 instead of the initial state h0: right on
#: every workload whose h0 is the default zeros, wrong on the ``h0`` check workloads
IGNORES_H0 = SIG + """ {
    float h[64];
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t d = 0; d < dim; d++) {
            for (int64_t n = 0; n < dstate; n++) h[n] = 0.0f;
            const int64_t row = (b * dim + d) * seqlen;
            for (int64_t t = 0; t < seqlen; t++) {
                float x = delta[row + t] + delta_bias[d];
                float dt = x > 20.0f ? x : log1pf(expf(x)), y = D[d] * u[row + t];
                for (int64_t n = 0; n < dstate; n++) {
                    int64_t bn = (b * dstate + n) * seqlen + t;
                    h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * B[bn] * u[row + t];
                    y += C[bn] * h[n];
                }
                out[row + t] = y * (z[row + t] / (1.0f + expf(-z[row + t])));
            }
            for (int64_t n = 0; n < dstate; n++) last_state[(b * dim + d) * dstate + n] = h[n];
        }
    }
}"""
