/*
 * A C session survives its arbiter under the control daemon (libshare-control -d): run by
 * tests/test_c_bindings.py, which kills or restarts the arbiter while this program runs.
 *
 *   test_reattach SHADER_DIR stream     two threads stream checked saxpy dispatches on one session
 *                                       (DEPTH in flight each, the same buffers and program all
 *                                       along) until standard input closes; prints "ready", then
 *                                       "progress OK RESTARTED" whenever the counts change. A wrong
 *                                       result, a failed call or a wait past 60 s fails the test;
 *                                       a ticket may fail with -LS_ERESTARTED (counted).
 *   test_reattach SHADER_DIR inflight   a long dispatch the arbiter has taken; prints "ready" and
 *                                       waits for a line (the harness kills the arbiter first): a
 *                                       control call (ls_alloc) reattaches, the ticket fails with
 *                                       -LS_ERESTARTED, and the old buffers and program carry on.
 *   test_reattach SHADER_DIR unrun      prints "ready" and waits for a line (the arbiter is dead by
 *                                       then): three dispatches pushed into the dead ring are sent to
 *                                       the new arbiter under the same tickets and each runs once;
 *                                       a device buffer is refused (-LS_EBUFFERLOST) until freed.
 *
 * LIBSHARE_MODE=daemon LIBSHARE_PIPE_DIRECTORY=DIR in the environment.
 */
#include "runner.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N 4096
#define DEPTH 4
#define THREADS 2
#define WAIT_NS 60000000000LL

static const char *shader_dir;
static ls_session *session;
static struct ls_program saxpy;

