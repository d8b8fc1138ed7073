/* Naive selective scan (Mamba-1 S6 forward) for the cuda target: the baseline GPU speedups are measured
 * against. One thread per (batch, channel) row, sequential over the tokens, fp32 state in a local array
 * (dstate <= 64, the task's axis maximum). Launch plan: naive.cuda.launch.yaml (1-D grid over batch*dim rows).
 * ABI (docs/cuda-target.md): inputs in definition order, outputs, then every axis as long long.
 * Layouts: u, delta, z, out: [batch][dim][seqlen]; A: [dim][dstate]; B, C: [batch][dstate][seqlen];
 * D, delta_bias: [dim]; h0 (the initial state), last_state: [batch][dim][dstate]. */
#define MAX_DSTATE 64

extern "C" __global__ void naive_scan(const float *u, const float *delta, const float *A, const float *B,
                                      const float *C, const float *D, const float *z, const float *delta_bias,
                                      const float *h0,
                                      float *out, float *last_state, long long batch, long long dim,
                                      long long dstate, long long seqlen) {
    long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= batch * dim || dstate > MAX_DSTATE) return;
    long long b = r / dim, d = r % dim;
    float h[MAX_DSTATE];
    for (long long n = 0; n < dstate; n++) h[n] = h0[r * dstate + n];
    const long long row = r * seqlen;
    for (long long t = 0; t < seqlen; t++) {
        float x = delta[row + t] + delta_bias[d];
        float dt = x > 20.0f ? x : log1pf(expf(x)); /* softplus */
        float ut = u[row + t];
        float y = 0.0f;
        for (long long n = 0; n < dstate; n++) {
            long long bn = (b * dstate + n) * seqlen + t;
            h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * B[bn] * ut;
            y += C[bn] * h[n];
        }
        y += D[d] * ut;
        float zt = z[row + t];
        out[row + t] = y * (zt / (1.0f + expf(-zt)));
    }
    for (long long n = 0; n < dstate; n++) last_state[r * dstate + n] = h[n];
}
