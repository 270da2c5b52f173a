/*
 * Tests of the C API's fills, updates, timestamps and indirect dispatches (single and in a command list) against
 * a real arbiter: the embedded default, or a daemon when LIBSHARE_MODE=daemon and
 * LIBSHARE_PIPE_DIRECTORY point at one. Results are checked element by element.
 *
 *   test_indirect SHADER_DIR
 */
#include "runner.h"

#include <stdint.h>
#include <errno.h>
#include <string.h>

#define N 1024                          /* elements of x and y */

static ls_session *S;
static const char *shader_dir;
static struct ls_program saxpy;
static struct ls_buffer x, y, counts;

struct saxpy_push {
    uint32_t n;
    float a;
};

/* x = 1, y = i, the counts' words = zero. */
static void reset(void)
{
    float *xs = x.data, *ys = y.data;
    for (uint32_t i = 0; i < N; i++)
        xs[i] = 1.0f, ys[i] = (float)i;
    memset(counts.data, 0, 64);
}

/* 1 when y[i] == i + 2 for i < done (saxpy with a = 2 ran there) and y[i] == i past it. */
static int ran_over(uint32_t done)
{
    const float *ys = y.data;
    for (uint32_t i = 0; i < N; i++)
        if (ys[i] != (float)i + (i < done ? 2.0f : 0.0f))
            return 0;
    return 1;
}

/* An indirect saxpy over the counts at byte `at` of the counts buffer; its wait's result. */
static int indirect_at(uint64_t at)
{
    uint32_t xy[2] = {x.id, y.id};
    struct saxpy_push push = {N, 2.0f};
    uint64_t ticket;
    int rc = ls_dispatch_indirect(S, saxpy.id, counts.id, at, 2, xy, NULL, &push, sizeof push, &ticket);
    return rc < 0 ? rc : ls_wait(S, ticket, LS_FOREVER, NULL);
}

TEST(indirect_dispatch_runs_the_counts_it_reads)
{
    reset();
    uint32_t *words = counts.data;
    words[4] = 3, words[5] = 1, words[6] = 1;         /* 3 workgroups of 64, at byte 16 */
    CHECK_RC(indirect_at(16), 0);
    CHECK(ran_over(3 * 64));
}

TEST(indirect_counts_past_the_limit_run_nothing)
{
    reset();
    uint32_t *words = counts.data;
    words[0] = UINT32_MAX, words[1] = 1, words[2] = 1;
    CHECK_RC(indirect_at(0), -LS_EGROUPS);
    words[0] = 65535, words[1] = 65535, words[2] = 2;  /* each within most limits, their product past 2^32 - 1 */
    CHECK_RC(indirect_at(0), -LS_EGROUPS);
    CHECK(ran_over(0));
    words[0] = 0, words[1] = 7, words[2] = 7;          /* a zero count: nothing, and success */
    CHECK_RC(indirect_at(0), 0);
    CHECK(ran_over(0));
}

TEST(indirect_counts_outside_their_buffer_are_refused)
{
    reset();
    CHECK_RC(indirect_at(counts.size - 8), -LS_ERANGE);  /* 12 bytes do not fit */
    CHECK_RC(indirect_at(counts.size), -LS_ERANGE);
    CHECK_RC(indirect_at(2), -LS_ERANGE);                 /* misaligned */
    CHECK_RC(indirect_at(UINT64_MAX - 3), -LS_ERANGE);
    CHECK(ran_over(0));
}

