/*
 * Tests of ls_texel_view() against a real arbiter (the embedded default, or a daemon as
 * test_api.c says).
 *
 *   test_texel TEXEL_SPV
 *
 * TEXEL_SPV: tests/test_c_bindings.py compiles it: y[i] = uint(a[i] * 2) with a[] a uniform
 * texel buffer (samplerBuffer, read as r32f) and y[] a storage texel buffer (layout(r32ui)
 * uimageBuffer), 64 invocations a workgroup.
 */
#include "runner.h"

#include <errno.h>
#include <string.h>

#define SECOND 1000000000LL
#define N 256

static ls_session *S;
static char code[1 << 16];
static size_t code_size;

TEST(a_kernel_reads_and_writes_texel_views)
{
    struct ls_program p;
    struct ls_buffer a, y;
    CHECK_RC(ls_load_program(S, code, code_size, &p), 0);
    CHECK_RC(ls_alloc(S, N * 4, LS_BUFFER_SHARED, &a), 0);
    CHECK_RC(ls_alloc(S, N * 4, LS_BUFFER_SHARED, &y), 0);
    for (int i = 0; i < N; i++)
        ((float *)a.data)[i] = (float)i;
    uint32_t views[2];
    CHECK_RC(ls_texel_view(S, a.id, "r32f", 0, N * 4, &views[0]), 0);
    CHECK_RC(ls_texel_view(S, y.id, "r32ui", 0, 0, &views[1]), 0);  /* 0: to the buffer's end */
    uint64_t ticket = 0;
    CHECK_RC(ls_dispatch(S, p.id, N / 64, 1, 1, 2, views, NULL, NULL, 0, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), 0);
    for (int i = 0; i < N; i++)
        CHECK(((uint32_t *)y.data)[i] == 2u * (uint32_t)i);
    uint32_t buffers[2] = {a.id, y.id};     /* buffers at texel bindings: unknown ids there */
    CHECK_RC(ls_dispatch(S, p.id, N / 64, 1, 1, 2, buffers, NULL, NULL, 0, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), -LS_ENOBUFFER);
    CHECK_RC(ls_free_view(S, views[0]), 0);
    CHECK_RC(ls_free_view(S, views[0]), -LS_EINVALID);
    CHECK_RC(ls_free_buffer(S, y.id), 0);   /* and its view with it */
    CHECK_RC(ls_free_view(S, views[1]), -LS_EINVALID);
    CHECK_RC(ls_free_buffer(S, a.id), 0);
    CHECK_RC(ls_free_program(S, p.id), 0);
}

TEST(refusals_name_what_they_refuse)
{
    struct ls_buffer b;
    uint32_t view;
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &b), 0);
    CHECK_RC(ls_texel_view(S, b.id, "r32f", 4, 0, &view), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "multiple of") != NULL);
    CHECK_RC(ls_texel_view(S, b.id, "r32f", 0, 8192, &view), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "whole texels") != NULL);
    CHECK_RC(ls_texel_view(S, b.id, "rgb9e5", 0, 0, &view), -LS_EINVALID);
    CHECK(strstr(ls_error_message(), "format") != NULL);
    CHECK_RC(ls_texel_view(S, b.id + 1000, "r32f", 0, 0, &view), -LS_EINVALID);
    CHECK_RC(ls_texel_view(S, b.id, NULL, 0, 0, &view), -EINVAL);
    CHECK_RC(ls_texel_view(S, b.id, "r32f", 0, 0, NULL), -EINVAL);
    CHECK_RC(ls_free_buffer(S, b.id), 0);
}

int main(int argc, char **argv)
{
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
    if (f == NULL) {
        printf("usage: test_texel TEXEL_SPV\n0 passed, 1 failed\n");
        return 1;
    }
    code_size = fread(code, 1, sizeof code, f);
    fclose(f);
    struct ls_options options = {.name = "c-texel"};
    if (ls_connect(&options, &S) < 0) {
        printf("cannot connect: %s\n0 passed, 1 failed\n", ls_error_message());
        return 1;
    }
    static const struct test tests[] = {
#define T(name) {#name, name}
        T(a_kernel_reads_and_writes_texel_views),
        T(refusals_name_what_they_refuse),
    };
    int rc = run_tests(tests, sizeof tests / sizeof tests[0]);
    ls_disconnect(S);
    return rc;
}
