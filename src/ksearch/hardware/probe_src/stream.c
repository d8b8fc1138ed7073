/* STREAM-like memory bandwidth probe (after McCalpin's STREAM, https://www.cs.virginia.edu/stream/).
 * usage: stream TOTAL_BYTES BUDGET_S
 * Three float64 arrays of TOTAL_BYTES/3 each; copy (c=a) and triad (a=b+s*c) with all OpenMP threads.
 * Bytes counted as read + written (copy: 16 B/element, triad: 24 B/element), no write-allocate traffic.
 * Prints {"copy_best_gbs", "copy_median_gbs", "triad_best_gbs", "triad_median_gbs", "repeats", "threads", "bytes"}. */
#include "common.c"

int main(int argc, char **argv) {
    double total_bytes = arg_double(argc, argv, 1, 256e6);
    double budget_s = arg_double(argc, argv, 2, 0.5);
    long n = (long)(total_bytes / (3 * sizeof(double)));
    double *a = aligned_alloc(64, ((n * sizeof(double) + 63) / 64) * 64);
    double *b = aligned_alloc(64, ((n * sizeof(double) + 63) / 64) * 64);
    double *c = aligned_alloc(64, ((n * sizeof(double) + 63) / 64) * 64);
    if (!a || !b || !c) { fprintf(stderr, "stream: cannot allocate 3 x %ld doubles\n", n); return 1; }
    const double s = 0.5; /* a converges to 4: no overflow however many repeats */
    /* first touch by the thread that will use the page */
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }

    double copy_gbs[MAX_REPEATS], triad_gbs[MAX_REPEATS];
    int reps = 0;
    double start = omp_get_wtime();
    for (int r = -1; r < MAX_REPEATS; r++) { /* r = -1 is a warm-up pass, not recorded */
        double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i];
        double t1 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double t2 = omp_get_wtime();
        CLOBBER_MEMORY();
        if (r < 0) { start = omp_get_wtime(); continue; }
        copy_gbs[reps] = 16.0 * n / (t1 - t0) / 1e9;
        triad_gbs[reps] = 24.0 * n / (t2 - t1) / 1e9;
        reps++;
        if (reps >= 3 && omp_get_wtime() - start > budget_s) break;
    }
    double check = a[0] + a[n / 2] + a[n - 1] + c[n / 3];
    printf("{\"copy_best_gbs\": %.6g, \"copy_median_gbs\": %.6g, \"triad_best_gbs\": %.6g, "
           "\"triad_median_gbs\": %.6g, \"repeats\": %d, \"threads\": %d, \"bytes\": %.0f, \"check\": %.6g}\n",
           best(copy_gbs, reps), median(copy_gbs, reps), best(triad_gbs, reps), median(triad_gbs, reps),
           reps, omp_get_max_threads(), 3.0 * n * sizeof(double), check);
    free(a); free(b); free(c);
    return 0;
}
