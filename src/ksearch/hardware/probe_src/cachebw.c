/* Cache-bandwidth probe: every OpenMP thread streams over its own arrays, small enough to stay in one cache level.
 * usage: cachebw PER_THREAD_BYTES BUDGET_S
 * Each thread holds three float64 arrays of PER_THREAD_BYTES/3 in total (first touched by itself) and runs read
 * (sum of a, vector accumulators: 8 B/element), copy (c = a: 16 B) and triad (a = b + s*c: 24 B) over them
 * `inner` times between two barriers, so that thread start-up and barriers do not dominate arrays of a few KiB.
 * `inner` is calibrated (the faster of two runs per step, as exp.c does) so a timed region takes >= 1 ms.
 * Bytes counted as read + written, all threads together. Best and median over repeats until BUDGET_S.
 * Prints {"read_best_gbs", "read_median_gbs", "copy_best_gbs", "copy_median_gbs", "triad_best_gbs",
 *         "triad_median_gbs", "repeats", "threads", "bytes", "inner"}. */
#include "common.c"

#define MIN_REGION_S 1e-3

static double region_start, region_s; /* written by the master thread between barriers */
static int stop_now;

enum { READ, COPY, TRIAD };

/* `inner` passes of kernel `kind` on this thread's arrays, between barriers; every thread returns the region's
 * wall time as the master measured it. Called by all threads of the team. */
static double timed(int kind, long inner, double *restrict a, const double *restrict b, double *restrict c, long n,
                    double *sink) {
#pragma omp barrier
#pragma omp master
    region_start = omp_get_wtime();
    double s = 0;
    for (long r = 0; r < inner; r++) {
        if (kind == READ) {
            s += sum_doubles(a, n);
        } else if (kind == COPY) {
            for (long i = 0; i < n; i++) c[i] = a[i];
        } else {
            for (long i = 0; i < n; i++) a[i] = b[i] + 0.5 * c[i];
        }
        CLOBBER_MEMORY();
    }
#pragma omp barrier
#pragma omp master
    region_s = omp_get_wtime() - region_start;
#pragma omp barrier
    *sink += s;
    return region_s;
}

int main(int argc, char **argv) {
    double per_thread = arg_double(argc, argv, 1, 16384);
    double budget_s = arg_double(argc, argv, 2, 0.1);
    long n = (long)(per_thread / (3 * sizeof(double))) / 64 * 64; /* whole vector-accumulator steps */
    if (n < 64) n = 64;
    static double gbs[3][MAX_REPEATS];
    static const double bytes_per_elem[3] = {8.0, 16.0, 24.0};
    int reps = 0, threads = 1;
    long inner = 1;
    double check = 0;
#pragma omp parallel reduction(+ : check)
    {
        double *a = aligned_alloc(64, n * sizeof(double)), *b = aligned_alloc(64, n * sizeof(double)),
               *c = aligned_alloc(64, n * sizeof(double));
        for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
        double sink = 0;
#pragma omp single
        threads = omp_get_num_threads();
        for (;;) { /* calibrate on triad (the slowest per pass); every thread sees the same times */
            double t0 = timed(TRIAD, inner, a, b, c, n, &sink), t1 = timed(TRIAD, inner, a, b, c, n, &sink);
            if ((t0 < t1 ? t0 : t1) >= MIN_REGION_S || inner >= (1L << 30)) break;
#pragma omp barrier
#pragma omp single
            inner *= 2;
        }
        double start = omp_get_wtime();
        for (int r = 0; r < MAX_REPEATS; r++) {
            for (int k = 0; k < 3; k++) {
                double t = timed(k, inner, a, b, c, n, &sink);
#pragma omp master
                gbs[k][r] = bytes_per_elem[k] * n * inner * threads / t / 1e9;
            }
#pragma omp master
            reps = r + 1;
            /* every thread decides on the master's clock, so all leave together */
#pragma omp master
            stop_now = r >= 2 && omp_get_wtime() - start > budget_s;
#pragma omp barrier
            int stop = stop_now;
#pragma omp barrier
            if (stop) break;
        }
        check += sink * 1e-300 + a[n / 2];
        free(a); free(b); free(c);
    }
    printf("{\"read_best_gbs\": %.6g, \"read_median_gbs\": %.6g, \"copy_best_gbs\": %.6g, \"copy_median_gbs\": %.6g, "
           "\"triad_best_gbs\": %.6g, \"triad_median_gbs\": %.6g, \"repeats\": %d, \"threads\": %d, \"bytes\": %.0f, "
           "\"inner\": %ld, \"check\": %.6g}\n",
           best(gbs[0], reps), median(gbs[0], reps), best(gbs[1], reps), median(gbs[1], reps), best(gbs[2], reps),
           median(gbs[2], reps), reps, threads, 3.0 * n * sizeof(double) * threads, inner, check);
    return 0;
}
