/*
 * The same tiny saxpy dispatch through libshare from C, and what each path of
 * the C API costs. Connects as the environment says (LIBSHARE_MODE,
 * LIBSHARE_PIPE_DIRECTORY).
 *
 *   libshare_round_trip SAXPY_SPV                 prints "NAME NS" lines:
 *   c_round_trip     ls_dispatch + ls_wait, one at a time
 *   c_dispatch       one ls_dispatch call (the C hot path: a descriptor pushed), lane not full
 *   c_pipelined      per dispatch, 100 dispatches then ls_wait_idle
 *   c_stats          ls_stats: a control request served by the embedded Python
 *   c_alloc_free     ls_alloc + ls_free_buffer of a shared page: two control requests
 *   libshare_round_trip SAXPY_SPV --for SECONDS   after set-up prints "ready"; for each line
 *                    on stdin does round trips for SECONDS and prints their rate per second
 */
#include "timing.h"

#include <libshare.h>

struct tiny {
    ls_session *s;
    struct ls_program saxpy;
    uint32_t ids[2];
    struct { uint32_t n; float a; } push;
};

static int dispatch(struct tiny *t, uint64_t *ticket)
{
    return ls_dispatch(t->s, t->saxpy.id, 1, 1, 1, 2, t->ids, NULL, &t->push, sizeof t->push, ticket);
}

static int round_trip(void *arg)
{
    uint64_t ticket;
    return dispatch(arg, &ticket) || ls_wait(((struct tiny *)arg)->s, ticket, 10000000000LL, NULL);
}

static int pipelined(void *arg)
{
    uint64_t ticket;
    for (int i = 0; i < 100; i++)
        if (dispatch(arg, &ticket))
            return 1;
    return ls_wait_idle(((struct tiny *)arg)->s, 10000000000LL);
}

static int stats(void *arg)
{
    struct ls_stats out;
    return ls_stats(((struct tiny *)arg)->s, &out);
}

static int alloc_free(void *arg)
{
    struct ls_buffer b;
    ls_session *s = ((struct tiny *)arg)->s;
    return ls_alloc(s, 4096, LS_BUFFER_SHARED, &b) || ls_free_buffer(s, b.id);
}

/* Only the ls_dispatch calls are timed: 200 fit in a lane, so none waits for room. */
static int dispatch_cost(struct tiny *t)
{
    double per_op[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t ticket;
        double start = bench_now();
        for (int i = 0; i < 200; i++)
            if (dispatch(t, &ticket))
                return 1;
        per_op[round] = (bench_now() - start) / 200;
        if (ls_wait_idle(t->s, 10000000000LL))
            return 1;
    }
    qsort(per_op, ROUNDS, sizeof per_op[0], bench_compare);
    printf("c_dispatch %.1f\n", per_op[ROUNDS / 2]);
    return 0;
}

int main(int argc, char **argv)
{
    struct tiny t = {.push = {64, 1.0f}};
    struct ls_buffer x, y;
    struct ls_options options = {.name = "c-bench"};
    if (ls_connect(&options, &t.s) || ls_load_program_file(t.s, argc > 1 ? argv[1] : "shaders/saxpy.spv", &t.saxpy) ||
        ls_alloc(t.s, 4096, LS_BUFFER_SHARED, &x) || ls_alloc(t.s, 4096, LS_BUFFER_SHARED, &y))
        return fprintf(stderr, "set-up: %s\n", ls_error_message()), 1;
    t.ids[0] = x.id;
    t.ids[1] = y.id;
    double seconds = bench_for_seconds(argc, argv);
    int failed = seconds > 0 ? bench_for("c_round_trip", seconds, round_trip, &t)
                             : bench("c_round_trip", round_trip, &t, 200) || dispatch_cost(&t) ||
                                   bench("c_pipelined", pipelined, &t, 10) || bench("c_stats", stats, &t, 50) ||
                                   bench("c_alloc_free", alloc_free, &t, 20);
    ls_disconnect(t.s);
    return failed;
}