TEST(fill_and_update_write_their_range)
{
    reset();
    uint64_t ticket;
    uint32_t words[4] = {10, 11, 12, 13};
    CHECK_RC(ls_fill(S, counts.id, 8, 16, 0xabcd, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    CHECK_RC(ls_update(S, counts.id, 12, words, sizeof words, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    const uint32_t *got = counts.data;
    CHECK(got[1] == 0 && got[2] == 0xabcd && got[3] == 10 && got[6] == 13 && got[7] == 0);
    CHECK_RC(ls_fill(S, counts.id, counts.size - 4, 8, 1, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), -LS_ERANGE);
    CHECK_RC(ls_update(S, counts.id, counts.size - 8, words, sizeof words, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), -LS_ERANGE);
    uint8_t big[LS_MAX_PUSH + 4] = {0};
    CHECK_RC(ls_update(S, counts.id, 0, big, sizeof big, &ticket), -EINVAL);
}

TEST(a_list_writes_counts_then_dispatches_over_them)
{
    reset();
    struct ls_desc commands[4];
    uint32_t ones[2] = {1, 1}, xy[2] = {x.id, y.id};
    struct saxpy_push push = {N, 2.0f};
    CHECK_RC(ls_list_fill(&commands[0], counts.id, 32, 4, 5), 0);              /* x count 5, at byte 32 */
    CHECK_RC(ls_list_update(&commands[1], counts.id, 36, ones, sizeof ones), 0);
    CHECK_RC(ls_list_barrier(&commands[2]), 0);
    CHECK_RC(ls_list_dispatch_indirect(&commands[3], saxpy.id, counts.id, 32, 2, xy, NULL, &push, sizeof push), 0);
    uint32_t list;
    CHECK_RC(ls_load_list(S, commands, 4, &list), 0);
    uint64_t ticket;
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    CHECK(ran_over(5 * 64));
    CHECK_RC(ls_free_list(S, list), 0);
}

TEST(timestamps_around_a_dispatch_increase)
{
    reset();
    uint64_t *stamps = counts.data;     /* four 16-byte timestamps: stamp, availability */
    for (int k = 0; k < 8; k++)
        stamps[k] = UINT64_MAX;
    struct ls_desc commands[3];
    uint32_t xy[2] = {x.id, y.id};
    struct saxpy_push push = {N, 2.0f};
    CHECK_RC(ls_list_timestamp(&commands[0], counts.id, 0), 0);
    CHECK_RC(ls_list_dispatch(&commands[1], saxpy.id, N / 64, 1, 1, 2, xy, NULL, &push, sizeof push), 0);
    CHECK_RC(ls_list_timestamp(&commands[2], counts.id, 16), 0);
    uint32_t list;
    CHECK_RC(ls_load_list(S, commands, 3, &list), 0);
    uint64_t ticket;
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    CHECK_RC(ls_timestamp(S, counts.id, 32, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    CHECK(stamps[1] == 1 && stamps[3] == 1 && stamps[5] == 1 && stamps[7] == UINT64_MAX);
    CHECK(stamps[0] > 0 && stamps[0] < stamps[2] && stamps[2] < stamps[4] && stamps[4] != UINT64_MAX);
    CHECK(ran_over(N));
    CHECK_RC(ls_timestamp(S, counts.id, 4, &ticket), 0);      /* misaligned */
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), -LS_ERANGE);
    CHECK_RC(ls_timestamp(S, counts.id, counts.size - 8, &ticket), 0);   /* 16 bytes do not fit */
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), -LS_ERANGE);
    CHECK(stamps[7] == UINT64_MAX);
    CHECK_RC(ls_free_list(S, list), 0);
}

int main(int argc, char **argv)
{
    shader_dir = argc > 1 ? argv[1] : "shaders";
    char path[4096];
    snprintf(path, sizeof path, "%s/saxpy.spv", shader_dir);
    if (ls_connect(NULL, &S) || ls_load_program_file(S, path, &saxpy) ||
        ls_alloc(S, N * sizeof(float), LS_BUFFER_SHARED, &x) || ls_alloc(S, N * sizeof(float), LS_BUFFER_SHARED, &y) ||
        ls_alloc(S, 64, LS_BUFFER_SHARED, &counts)) {
        printf("setup failed: %s\n0 passed, 1 failed\n", ls_error_message());
        return 1;
    }
    static const struct test tests[] = {
        {"indirect_dispatch_runs_the_counts_it_reads", indirect_dispatch_runs_the_counts_it_reads},
        {"indirect_counts_past_the_limit_run_nothing", indirect_counts_past_the_limit_run_nothing},
        {"indirect_counts_outside_their_buffer_are_refused", indirect_counts_outside_their_buffer_are_refused},
        {"fill_and_update_write_their_range", fill_and_update_write_their_range},
        {"a_list_writes_counts_then_dispatches_over_them", a_list_writes_counts_then_dispatches_over_them},
        {"timestamps_around_a_dispatch_increase", timestamps_around_a_dispatch_increase},
    };
    int status = run_tests(tests, sizeof tests / sizeof tests[0]);
    ls_disconnect(S);
    return status;
}
