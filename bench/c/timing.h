/*
 * Shared by the C round-trip benchmarks: time ROUNDS batches of an operation
 * and print the median nanoseconds per operation as "NAME NS".
 */
#ifndef LIBSHARE_BENCH_TIMING_H
#define LIBSHARE_BENCH_TIMING_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 15

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int bench_compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Run op(arg) batch times per round, ROUNDS rounds (after one warm-up round); print the median. */
static int bench(const char *name, int (*op)(void *), void *arg, int batch)
{
    double per_op[ROUNDS];
    for (int round = -1; round < ROUNDS; round++) {
        double start = bench_now();
        for (int i = 0; i < batch; i++)
            if (op(arg) != 0)
                return fprintf(stderr, "%s failed\n", name), 1;
        if (round >= 0)
            per_op[round] = (bench_now() - start) / batch;
    }
    qsort(per_op, ROUNDS, sizeof per_op[0], bench_compare);
    printf("%s %.0f\n", name, per_op[ROUNDS / 2]);
    fflush(stdout);
    return 0;
}

#endif
