/* FP32 FMA-rate probe: CHAINS independent vector FMA chains per thread, held in registers, all OpenMP threads.
 * usage: fma BUDGET_S
 * Vector width follows the ISA the compiler targets (-march=native): 512 bits with AVX-512F, 256 with AVX, else 128.
 * An FMA counts 2 FLOP. Prints {"best_flops", "median_flops", "repeats", "threads", "lanes", "chains"}. */
#include "common.c"

#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
#define LANES (VBYTES / 4)
#define CHAINS 12
typedef float vf __attribute__((vector_size(VBYTES)));

static float sink[1024];

/* Runs `iters` iterations of CHAINS FMAs on every thread; returns the wall time in s. */
static double run(long iters, float a, float b) {
    double t0 = omp_get_wtime();
#pragma omp parallel
    {
        int tid = omp_get_thread_num();
        vf va = (vf){0} + a, vb = (vf){0} + b, acc[CHAINS];
        for (int c = 0; c < CHAINS; c++) acc[c] = (vf){0} + (float)(c + tid) * 1e-3f;
        for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
            for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * va + vb;
        }
        vf total = (vf){0};
        for (int c = 0; c < CHAINS; c++) total += acc[c];
        float t = 0;
        for (int l = 0; l < LANES; l++) t += total[l];
        sink[tid % 1024] = t;
    }
    return omp_get_wtime() - t0;
}

int main(int argc, char **argv) {
    double budget_s = arg_double(argc, argv, 1, 0.5);
    /* a < 1 keeps every chain converging to b / (1 - a) = 1: no overflow, no denormals */
    float a = (float)arg_double(argc, argv, 2, 0.9999), b = (float)arg_double(argc, argv, 3, 0.0001);
    int threads = omp_get_max_threads();
    long iters = 1 << 16;
    while (run(iters, a, b) < budget_s / 20 && iters < (1L << 40)) iters *= 2; /* calibrate (and warm up) */
    double rate[MAX_REPEATS];
    int reps = 0;
    double start = omp_get_wtime();
    while (reps < MAX_REPEATS && (reps < 3 || omp_get_wtime() - start < budget_s)) {
        double t = run(iters, a, b);
        rate[reps++] = 2.0 * CHAINS * LANES * (double)iters * threads / t;
    }
    printf("{\"best_flops\": %.6g, \"median_flops\": %.6g, \"repeats\": %d, \"threads\": %d, \"lanes\": %d, "
           "\"chains\": %d, \"iters\": %ld, \"check\": %.6g}\n",
           best(rate, reps), median(rate, reps), reps, threads, LANES, CHAINS, iters, sink[0]);
    return 0;
}
