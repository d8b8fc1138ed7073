/* Naive selective scan (Mamba-1 S6 forward), float16 activations, for the cuda target: the baseline GPU
 * speedups are measured against. One thread per (batch, channel) row, sequential over the tokens, fp32
 * state in a local array (dstate <= 64, the task's axis maximum) and fp32 arithmetic.
 * Launch plan: naive.cuda.launch.yaml (1-D grid over batch*dim rows).
 * ABI (docs/cuda-target.md): inputs in definition order, outputs, then every axis as long long.
 * Layouts: u, delta, z, out (half): [batch][dim][seqlen]; A (float): [dim][dstate]; B, C (half):
 * [batch][dstate][seqlen]; D, delta_bias (float): [dim]; h0 (the initial state), last_state (float):
 * [batch][dim][dstate]. */
#include <cuda_fp16.h>
#define MAX_DSTATE 64

extern "C" __global__ void naive_scan(const __half *u, const __half *delta, const float *A, const __half *B,
                                      const __half *C, const float *D, const __half *z, const float *delta_bias,
                                      const float *h0,
                                      __half *out, float *last_state, long long batch, long long dim,
                                      long long dstate, long long seqlen) {
    long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= batch * dim || dstate > MAX_DSTATE) return;
    long long b = r / dim, d = r % dim;
    float h[MAX_DSTATE];
    for (long long n = 0; n < dstate; n++) h[n] = h0[r * dstate + n];
    const long long row = r * seqlen;
    for (long long t = 0; t < seqlen; t++) {
        float x = __half2float(delta[row + t]) + delta_bias[d];
        float dt = x > 20.0f ? x : log1pf(expf(x)); /* softplus */
        float ut = __half2float(u[row + t]);
        float y = 0.0f;
        for (long long n = 0; n < dstate; n++) {
            long long bn = (b * dstate + n) * seqlen + t;
            h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * __half2float(B[bn]) * ut;
            y += __half2float(C[bn]) * h[n];
        }
        y += D[d] * ut;
        float zt = __half2float(z[row + t]);
        out[row + t] = __float2half(y * (zt / (1.0f + expf(-zt))));
    }
    for (long long n = 0; n < dstate; n++) last_state[r * dstate + n] = h[n];
}
