/*
 * Tests of ls_load_program_constants() against a real arbiter (the embedded
 * default, or a daemon as test_api.c says).
 *
 *   test_constants SPECIALIZED_SPV
 *
 * SPECIALIZED_SPV: tests/test_c_bindings.py compiles it from the kernel of
 * tests/arbiter/test_specialization.py: out[i] = SCALE * (i % BLOCK) + local_size_x,
 * with local_size_x_id = 0, BLOCK (id 1, uint) sizing a shared array, SCALE (id 2, float).
 */
#include "runner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SECOND 1000000000LL

static ls_session *S;
static char code[1 << 16];
static size_t code_size;

static int load(const struct ls_constant *constants, uint32_t count, struct ls_program *out)
{
    return ls_load_program_constants(S, code, code_size, constants, count, out);
}

static int run(const struct ls_program *p, uint32_t groups, float *second)
{
    struct ls_buffer out;
    if (ls_alloc(S, 4096, LS_BUFFER_SHARED, &out) < 0)
        return -1;
    uint64_t offset = 0, ticket = 0;
    int rc = ls_dispatch(S, p->id, groups, 1, 1, 1, &out.id, &offset, NULL, 0, &ticket);
    if (rc == 0)
        rc = ls_wait(S, ticket, 30 * SECOND, NULL);
    if (rc == 0)
        *second = ((float *)out.data)[1];
    ls_free_buffer(S, out.id);
    return rc;
}

TEST(constants_set_the_workgroup_and_the_values)
{
    struct ls_constant constants[] = {
        {.id = 0, .type = LS_CONSTANT_UINT, .value.u = 32},
        {.id = 1, .type = LS_CONSTANT_UINT, .value.u = 8},
        {.id = 2, .type = LS_CONSTANT_FLOAT, .value.f = 3.0},
    };
    struct ls_program p;
    CHECK_RC(load(constants, 3, &p), 0);
    CHECK(p.local_size[0] == 32 && p.local_size[1] == 1 && p.local_size[2] == 1);
    float second = 0;
    CHECK_RC(run(&p, 1, &second), 0);
    CHECK(second == 3.0f * 1 + 32);     /* out[1] = SCALE * (1 % BLOCK) + local_size_x */
    CHECK_RC(ls_free_program(S, p.id), 0);
}

TEST(no_constants_is_the_defaults)
{
    struct ls_program p;
    CHECK_RC(load(NULL, 0, &p), 0);
    CHECK(p.local_size[0] == 64);
    float second = 0;
    CHECK_RC(run(&p, 1, &second), 0);
    CHECK(second == 1.0f * 1 + 64);
    CHECK_RC(ls_free_program(S, p.id), 0);
}

TEST(refusals_name_the_constant)
{
    struct ls_program p;
    struct ls_constant unknown = {.id = 9, .type = LS_CONSTANT_UINT, .value.u = 1};
    CHECK_RC(load(&unknown, 1, &p), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "constant 9") != NULL);
    struct ls_constant too_wide = {.id = 0, .type = LS_CONSTANT_UINT, .value.u = 1u << 20};
    CHECK_RC(load(&too_wide, 1, &p), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "workgroup") != NULL);
    struct ls_constant wrong_type = {.id = 1, .type = LS_CONSTANT_FLOAT, .value.f = 1.5};
    CHECK_RC(load(&wrong_type, 1, &p), -LS_EINVALID);
    struct ls_constant bad_type = {.id = 1, .type = 99, .value.u = 1};
    CHECK_RC(load(&bad_type, 1, &p), -EINVAL);
    CHECK_RC(load(NULL, 1, &p), -EINVAL);
    struct ls_constant twice[] = {{.id = 1, .type = LS_CONSTANT_UINT, .value.u = 4},
                                  {.id = 1, .type = LS_CONSTANT_UINT, .value.u = 8}};
    CHECK_RC(load(twice, 2, &p), -EINVAL);
}

int main(int argc, char **argv)
{
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
    if (f == NULL) {
        printf("usage: test_constants SPECIALIZED_SPV\n0 passed, 1 failed\n");
        return 1;
    }
    code_size = fread(code, 1, sizeof code, f);
    fclose(f);
    struct ls_options options = {.name = "c-constants"};
    if (ls_connect(&options, &S) < 0) {
        printf("cannot connect: %s\n0 passed, 1 failed\n", ls_error_message());
        return 1;
    }
    static const struct test tests[] = {
#define T(name) {#name, name}
        T(constants_set_the_workgroup_and_the_values),
        T(no_constants_is_the_defaults),
        T(refusals_name_the_constant),
    };
    int rc = run_tests(tests, sizeof tests / sizeof tests[0]);
    ls_disconnect(S);
    return rc;
}
