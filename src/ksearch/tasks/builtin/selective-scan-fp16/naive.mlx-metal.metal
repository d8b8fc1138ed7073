// Naive selective scan (Mamba-1 S6 forward), float16 activations, as an MLX custom Metal kernel body
// (mx.fast.metal_kernel; format: docs/mlx-target.md). One thread per (batch, channel) row, sequential over the
// tokens, fp32 state and arithmetic. MLX generates the signature: inputs `const device T* u, delta, A, B, C, D,
// z, delta_bias, h0` (h0: float, the initial state), outputs `device T* out, last_state` (T: float16_t or float, per the definition), the thread
// attribute used below, and the axes batch, dim, dstate, seqlen as int template constants.
// Layouts: u, delta, z, out [batch][dim][seqlen]; A [dim][dstate]; B, C [batch][dstate][seqlen];
// D, delta_bias [dim]; h0, last_state [batch][dim][dstate].
// Not run on an Apple GPU by this project (none available): checked statically only.
const uint r = thread_position_in_grid.x;
if (r >= uint(batch * dim)) return;
const uint b = r / uint(dim), d = r % uint(dim), L = uint(seqlen);
float h[dstate];
for (int n = 0; n < dstate; n++) h[n] = h0[r * uint(dstate) + uint(n)];
for (uint t = 0; t < L; t++) {
    float x = float(delta[r * L + t]) + delta_bias[d];
    float dt = x > 20.0f ? x : metal::log(1.0f + metal::exp(x));  // softplus
    float ut = float(u[r * L + t]);
    float y = 0.0f;
    for (int n = 0; n < dstate; n++) {
        uint bn = (b * uint(dstate) + uint(n)) * L + t;
        h[n] = metal::exp(dt * A[d * uint(dstate) + uint(n)]) * h[n] + dt * float(B[bn]) * ut;
        y += float(C[bn]) * h[n];
    }
    y += D[d] * ut;
    float zt = float(z[r * L + t]);
    out[r * L + t] = float16_t(y * (zt / (1.0f + metal::exp(-zt))));
}
for (int n = 0; n < dstate; n++) last_state[r * uint(dstate) + uint(n)] = h[n];
