/*
 * Tests of ls_load_program_arrays() against a real arbiter (the embedded
 * default, or a daemon as test_api.c says).
 *
 *   test_arrays PICK_SPV
 *
 * PICK_SPV: tests/test_c_bindings.py compiles it from PICK of
 * tests/arbiter/test_runtime_arrays.py: a runtime-sized array of buffers b[] at
 * (set 0, binding 0), then P { uint n; } at binding 1; invocation i writes
 * i * 3 + 1 into b[i % n].x[i / n].
 */
#include "runner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SECOND 1000000000LL
#define N 60
#define MOST 5

static ls_session *S;
static char code[1 << 16];
static size_t code_size;

static int load(const struct ls_array_length *arrays, uint32_t count, struct ls_program *out)
{
    return ls_load_program_arrays(S, code, code_size, NULL, 0, arrays, count, out);
}

/* Run the program over n buffers; 0 when every buffer holds what PICK writes. */
static int run(const struct ls_program *p, uint32_t n)
{
    struct ls_buffer buffers[MOST + 1];
    uint32_t ids[MOST + 1];
    uint64_t offsets[MOST + 1] = {0}, ticket = 0;
    for (uint32_t k = 0; k <= n; k++) {
        if (ls_alloc(S, N * 4, LS_BUFFER_SHARED, &buffers[k]) < 0)
            return -1;
        ids[k] = buffers[k].id;
    }
    ((uint32_t *)buffers[n].data)[0] = n;
    int rc = ls_dispatch(S, p->id, N, 1, 1, n + 1, ids, offsets, NULL, 0, &ticket);
    if (rc == 0)
        rc = ls_wait(S, ticket, 30 * SECOND, NULL);
    for (uint32_t i = 0; rc == 0 && i < N; i++)
        if (((uint32_t *)buffers[i % n].data)[i / n] != i * 3 + 1)
            rc = 1;
    for (uint32_t k = 0; k <= n; k++)
        ls_free_buffer(S, buffers[k].id);
    return rc;
}

TEST(a_runtime_array_takes_the_length_given)
{
    for (uint32_t n = 3; n <= MOST; n += 2) {
        struct ls_array_length length = {.set = 0, .binding = 0, .length = n};
        struct ls_program p;
        CHECK_RC(load(&length, 1, &p), 0);
        CHECK(p.bindings == n + 1);
        CHECK_RC(run(&p, n), 0);
        CHECK_RC(ls_free_program(S, p.id), 0);
    }
}

TEST(refusals_name_the_binding)
{
    struct ls_program p;
    CHECK_RC(load(NULL, 0, &p), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "set 0, binding 0") != NULL);
    struct ls_array_length zero = {.set = 0, .binding = 0, .length = 0};
    CHECK_RC(load(&zero, 1, &p), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "length 0") != NULL);
    struct ls_array_length elsewhere[] = {{.set = 0, .binding = 0, .length = 3}, {.set = 2, .binding = 1, .length = 3}};
    CHECK_RC(load(elsewhere, 2, &p), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "set 2, binding 1") != NULL);
    struct ls_array_length too_many = {.set = 0, .binding = 0, .length = LS_MAX_BINDINGS};
    CHECK_RC(load(&too_many, 1, &p), -LS_EINVALID);  /* with P: one buffer past LS_MAX_BINDINGS */
    CHECK_RC(load(NULL, 1, &p), -EINVAL);
    struct ls_array_length twice[] = {{.set = 0, .binding = 0, .length = 3}, {.set = 0, .binding = 0, .length = 3}};
    CHECK_RC(load(twice, 2, &p), -EINVAL);
}

int main(int argc, char **argv)
{
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
    if (f == NULL) {
        printf("usage: test_arrays PICK_SPV\n0 passed, 1 failed\n");
        return 1;
    }
    code_size = fread(code, 1, sizeof code, f);
    fclose(f);
    struct ls_options options = {.name = "c-arrays"};
    if (ls_connect(&options, &S) < 0) {
        printf("cannot connect: %s\n0 passed, 1 failed\n", ls_error_message());
        return 1;
    }
    static const struct test tests[] = {
#define T(name) {#name, name}
        T(a_runtime_array_takes_the_length_given),
        T(refusals_name_the_binding),
    };
    int rc = run_tests(tests, sizeof tests / sizeof tests[0]);
    ls_disconnect(S);
    return rc;
}
