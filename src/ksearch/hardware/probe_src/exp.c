/* exp-throughput probe over an L1-resident array, all OpenMP threads; two ways of computing exp, timed alternately.
 * usage: exp BUDGET_S
 * Built with -O3 -march=native -ffast-math, as a generated kernel would be.
 * - libmvec: y = expf(x); -ffast-math lets GCC vectorize the loop through glibc's libmvec (_ZGV...expf).
 * - poly: y = exp2f(x) by a polynomial, the way fast kernels compute exp(x) = exp2(x * log2(e)):
 *   Cody-Waite reduction n = rint(x), f = x - n (exact, |f| <= 0.5); 2^f by a degree-6 minimax polynomial
 *   (relative error 3.9e-9 in exact arithmetic) in Horner form, 6 FMAs; 2^n by shifting n + 127 into the exponent
 *   bits. Valid for x in [-126, 126] (no clamping: a kernel that clamps does more work, so this rate stays an upper
 *   bound on its rate). The multiply by log2(e) of exp(x) is left out for the same reason.
 *   Its accuracy is checked against exp2 in double precision over [-126, 126] and [-1, 1] with the same compiled
 *   loop that is timed: "poly_max_rel_err".
 * scalar_* are the same loops with vectorization turned off, timed (best of 3) to show the vector path was taken.
 * Prints {"libmvec_best_per_s", "libmvec_median_per_s", "libmvec_scalar_per_s", "libmvec_repeats",
 *         "poly_best_per_s", "poly_median_per_s", "poly_scalar_per_s", "poly_repeats", "poly_max_rel_err",
 *         "poly_worst_x", "poly_checked", "threads", "n"}: evaluations per second (all threads). */
#include <math.h>
#include <string.h>
#include "common.c"

#define N 2048 /* floats per thread and array: x + y = 16 KiB, inside any L1d */

/* 2^f ~= 1 + f*(C1 + f*(C2 + f*(C3 + f*(C4 + f*(C5 + f*C6))))) on [-0.5, 0.5], minimax in relative error */
#define C1 6.931472421e-01f
#define C2 2.402265072e-01f
#define C3 5.550297350e-02f
#define C4 9.618030861e-03f
#define C5 1.341000083e-03f
#define C6 1.546973217e-04f

