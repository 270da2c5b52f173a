/*
 * A refusal comes back from C with its own code, never -LS_EPYTHON: connect
 * (LIBSHARE_MODE and LIBSHARE_PIPE_DIRECTORY from the environment) to an
 * arbiter that refuses, and check the code named on the command line. The
 * harness arranges the refusal: a daemon in FAULT (LS_ENOTREADY), a caller
 * of another uid (LS_EDENIED).
 *
 *   LIBSHARE_MODE=daemon LIBSHARE_PIPE_DIRECTORY=DIR test_refused LS_ENOTREADY|LS_EDENIED
 */
#include "runner.h"

#include <string.h>

static int expected;

TEST(connect_is_refused_with_its_own_code)
{
    ls_session *s = NULL;
    int rc = ls_connect(NULL, &s);
    printf("  ls_connect: %d (%s): %s\n", rc, ls_strerror(rc), ls_error_message());
    CHECK(s == NULL);
    CHECK_RC(rc, expected);
    CHECK(strcmp(ls_strerror(rc), ls_strerror(-LS_EPYTHON)) != 0);
    CHECK(strlen(ls_error_message()) > 0);
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "";
    expected = strcmp(name, "LS_ENOTREADY") == 0 ? -LS_ENOTREADY
             : strcmp(name, "LS_EDENIED") == 0   ? -LS_EDENIED
                                                 : 1;
    if (expected == 1) {
        fprintf(stderr, "usage: test_refused LS_ENOTREADY|LS_EDENIED\n");
        return 2;
    }
    static const struct test tests[] = {{"connect_is_refused_with_its_own_code", connect_is_refused_with_its_own_code}};
    return run_tests(tests, 1);
}
