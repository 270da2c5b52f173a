/*
 * Shared by the C round-trip benchmarks: time ROUNDS batches of an operation
 * and print the median nanoseconds per operation as "NAME NS"; or, given
 * "--for SECONDS" after the shader's path, run it for a while each time a line
 * comes on stdin (bench_for), so that several processes can be started
 * together, and run window after window.
 */
#ifndef LIBSHARE_BENCH_TIMING_H
#define LIBSHARE_BENCH_TIMING_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The seconds of "PROGRAM SPV --for SECONDS", or 0 when the mode is not asked for. */
static double bench_for_seconds(int argc, char **argv)
{
    return argc > 3 && strcmp(argv[2], "--for") == 0 ? atof(argv[3]) : 0;
}

/*
 * Print "ready", then for each line on stdin (the release of all the processes
 * at once) run op(arg) one call after another for the given seconds and print
 * the calls per second of elapsed time; return at the end of stdin.
 */
static int bench_for(const char *name, double seconds, int (*op)(void *), void *arg)
{
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        long count = 0;
        double start = bench_now(), now = start, end = start + seconds * 1e9;
        for (; now < end; now = bench_now(), count++)
            if (op(arg) != 0)
                return fprintf(stderr, "%s failed\n", name), 1;
        printf("%.1f\n", count / ((now - start) / 1e9));
        fflush(stdout);
    }
    return 0;
}

#endif