static inline float exp2f_poly(float x) {
    float nf = rintf(x);
    float f = x - nf;
    float p = C6;
    p = p * f + C5;
    p = p * f + C4;
    p = p * f + C3;
    p = p * f + C2;
    p = p * f + C1;
    p = p * f + 1.0f;
    int bits = ((int)nf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Not static, so that the symbols keep these names for the disassembly check (objdump --disassemble=...). */
__attribute__((noinline)) void ksearch_vec_expf(const float *restrict x, float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = expf(x[i]);
}

__attribute__((noinline, optimize("no-tree-vectorize"))) void ksearch_scalar_expf(const float *restrict x,
                                                                                  float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = expf(x[i]);
}

__attribute__((noinline)) void ksearch_vec_exp2_poly(const float *restrict x, float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = exp2f_poly(x[i]);
}

__attribute__((noinline, optimize("no-tree-vectorize"))) void ksearch_scalar_exp2_poly(const float *restrict x,
                                                                                       float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = exp2f_poly(x[i]);
}

typedef void (*kernel_fn)(const float *restrict, float *restrict);
static float sink[1024];

/* Runs `reps` passes of fn on every thread; returns the wall time in s. */
static double run(kernel_fn fn, long reps) {
    double t0 = omp_get_wtime();
#pragma omp parallel
    {
        float *x = aligned_alloc(64, N * sizeof(float)), *y = aligned_alloc(64, N * sizeof(float));
        for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / N;
#pragma omp barrier
        for (long r = 0; r < reps; r++) {
            fn(x, y);
            CLOBBER_MEMORY();
        }
        sink[omp_get_thread_num() % 1024] = y[N / 3];
        free(x); free(y);
    }
    return omp_get_wtime() - t0;
}

/* Smallest power-of-two repeat count (>= 16) whose run takes at least `target_s` (also warms up). Each step is
 * the faster of two runs: on shared cores one run can be stalled by another process, which would stop the doubling
 * too early and leave runs so short that thread start-up dominates them. */
static long calibrate(kernel_fn fn, double target_s) {
    long reps = 16;
    while (reps < (1L << 30)) {
        double t0 = run(fn, reps), t1 = run(fn, reps);
        if ((t0 < t1 ? t0 : t1) >= target_s) break;
        reps *= 2;
    }
    return reps;
}

/* Max relative error of ksearch_vec_exp2_poly against exp2 in double at `count` points evenly spaced over [lo, hi]
 * (both ends included), run through the timed loop in blocks of N. Updates *max_err and *worst_x. */
static void check_poly(float lo, float hi, long count, double *max_err, float *worst_x) {
    static float x[N] __attribute__((aligned(64))), y[N] __attribute__((aligned(64)));
    for (long start = 0; start < count; start += N) {
        for (int i = 0; i < N; i++) {
            long k = start + i < count ? start + i : count - 1;
            x[i] = (float)(lo + (hi - lo) * ((double)k / (double)(count - 1)));
            if (x[i] > hi) x[i] = hi;
        }
        ksearch_vec_exp2_poly(x, y);
        for (int i = 0; i < N; i++) {
            unsigned bits;
            memcpy(&bits, &y[i], sizeof bits);
            double want = exp2((double)x[i]);
            /* inf / NaN tested on the bits: -ffast-math lets the compiler assume neither occurs */
            double err = (bits & 0x7f800000u) == 0x7f800000u ? 1e300 : fabs((double)y[i] - want) / want;
            if (err > *max_err) { *max_err = err; *worst_x = x[i]; }
        }
    }
}

int main(int argc, char **argv) {
    double budget_s = arg_double(argc, argv, 1, 0.5);
    int threads = omp_get_max_threads();

    double max_err = 0.0;
    float worst_x = 0.0f;
    long checked = 3L << 19;
    check_poly(-126.0f, 126.0f, 2L << 19, &max_err, &worst_x);
    check_poly(-1.0f, 1.0f, 1L << 19, &max_err, &worst_x);

    /* Each variant gets half the budget; their repeats alternate so both see the same machine state. */
    kernel_fn vec[2] = {ksearch_vec_expf, ksearch_vec_exp2_poly};
    kernel_fn scalar[2] = {ksearch_scalar_expf, ksearch_scalar_exp2_poly};
    long reps[2];
    for (int v = 0; v < 2; v++) reps[v] = calibrate(vec[v], budget_s / 40);
    double rate[2][MAX_REPEATS];
    int n = 0;
    double start = omp_get_wtime();
    while (n < MAX_REPEATS && (n < 3 || omp_get_wtime() - start < budget_s * 0.7)) {
        for (int v = 0; v < 2; v++) rate[v][n] = (double)N * reps[v] * threads / run(vec[v], reps[v]);
        n++;
    }
    double scalar_rate[2] = {0, 0};
    for (int v = 0; v < 2; v++) { /* best of 3 short runs: one run alone is easily hit by noise */
        long sreps = reps[v] / 8 > 1 ? reps[v] / 8 : 1;
        for (int k = 0; k < 3; k++) {
            double r = (double)N * sreps * threads / run(scalar[v], sreps);
            if (r > scalar_rate[v]) scalar_rate[v] = r;
        }
    }
    printf("{\"libmvec_best_per_s\": %.6g, \"libmvec_median_per_s\": %.6g, \"libmvec_scalar_per_s\": %.6g, "
           "\"libmvec_repeats\": %d, \"poly_best_per_s\": %.6g, \"poly_median_per_s\": %.6g, "
           "\"poly_scalar_per_s\": %.6g, \"poly_repeats\": %d, \"poly_max_rel_err\": %.6g, \"poly_worst_x\": %.9g, "
           "\"poly_checked\": %ld, \"threads\": %d, \"n\": %d, \"check\": %.6g}\n",
           best(rate[0], n), median(rate[0], n), scalar_rate[0], n, best(rate[1], n), median(rate[1], n),
           scalar_rate[1], n, max_err, worst_x, checked, threads, N, sink[0]);
    return 0;
}
