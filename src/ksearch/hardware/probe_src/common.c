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
#endif
