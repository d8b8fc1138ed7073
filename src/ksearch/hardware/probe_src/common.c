/* Shared helpers for the ksearch ceiling probes, #included by each probe (not compiled alone; named .c so it
 * ships as package data): sorting, best/median, argument parsing.
 * Every probe prints one JSON object on stdout and exits 0, or prints a message on stderr and exits 1. */
#ifndef KSEARCH_PROBE_COMMON_H
#define KSEARCH_PROBE_COMMON_H
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_REPEATS 200

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n), n >= 1 (sorts a copy). */
static double median(const double *v, int n) {
    double tmp[MAX_REPEATS];
    for (int i = 0; i < n; i++) tmp[i] = v[i];
    qsort(tmp, n, sizeof(double), cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) if (v[i] > b) b = v[i];
    return b;
}

static double arg_double(int argc, char **argv, int i, double fallback) {
    return argc > i ? atof(argv[i]) : fallback;
}

/* Keeps the compiler from assuming memory is unchanged across this point. */
#define CLOBBER_MEMORY() __asm__ volatile("" ::: "memory")

/* Widest vector the compiler targets (-march=native): 512 bits with AVX-512F, 256 with AVX, else 128. */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif
typedef double vdouble __attribute__((vector_size(VEC_BYTES)));
#define VD_LANES (VEC_BYTES / 8)
#define SUM_ACC 8

/* Sum of a[0..n) through SUM_ACC independent vector accumulators: a read-only stream (8 B per element) not held
 * back by the latency of one add chain. `a` must be VEC_BYTES-aligned. */
__attribute__((unused)) static double sum_doubles(const double *restrict a, long n) {
    vdouble acc[SUM_ACC];
    for (int k = 0; k < SUM_ACC; k++) acc[k] = (vdouble){0};
    const vdouble *v = (const vdouble *)a;
    long step = SUM_ACC * VD_LANES, i = 0;
    for (; i + step <= n; i += step)
        for (int k = 0; k < SUM_ACC; k++) acc[k] += v[i / VD_LANES + k];
    for (int k = 1; k < SUM_ACC; k++) acc[0] += acc[k];
    double s = 0;
    for (int l = 0; l < VD_LANES; l++) s += acc[0][l];
    for (; i < n; i++) s += a[i];
    return s;
}
#endif
