/* STREAM-like memory bandwidth probe (after McCalpin's STREAM, https://www.cs.virginia.edu/stream/).
 * usage: stream TOTAL_BYTES BUDGET_S
 * Three float64 arrays of TOTAL_BYTES/3 each; copy (c=a), triad (a=b+s*c) and read (sum of a, vector accumulators)
 * with all OpenMP threads. Bytes counted as read + written (copy: 16 B/element, triad: 24, read: 8), no
 * write-allocate traffic. A read-only stream usually runs faster than copy or triad (no write-back), and a kernel
 * that mostly reads (a reduction, a matrix-vector product) can reach it: it is part of the ceiling.
 * Prints {"copy_best_gbs", "copy_median_gbs", "triad_best_gbs", "triad_median_gbs", "read_best_gbs",
 *         "read_median_gbs", "repeats", "threads", "bytes"}. */
#include "common.c"

/* One read pass over a[0..n) on every thread, each over its own contiguous chunk (64-double aligned). */
static double read_pass(const double *a, long n) {
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long chunk = (n / nt) / 64 * 64;
        long lo = t * chunk, hi = t == nt - 1 ? n : lo + chunk;
        total += sum_doubles(a + lo, hi - lo);
    }
    return total;
}

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

    double copy_gbs[MAX_REPEATS], triad_gbs[MAX_REPEATS], read_gbs[MAX_REPEATS], sums = 0;
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
        sums += read_pass(a, n);
        double t3 = omp_get_wtime();
        if (r < 0) { start = omp_get_wtime(); continue; }
        copy_gbs[reps] = 16.0 * n / (t1 - t0) / 1e9;
        triad_gbs[reps] = 24.0 * n / (t2 - t1) / 1e9;
        read_gbs[reps] = 8.0 * n / (t3 - t2) / 1e9;
        reps++;
        if (reps >= 3 && omp_get_wtime() - start > budget_s) break;
    }
    double check = a[0] + a[n / 2] + a[n - 1] + c[n / 3] + sums * 1e-300;
    printf("{\"copy_best_gbs\": %.6g, \"copy_median_gbs\": %.6g, \"triad_best_gbs\": %.6g, "
           "\"triad_median_gbs\": %.6g, \"read_best_gbs\": %.6g, \"read_median_gbs\": %.6g, \"repeats\": %d, "
           "\"threads\": %d, \"bytes\": %.0f, \"check\": %.6g}\n",
           best(copy_gbs, reps), median(copy_gbs, reps), best(triad_gbs, reps), median(triad_gbs, reps),
           best(read_gbs, reps), median(read_gbs, reps), reps, omp_get_max_threads(), 3.0 * n * sizeof(double),
           check);
    free(a); free(b); free(c);
    return 0;
}
