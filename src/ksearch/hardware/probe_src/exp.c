/* expf-throughput probe over an L1-resident array, all OpenMP threads.
 * usage: exp BUDGET_S
 * Built with -O3 -march=native -ffast-math so the loop in vec_exp is vectorized through glibc's libmvec, as a real
 * kernel would get it; scalar_exp is the same loop with vectorization turned off, timed for comparison.
 * Prints {"best_per_s", "median_per_s", "scalar_per_s", "repeats", "threads", "n"}: expf evaluations per second. */
#include <math.h>
#include "common.c"

#define N 2048 /* floats per thread and array: x + y = 16 KiB, inside any L1d */

__attribute__((noinline)) static void vec_exp(const float *restrict x, float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = expf(x[i]);
}

__attribute__((noinline, optimize("no-tree-vectorize"))) static void scalar_exp(const float *restrict x,
                                                                               float *restrict y) {
    for (int i = 0; i < N; i++) y[i] = expf(x[i]);
}

static float sink[1024];

/* Runs `reps` passes of fn on every thread; returns the wall time in s. */
static double run(void (*fn)(const float *restrict, float *restrict), long reps) {
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

int main(int argc, char **argv) {
    double budget_s = arg_double(argc, argv, 1, 0.5);
    int threads = omp_get_max_threads();
    long reps = 16;
    while (run(vec_exp, reps) < budget_s / 20 && reps < (1L << 30)) reps *= 2; /* calibrate (and warm up) */
    double rate[MAX_REPEATS];
    int n = 0;
    double start = omp_get_wtime();
    while (n < MAX_REPEATS && (n < 3 || omp_get_wtime() - start < budget_s * 0.8)) {
        double t = run(vec_exp, reps);
        rate[n++] = (double)N * reps * threads / t;
    }
    long sreps = reps / 8 > 1 ? reps / 8 : 1;
    double scalar = (double)N * sreps * threads / run(scalar_exp, sreps);
    printf("{\"best_per_s\": %.6g, \"median_per_s\": %.6g, \"scalar_per_s\": %.6g, \"repeats\": %d, "
           "\"threads\": %d, \"n\": %d, \"check\": %.6g}\n",
           best(rate, n), median(rate, n), scalar, n, threads, N, sink[0]);
    return 0;
}
