// Naive selective scan (Mamba-1 S6 forward), float32 throughout, as an MLX custom CUDA kernel body
// (mx.fast.cuda_kernel; format: docs/mlx-target.md). One thread per (batch, channel) row, sequential over the
// tokens, fp32 state and arithmetic. MLX generates the signature: inputs `const T* u, delta, A, B, C, D, z,
// delta_bias, h0` (h0: float, the initial state), outputs `T* out, last_state` (T: float), and the axes batch, dim,
// dstate, seqlen as `constexpr int`. Layouts: u, delta, z, out [batch][dim][seqlen]; A [dim][dstate];
// B, C [batch][dstate][seqlen]; D, delta_bias [dim]; h0, last_state [batch][dim][dstate].
const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
if (r >= (long long)batch * dim) return;
const long long b = r / dim, d = r % dim, L = seqlen;
float h[dstate];
for (int n = 0; n < dstate; n++) h[n] = h0[r * dstate + n];
for (long long t = 0; t < L; t++) {
    float x = (delta[r * L + t]) + delta_bias[d];
    float dt = x > 20.0f ? x : log1pf(expf(x));  // softplus
    float ut = (u[r * L + t]);
    float y = 0.0f;
    for (int n = 0; n < dstate; n++) {
        long long bn = (b * dstate + n) * L + t;
        h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * (B[bn]) * ut;
        y += (C[bn]) * h[n];
    }
    y += D[d] * ut;
    float zt = (z[r * L + t]);
    out[r * L + t] = y * (zt / (1.0f + expf(-zt)));
}
for (int n = 0; n < dstate; n++) last_state[r * dstate + n] = h[n];
