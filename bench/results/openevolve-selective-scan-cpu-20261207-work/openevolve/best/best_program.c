// EVOLVE-BLOCK-START
/* Naive selective scan (Mamba-1 S6 forward), the baseline every CPU speedup is measured against.
 * Plain scalar loops, one (b, d) row at a time, token by token, state in a float array.
 * ABI (ksearch cpu target): inputs in definition order, outputs, then every axis as int64_t.
 * Layouts: u, delta, z, out: [batch][dim][seqlen]; A: [dim][dstate]; B, C: [batch][dstate][seqlen];
 * D, delta_bias: [dim]; last_state: [batch][dim][dstate]. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __AVX2__
typedef __m256 V;
typedef __m256i VI;
#define VL 8
#define F(op) _mm256_##op
#define GT(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define CASTI _mm256_castsi256_ps
#else
typedef __m128 V;
typedef __m128i VI;
#define VL 4
#define F(op) _mm_##op
#define GT(a, b) _mm_cmpgt_ps(a, b)
#define CASTI _mm_castsi128_ps
#endif
#ifdef __FMA__
#define FMA(a, b, c) F(fmadd_ps)(a, b, c)
#else
#define FMA(a, b, c) F(add_ps)(F(mul_ps)(a, b), c)
#endif
#define LD F(loadu_ps)
#define ST F(storeu_ps)
#define S1 F(set1_ps)
#define ADD F(add_ps)
#define SUB F(sub_ps)
#define MUL F(mul_ps)
#define DIV F(div_ps)
#define VMAX F(max_ps)
#define VMIN F(min_ps)
#define AND F(and_ps)
#define TC 64
#define LOG2E 1.44269504f

/* 2^x: round to nearest integer n, Taylor(6) of 2^f for f in [-0.5, 0.5], scale by 2^n */
static inline V vexp2(V x) {
    x = VMAX(VMIN(x, S1(127.0f)), S1(-126.0f));
    VI n = F(cvtps_epi32)(x);
    V f = SUB(x, F(cvtepi32_ps)(n));
    V p = FMA(S1(1.5403530e-4f), f, S1(1.3333558e-3f));
    p = FMA(p, f, S1(9.6181291e-3f));
    p = FMA(p, f, S1(5.5504109e-2f));
    p = FMA(p, f, S1(2.4022651e-1f));
    p = FMA(p, f, S1(6.9314718e-1f));
    p = FMA(p, f, S1(1.0f));
    VI e = F(slli_epi32)(F(add_epi32)(n, F(set1_epi32)(127)), 23);
    return MUL(p, CASTI(e));
}
#define vexp(x) vexp2(MUL(x, S1(LOG2E)))

/* softplus(x) = max(x,0) + log1p(exp(-|x|)); log1p via Cephes logf polynomial on [sqrt(.5)-1, sqrt(2)-1] */
static inline V vsoftplus(V x) {
    V e = vexp(VMIN(x, SUB(S1(0.0f), x)));
    V k = AND(GT(e, S1(0.41421356f)), S1(1.0f));
    V m = FMA(k, MUL(S1(-0.5f), ADD(e, S1(1.0f))), e);
    V z = MUL(m, m);
    V p = FMA(S1(7.0376836292e-2f), m, S1(-1.1514610310e-1f));
    p = FMA(p, m, S1(1.1676998740e-1f));
    p = FMA(p, m, S1(-1.2420140846e-1f));
    p = FMA(p, m, S1(1.4249322787e-1f));
    p = FMA(p, m, S1(-1.6668057665e-1f));
    p = FMA(p, m, S1(2.0000714765e-1f));
    p = FMA(p, m, S1(-2.4999993993e-1f));
    p = FMA(p, m, S1(3.3333331174e-1f));
    V y = MUL(MUL(p, m), z);
    y = FMA(k, S1(-2.12194440e-4f), y);
    y = FMA(z, S1(-0.5f), y);
    V l = FMA(k, S1(0.693359375f), ADD(m, y));
    return ADD(VMAX(x, S1(0.0f)), l);
}