static int load(const char *name, struct ls_program *out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.spv", shader_dir, name);
    return ls_load_program_file(session, path, out);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* x = 0, 1, 2 ... and y = 1 over the buffers' first N floats. */
static void fill(struct ls_buffer *x, struct ls_buffer *y)
{
    float *xs = x->data, *ys = y->data;
    for (int i = 0; i < N; i++) {
        xs[i] = (float)i;
        ys[i] = 1.0f;
    }
}

/* y[from, from + count) == times * 2x + 1 exactly (small integers: no rounding). */
static int right(const struct ls_buffer *x, const struct ls_buffer *y, int from, int count, int times)
{
    const float *xs = x->data, *ys = y->data;
    for (int i = from; i < from + count; i++)
        if (ys[i] != (float)times * 2.0f * xs[i] + 1.0f)
            return 0;
    return 1;
}

/* saxpy (y += 2x) over count floats from float `from` of x and y. */
static int dispatch_saxpy(const struct ls_buffer *x, const struct ls_buffer *y, int from, int count,
                          uint64_t *ticket)
{
    struct {
        uint32_t n;
        float a;
    } push = {(uint32_t)count, 2.0f};
    uint32_t ids[2] = {x->id, y->id};
    uint64_t offsets[2] = {(uint64_t)from * 4, (uint64_t)from * 4};
    return ls_dispatch(session, saxpy.id, (uint32_t)count / 64, 1, 1, 2, ids, offsets, &push, sizeof push, ticket);
}

/* ------------------------------------------------------------------ stream */

/* Descriptors open in this process, and ring regions mapped: a reattach lets go of the old ones. */
static int open_fds(void)
{
    int count = 0;
    DIR *fds = opendir("/proc/self/fd");
    while (fds && readdir(fds))
        count++;
    if (fds)
        closedir(fds);
    return count;
}

static int mapped_rings(void)
{
    int count = 0;
    char line[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        count += strstr(line, "libshare-ring") != NULL;
    if (maps)
        fclose(maps);
    return count;
}

static int stopping, ok_count, restarted_count, failures;

struct worker {
    pthread_t thread;
    struct ls_buffer x, y;
};

static void *stream(void *arg)
{
    struct worker *w = arg;
    const int part = N / DEPTH;
    while (!__atomic_load_n(&stopping, __ATOMIC_RELAXED)) {
        fill(&w->x, &w->y);
        uint64_t tickets[DEPTH];
        for (int k = 0; k < DEPTH; k++) {
            int rc = dispatch_saxpy(&w->x, &w->y, k * part, part, &tickets[k]);
            if (rc != 0) {
                printf("  ls_dispatch: %d (%s): %s\n", rc, ls_strerror(rc), ls_error_message());
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                return NULL;
            }
        }
        for (int k = 0; k < DEPTH; k++) {
            int rc = ls_wait(session, tickets[k], WAIT_NS, NULL);
            if (rc == -LS_ERESTARTED) {
                __atomic_add_fetch(&restarted_count, 1, __ATOMIC_RELAXED);
            } else if (rc != 0) {
                printf("  ls_wait: %d (%s): %s\n", rc, ls_strerror(rc), ls_error_message());
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                return NULL;
            } else if (!right(&w->x, &w->y, k * part, part, 1)) {
                printf("  a wrong result for ticket %llu\n", (unsigned long long)tickets[k]);
                __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
                return NULL;
            } else {
                __atomic_add_fetch(&ok_count, 1, __ATOMIC_RELAXED);
            }
        }
    }
    return NULL;
}

/* 1 once standard input has closed (EOF); waits up to timeout_ms for it. */
static int input_closed(int timeout_ms)
{
    struct pollfd in = {.fd = 0, .events = POLLIN};
    if (poll(&in, 1, timeout_ms) <= 0)
        return 0;
    char scratch[256];
    return read(0, scratch, sizeof scratch) <= 0;
}

TEST(stream_survives_the_arbiter)
{
    CHECK_RC(ls_connect(NULL, &session), 0);
    CHECK_RC(load("saxpy", &saxpy), 0);
    static struct worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &workers[i].x), 0);
        CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &workers[i].y), 0);
    }
    int fds = open_fds(), rings = mapped_rings();
    for (int i = 0; i < THREADS; i++)
        CHECK_RC(pthread_create(&workers[i].thread, NULL, stream, &workers[i]), 0);
    printf("ready\n");
    fflush(stdout);
    int shown_ok = -1, shown_restarted = -1;
    while (!input_closed(20)) {
        int ok = __atomic_load_n(&ok_count, __ATOMIC_RELAXED);
        int restarted = __atomic_load_n(&restarted_count, __ATOMIC_RELAXED);
        if (ok != shown_ok || restarted != shown_restarted) {
            printf("progress %d %d\n", ok, restarted);
            fflush(stdout);
            shown_ok = ok;
            shown_restarted = restarted;
        }
        if (__atomic_load_n(&failures, __ATOMIC_RELAXED))
            break;
    }
    __atomic_store_n(&stopping, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < THREADS; i++)
        pthread_join(workers[i].thread, NULL);
    printf("ok=%d restarted=%d\n", ok_count, restarted_count);
    CHECK(failures == 0);
    CHECK(ok_count > 0);
    /* The same buffers (ids and mappings) and program, on whichever arbiter serves now. */
    for (int i = 0; i < THREADS; i++) {
        fill(&workers[i].x, &workers[i].y);
        uint64_t ticket;
        CHECK_RC(dispatch_saxpy(&workers[i].x, &workers[i].y, 0, N, &ticket), 0);
        CHECK_RC(ls_wait(session, ticket, WAIT_NS, NULL), 0);
        CHECK(right(&workers[i].x, &workers[i].y, 0, N, 1));
    }
    printf("fds %d -> %d, rings %d -> %d\n", fds, open_fds(), rings, mapped_rings());
    CHECK(open_fds() == fds && mapped_rings() == rings && rings == 1);
    ls_disconnect(session);
}

/* ------------------------------------------------------------------ one kill, told */

static void wait_for_line(void)
{
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        printf("  no line on standard input\n");
}

