/*
 * A wait never outlives its arbiter: connect to the daemon, start a long
 * dispatch, say "ready", then wait without a timeout. The test harness kills
 * the daemon; the wait must come back with -LS_ELOST and later calls too.
 * With "poll" after the shader folder, the program polls the ticket instead of
 * waiting: ls_poll must report -LS_ELOST within 5 s of the kill (it used to say
 * "still running" for ever), and so must later calls.
 *
 *   LIBSHARE_MODE=daemon LIBSHARE_PIPE_DIRECTORY=DIR test_lost SHADER_DIR [poll]
 */
#include "runner.h"

#include <string.h>
#include <time.h>

static const char *shader_dir;
static int polling;

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

TEST(wait_returns_lost_when_the_daemon_dies)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/busy.spv", shader_dir);
    ls_session *s;
    struct ls_program busy;
    struct ls_buffer data;
    CHECK_RC(ls_connect(NULL, &s), 0);
    CHECK_RC(ls_load_program_file(s, path, &busy), 0);
    CHECK_RC(ls_alloc(s, 1 << 20, LS_BUFFER_SHARED, &data), 0);
    struct {
        uint32_t n, iterations;
    } push = {1 << 18, 1000000};
    uint64_t ticket;
    for (int i = 0; i < 8; i++)
        CHECK_RC(ls_dispatch(s, busy.id, (1 << 18) / 64, 1, 1, 1, &data.id, NULL, &push, sizeof push, &ticket), 0);
    printf("ready\n");
    fflush(stdout);
    if (polling) {
        /* The harness kills the daemon after "ready"; until then the ticket runs (0). Bounded
         * at 120 s so that a poll that never notices fails the test instead of hanging it. */
        double started = seconds_now();
        int rc;
        while ((rc = ls_poll(s, ticket)) == 0 && seconds_now() - started < 120) {
            struct timespec pace = {0, 1000000};
            nanosleep(&pace, NULL);
        }
        CHECK_RC(rc, -LS_ELOST);
        CHECK_RC(ls_poll(s, ticket), -LS_ELOST);
    } else {
        CHECK_RC(ls_wait(s, ticket, LS_FOREVER, NULL), -LS_ELOST);
    }
    CHECK(strstr(ls_error_message(), "arbiter") != NULL);
    CHECK_RC(ls_dispatch(s, busy.id, 1, 1, 1, 1, &data.id, NULL, &push, sizeof push, &ticket), -LS_ELOST);
    ls_disconnect(s);
}

int main(int argc, char **argv)
{
    shader_dir = argc > 1 ? argv[1] : "shaders";
    polling = argc > 2 && strcmp(argv[2], "poll") == 0;
    static const struct test tests[] = {{"wait_returns_lost_when_the_daemon_dies",
                                         wait_returns_lost_when_the_daemon_dies}};
    return run_tests(tests, 1);
}