void run(const float *u, const float *delta, const float *A, const float *B, const float *C,
         const float *D, const float *z, const float *delta_bias, float *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {
    const int64_t nb = (dim + VL - 1) / VL;
#pragma omp parallel
    {
        float *At = malloc(sizeof(float) * (dstate * VL * 2 + 1)), *hs = At + dstate * VL;
        float xb[TC * VL], ub[TC * VL], zb[TC * VL], db[TC * VL], yb[TC * VL], bias[VL], Dv[VL];
#pragma omp for schedule(dynamic, 1)
        for (int64_t job = 0; job < batch * nb; job++) {
            const int64_t b = job / nb, d0 = (job % nb) * VL;
            const int nl = dim - d0 < VL ? (int)(dim - d0) : VL;
            for (int l = 0; l < VL; l++) {
                bias[l] = l < nl ? delta_bias[d0 + l] : 0.0f;
                Dv[l] = l < nl ? D[d0 + l] : 0.0f;
                for (int64_t n = 0; n < dstate; n++) {
                    At[n * VL + l] = l < nl ? A[(d0 + l) * dstate + n] * LOG2E : 0.0f;
                    hs[n * VL + l] = 0.0f;
                }
            }
            const float *Bb = B + b * dstate * seqlen, *Cb = C + b * dstate * seqlen;
            for (int64_t t0 = 0; t0 < seqlen; t0 += TC) {
                const int tc = seqlen - t0 < TC ? (int)(seqlen - t0) : TC;
                for (int l = 0; l < VL; l++) {
                    if (l < nl) {
                        const int64_t row = (b * dim + d0 + l) * seqlen + t0;
                        for (int t = 0; t < tc; t++) {
                            xb[t * VL + l] = delta[row + t] + bias[l];
                            ub[t * VL + l] = u[row + t];
                            zb[t * VL + l] = z[row + t];
                        }
                    } else {
                        for (int t = 0; t < tc; t++) xb[t * VL + l] = ub[t * VL + l] = zb[t * VL + l] = 0.0f;
                    }
                }
                for (int t = 0; t < tc; t++) {
                    V dt = vsoftplus(LD(xb + t * VL));
                    ST(xb + t * VL, dt);
                    ST(db + t * VL, MUL(dt, LD(ub + t * VL)));
                    ST(yb + t * VL, S1(0.0f));
                }
                for (int64_t n = 0; n < dstate; n++) {
                    const V a = LD(At + n * VL);
                    V h = LD(hs + n * VL);
                    const float *Bn = Bb + n * seqlen + t0, *Cn = Cb + n * seqlen + t0;
                    for (int t = 0; t < tc; t++) {
                        h = FMA(vexp2(MUL(LD(xb + t * VL), a)), h, MUL(LD(db + t * VL), S1(Bn[t])));
                        ST(yb + t * VL, FMA(h, S1(Cn[t]), LD(yb + t * VL)));
                    }
                    ST(hs + n * VL, h);
                }
                for (int t = 0; t < tc; t++) {
                    V zv = LD(zb + t * VL);
                    V y = FMA(LD(Dv), LD(ub + t * VL), LD(yb + t * VL));
                    ST(yb + t * VL, MUL(y, DIV(zv, ADD(S1(1.0f), vexp(SUB(S1(0.0f), zv))))));
                }
                for (int l = 0; l < nl; l++) {
                    float *o = out + (b * dim + d0 + l) * seqlen + t0;
                    for (int t = 0; t < tc; t++) o[t] = yb[t * VL + l];
                }
            }
            for (int l = 0; l < nl; l++)
                for (int64_t n = 0; n < dstate; n++)
                    last_state[(b * dim + d0 + l) * dstate + n] = hs[n * VL + l];
        }
        free(At);
    }
}
// EVOLVE-BLOCK-END