TEST(a_ticket_in_flight_fails_with_restarted)
{
    struct ls_program busy;
    struct ls_buffer data, x, y, more;
    CHECK_RC(ls_connect(NULL, &session), 0);
    CHECK_RC(load("busy", &busy), 0);
    CHECK_RC(load("saxpy", &saxpy), 0);
    CHECK_RC(ls_alloc(session, 1 << 18, LS_BUFFER_SHARED, &data), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &y), 0);
    struct {
        uint32_t n, iterations;
    } push = {1 << 16, 1000000};        /* seconds of work */
    uint64_t running;
    CHECK_RC(ls_dispatch(session, busy.id, 1024, 1, 1, 1, &data.id, NULL, &push, sizeof push, &running), 0);
    struct ls_stats stats = {0};
    double started = seconds_now();
    while (stats.submitted < 1 && seconds_now() - started < 60) /* until the arbiter took it */
        CHECK_RC(ls_stats(session, &stats), 0);
    CHECK(stats.submitted >= 1);
    CHECK_RC(ls_poll(session, running), 0);
    wait_for_line();                    /* the arbiter is dead now */
    CHECK_RC(ls_alloc(session, 4096, LS_BUFFER_SHARED, &more), 0); /* a control call reattaches */
    CHECK_RC(ls_wait(session, running, WAIT_NS, NULL), -LS_ERESTARTED);
    CHECK(strstr(ls_error_message(), "submit it again") != NULL);
    fill(&x, &y);
    uint64_t ticket;
    CHECK_RC(dispatch_saxpy(&x, &y, 0, N, &ticket), 0);
    CHECK_RC(ls_wait(session, ticket, WAIT_NS, NULL), 0);
    CHECK(right(&x, &y, 0, N, 1));
    ls_disconnect(session);
}

TEST(work_the_dead_arbiter_never_took_runs_on_the_new_one)
{
    struct ls_buffer x, y, scratch, again;
    CHECK_RC(ls_connect(NULL, &session), 0);
    CHECK_RC(load("saxpy", &saxpy), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_SHARED, &y), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_DEVICE, &scratch), 0);
    fill(&x, &y);
    wait_for_line();                    /* the arbiter is dead now: the pushes land in its ring */
    uint64_t tickets[3], ticket;
    for (int i = 0; i < 3; i++)
        CHECK_RC(dispatch_saxpy(&x, &y, 0, N, &tickets[i]), 0);
    for (int i = 0; i < 3; i++)
        CHECK_RC(ls_wait(session, tickets[i], WAIT_NS, NULL), 0);
    CHECK(right(&x, &y, 0, N, 3));      /* y += 2x three times: each ran once */
    /* The device buffer died with the old arbiter: refused (twice) until freed, then made again. */
    for (int i = 0; i < 2; i++)
        CHECK_RC(ls_copy(session, x.id, 0, scratch.id, 0, N * 4, &ticket), -LS_EBUFFERLOST);
    CHECK(strstr(ls_error_message(), "died with the arbiter") != NULL);
    uint32_t xy[2] = {x.id, y.id};      /* as the counts' buffer of an indirect dispatch too */
    CHECK_RC(ls_dispatch_indirect(session, saxpy.id, scratch.id, 0, 2, xy, NULL, NULL, 0, &ticket), -LS_EBUFFERLOST);
    CHECK_RC(ls_free_buffer(session, scratch.id), 0);
    CHECK_RC(ls_alloc(session, N * 4, LS_BUFFER_DEVICE, &again), 0);
    CHECK_RC(ls_copy(session, x.id, 0, again.id, 0, N * 4, &ticket), 0);
    CHECK_RC(ls_wait(session, ticket, WAIT_NS, NULL), 0);
    CHECK_RC(ls_copy(session, again.id, 0, y.id, 0, N * 4, &ticket), 0);
    CHECK_RC(ls_wait(session, ticket, WAIT_NS, NULL), 0);
    CHECK(((float *)y.data)[N - 1] == (float)(N - 1));
    ls_disconnect(session);
}

int main(int argc, char **argv)
{
    shader_dir = argc > 1 ? argv[1] : "shaders";
    const char *mode = argc > 2 ? argv[2] : "stream";
    static const struct test tests[] = {
        {"stream_survives_the_arbiter", stream_survives_the_arbiter},
        {"a_ticket_in_flight_fails_with_restarted", a_ticket_in_flight_fails_with_restarted},
        {"work_the_dead_arbiter_never_took_runs_on_the_new_one", work_the_dead_arbiter_never_took_runs_on_the_new_one},
    };
    int which = strcmp(mode, "inflight") == 0 ? 1 : strcmp(mode, "unrun") == 0 ? 2 : 0;
    return run_tests(&tests[which], 1);
}
