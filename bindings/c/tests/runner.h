/*
 * A tiny test runner: TEST(name) defines a test, CHECK(cond) fails it (and
 * returns) with the file, line and libshare's last error message. run_tests()
 * prints one line per test and closes with "N passed, N failed", which
 * tests/test_c_bindings.py reads; the exit status is 1 when any test failed.
 */
#ifndef LIBSHARE_TEST_RUNNER_H
#define LIBSHARE_TEST_RUNNER_H

#include <libshare.h>

#include <stdio.h>

struct test {
    const char *name;
    void (*run)(void);
};

static int test_failed;

#define TEST(name) static void name(void)
#define CHECK(cond)                                                                                 \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            printf("  %s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond,        \
                   ls_error_message());                                                             \
            test_failed = 1;                                                                        \
            return;                                                                                 \
        }                                                                                           \
    } while (0)
#define CHECK_RC(call, expected) CHECK((call) == (expected))

static int run_tests(const struct test *tests, int count)
{
    int passed = 0, failed = 0;
    for (int i = 0; i < count; i++) {
        test_failed = 0;
        tests[i].run();
        printf("%s %s\n", test_failed ? "FAIL" : "ok  ", tests[i].name);
        fflush(stdout);
        if (test_failed)
            failed++;
        else
            passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif
