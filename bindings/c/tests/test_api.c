/*
 * Tests of the C API against a real arbiter: the embedded default, or a daemon
 * when LIBSHARE_MODE=daemon and LIBSHARE_PIPE_DIRECTORY point at one.
 *
 *   test_api SHADER_DIR
 *
 * Most tests share one session (S); the connect tests open their own.
 */
#define _GNU_SOURCE
#include "runner.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SECOND 1000000000LL

static ls_session *S;
static const char *shader_dir;
static struct ls_program saxpy, busy;

struct saxpy_push {
    uint32_t n;
    float a;
};

struct busy_push {
    uint32_t n;
    uint32_t iterations;
};

static const char *shader(const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s.spv", shader_dir, name);
    return path;
}

static int expect_daemon(void)
{
    const char *mode = getenv("LIBSHARE_MODE");
    return mode && strcmp(mode, "daemon") == 0;
}

/* busy.comp's value for element i, as the shader computes it. */
static uint32_t busy_value(uint32_t i, uint32_t iterations)
{
    uint32_t x = i;
    for (uint32_t k = 0; k < iterations; k++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x = x * 1664525u + 1013904223u;
    }
    return x;
}

/* Rounds of a long busy dispatch: `iterations` on lavapipe, which the test was sized on, times
 * LIBSHARE_TEST_BUSY_SCALE on a GPU (tests/_busy.py measures it), at most UINT32_MAX. */
static uint32_t busy_iterations(uint32_t iterations)
{
    const char *text = getenv("LIBSHARE_TEST_BUSY_SCALE");
    unsigned long long scale = text ? strtoull(text, NULL, 10) : 1;
    unsigned long long rounds = (unsigned long long)iterations * (scale ? scale : 1);
    return rounds > UINT32_MAX ? UINT32_MAX : (uint32_t)rounds;
}

/* ------------------------------------------------------------------ connect */

TEST(connect_reports_its_mode_and_device)
{
    struct ls_session_info info;
    CHECK_RC(ls_session_info(S, &info), 0);
    CHECK(info.client_id > 0);
    CHECK(info.embedded == !expect_daemon());
    CHECK(strlen(info.device) > 0);
}

TEST(connect_with_every_option)
{
    struct ls_options options = {.name = "c-options", .priority = "high", .timeout_ns = 5 * SECOND};
    ls_session *s = NULL;
    CHECK_RC(ls_connect(&options, &s), 0);
    struct ls_session_info info;
    CHECK_RC(ls_session_info(s, &info), 0);
    CHECK(info.embedded == !expect_daemon());
    ls_disconnect(s);
}

TEST(connect_refuses_a_bad_priority)
{
    struct ls_options options = {.priority = "urgent"};
    ls_session *s = NULL;
    CHECK_RC(ls_connect(&options, &s), -LS_EINVALID);
    CHECK(s == NULL);
    CHECK(strstr(ls_error_message(), "priority") != NULL);
}

TEST(connect_refuses_a_bad_mode)
{
    struct ls_options options = {.mode = "sideways"};
    ls_session *s = NULL;
    CHECK_RC(ls_connect(&options, &s), -EINVAL);
    CHECK(strstr(ls_error_message(), "mode") != NULL);
}

TEST(daemon_mode_without_a_daemon_is_unavailable)
{
    char directory[] = "/tmp/libshare-c-test-XXXXXX";
    CHECK(mkdtemp(directory) != NULL);
    struct ls_options options = {.mode = "daemon", .pipe_directory = directory};
    ls_session *s = NULL;
    int rc = ls_connect(&options, &s);
    rmdir(directory);
    CHECK_RC(rc, -LS_EUNAVAILABLE);
    CHECK(strstr(ls_error_message(), directory) != NULL);
}

TEST(connect_checks_its_arguments)
{
    CHECK_RC(ls_connect(NULL, NULL), -EINVAL);
    ls_disconnect(NULL);                /* a no-op */
}

/* ------------------------------------------------------------------ programs and buffers */

TEST(load_program_reflects_the_interface)
{
    CHECK(saxpy.id > 0);
    CHECK(saxpy.bindings == 2);
    CHECK(saxpy.push_size == 8);
    CHECK(saxpy.local_size[0] == 64 && saxpy.local_size[1] == 1 && saxpy.local_size[2] == 1);
}

TEST(load_program_from_memory)
{
    FILE *f = fopen(shader("vadd"), "rb");
    CHECK(f != NULL);
    static char code[1 << 16];
    size_t n = fread(code, 1, sizeof code, f);
    fclose(f);
    struct ls_program vadd;
    CHECK_RC(ls_load_program(S, code, n, &vadd), 0);
    CHECK(vadd.bindings == 3);
    CHECK_RC(ls_free_program(S, vadd.id), 0);
}

TEST(load_program_refuses_garbage_and_missing_files)
{
    struct ls_program p;
    uint32_t garbage[16] = {0xdeadbeef};
    CHECK_RC(ls_load_program(S, garbage, sizeof garbage, &p), -LS_EINVALID);
    CHECK_RC(ls_load_program_file(S, "/nonexistent/x.spv", &p), -ENOENT);
    CHECK_RC(ls_load_program(S, NULL, 4, &p), -EINVAL);
}

TEST(alloc_maps_shared_buffers_only)
{
    struct ls_buffer shared, device;
    CHECK_RC(ls_alloc(S, 100, LS_BUFFER_SHARED, &shared), 0);
    CHECK(shared.data != NULL && shared.size >= 100 && shared.kind == LS_BUFFER_SHARED);
    memset(shared.data, 0xab, shared.size);
    CHECK_RC(ls_alloc(S, 100, LS_BUFFER_DEVICE, &device), 0);
    CHECK(device.data == NULL && device.id != shared.id);
    CHECK_RC(ls_free_buffer(S, shared.id), 0);
    CHECK_RC(ls_free_buffer(S, device.id), 0);
}

TEST(alloc_and_free_refuse_bad_requests)
{
    struct ls_buffer b;
    CHECK_RC(ls_alloc(S, 64, 7, &b), -EINVAL);
    CHECK_RC(ls_alloc(S, 0, LS_BUFFER_SHARED, &b), -LS_EINVALID);
    CHECK_RC(ls_free_buffer(S, 999999), -LS_EINVALID);
    CHECK_RC(ls_alloc(S, 64, LS_BUFFER_SHARED, &b), 0);
    CHECK_RC(ls_free_buffer(S, b.id), 0);
    CHECK_RC(ls_free_buffer(S, b.id), -LS_EINVALID);
}

/* ------------------------------------------------------------------ dispatch and wait */

TEST(dispatch_computes_saxpy)
{
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &y), 0);
    float *xs = x.data, *ys = y.data;
    for (int i = 0; i < 1024; i++) {
        xs[i] = (float)i;
        ys[i] = 2.0f;
    }
    struct saxpy_push push = {1024, 3.0f};
    uint32_t ids[2] = {x.id, y.id};
    uint64_t ticket = 0, device_ns = 0;
    CHECK_RC(ls_dispatch(S, saxpy.id, 16, 1, 1, 2, ids, NULL, &push, sizeof push, &ticket), 0);
    CHECK(ticket > 0);
    CHECK_RC(ls_wait(S, ticket, 10 * SECOND, &device_ns), 0);
    for (int i = 0; i < 1024; i++)
        CHECK(ys[i] == 3.0f * (float)i + 2.0f);
    CHECK_RC(ls_wait(S, ticket, 0, NULL), 0);   /* a second wait finds it done */
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

TEST(bind_group_binds_offsets_and_ranges)
{
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &y), 0);
    float *xs = x.data, *ys = y.data;
    for (int i = 0; i < 1024; i++) {
        xs[i] = (float)i;
        ys[i] = 1.0f;
    }
    /* x from float 256, 128 of them (the rest reads zeros); y from float 64 to its end */
    struct ls_binding bindings[2] = {{x.id, 0, 256 * sizeof(float), 128 * sizeof(float)}, {y.id, 0, 64 * sizeof(float), 0}};
    uint32_t group = 0;
    CHECK_RC(ls_bind_group(S, saxpy.id, bindings, 0, &group), -EINVAL);
    CHECK_RC(ls_bind_group(S, saxpy.id, bindings, 2, &group), 0);
    struct saxpy_push push = {1024, 2.0f};
    uint64_t ticket = 0;
    CHECK_RC(ls_dispatch_group(S, saxpy.id, 16, 1, 1, group, &push, sizeof push, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), 0);
    for (int i = 0; i < 1024; i++)
        CHECK(ys[i] == (i >= 64 && i < 64 + 128 ? 1.0f + 2.0f * (float)(i - 64 + 256) : 1.0f));
    static struct ls_desc commands[1];
    CHECK_RC(ls_list_dispatch_group(&commands[0], saxpy.id, 16, 1, 1, group, &push, sizeof push), 0);
    uint32_t list = 0;
    CHECK_RC(ls_load_list(S, commands, 1, &list), 0);
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), 0);
    CHECK(ys[64] == 1.0f + 4.0f * 256.0f && ys[63] == 1.0f);
    struct ls_binding past[2] = {{x.id, 0, 0, 1024 * sizeof(float) + 4}, {y.id, 0, 0, 0}};
    CHECK_RC(ls_bind_group(S, saxpy.id, past, 2, &group), -LS_EINVALID);  /* a range past the buffer */
    CHECK_RC(ls_free_group(S, group), 0);
    CHECK_RC(ls_dispatch_group(S, saxpy.id, 16, 1, 1, group, &push, sizeof push, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), -LS_ENOBUFFER);  /* a freed group */
    CHECK_RC(ls_free_group(S, group), -LS_EINVALID);
    CHECK_RC(ls_free_list(S, list), 0);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

TEST(command_list_runs_in_order_under_one_ticket)
{
    struct ls_buffer x, y, z;
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &y), 0);
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &z), 0);
    float *xs = x.data, *ys = y.data, *zs = z.data;
    for (int i = 0; i < 1024; i++) {
        xs[i] = (float)i;
        ys[i] = 1.0f;
    }
    static struct ls_desc commands[3];
    struct saxpy_push push = {1024, 2.0f};
    uint32_t xy[2] = {x.id, y.id}, zx[2] = {z.id, x.id};
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 2, xy, NULL, &push, sizeof push), 0);  /* y = 2x + 1 */
    CHECK_RC(ls_list_copy(&commands[1], y.id, 0, z.id, 0, 1024 * sizeof(float)), 0);                 /* z = y */
    CHECK_RC(ls_list_dispatch(&commands[2], saxpy.id, 16, 1, 1, 2, zx, NULL, &push, sizeof push), 0);  /* x = 2z + x */
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 9, xy, NULL, NULL, 0), -EINVAL);       /* 9 buffers */
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 2, xy, NULL, &push, sizeof push), 0);
    uint32_t list = 0;
    CHECK_RC(ls_load_list(S, commands, 0, &list), -EINVAL);
    CHECK_RC(ls_load_list(S, commands, 3, &list), 0);
    uint64_t ticket = 0, device_ns = 0;
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, &device_ns), 0);
    for (int i = 0; i < 1024; i++)
        CHECK(ys[i] == 2.0f * (float)i + 1.0f && zs[i] == ys[i] && xs[i] == 2.0f * zs[i] + (float)i);
    CHECK_RC(ls_free_list(S, list), 0);
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), -LS_ENOPROGRAM);  /* a freed list: refused */
    uint32_t bad[2] = {x.id, 999999};
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 2, bad, NULL, &push, sizeof push), 0);
    CHECK_RC(ls_load_list(S, commands, 1, &list), -LS_EINVALID);  /* not its buffer: refused at registration */
    CHECK_RC(ls_free_list(S, 424242), -LS_EINVALID);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
    CHECK_RC(ls_free_buffer(S, z.id), 0);
}

TEST(command_list_takes_buffers_and_push_constants_per_submission)
{
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 1024 * sizeof(float), LS_BUFFER_SHARED, &y), 0);
    float *xs = x.data, *ys = y.data;
    for (int i = 0; i < 1024; i++)
        xs[i] = (float)i, ys[i] = 1.0f;
    static struct ls_desc commands[1];
    uint32_t slots[2] = {LS_LIST_ARG | 0, LS_LIST_ARG | 1};
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 2, slots, NULL, NULL, 0), 0);
    CHECK_RC(ls_list_submission_push(&commands[0]), 0);            /* slot 1 += a * slot 0, a per submission */
    uint32_t list = 0;
    CHECK_RC(ls_load_list(S, commands, 1, &list), 0);
    struct saxpy_push push = {1024, 2.0f};
    uint32_t xy[2] = {x.id, y.id}, yx[2] = {y.id, x.id};
    uint64_t ticket = 0;
    CHECK_RC(ls_submit_list_with(S, list, 2, xy, NULL, &push, sizeof push, &ticket), 0);  /* y = 2x + 1 */
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), 0);
    push.a = 3.0f;
    CHECK_RC(ls_submit_list_with(S, list, 2, yx, NULL, &push, sizeof push, &ticket), 0);  /* x = 3y + x */
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), 0);
    for (int i = 0; i < 1024; i++)
        CHECK(ys[i] == 2.0f * (float)i + 1.0f && xs[i] == 3.0f * ys[i] + (float)i);
    CHECK_RC(ls_submit_list(S, list, &ticket), 0);                /* no parameters: too few */
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), -LS_EBINDINGS);
    uint8_t wide[16] = {0};
    CHECK_RC(ls_submit_list_with(S, list, 2, xy, NULL, wide, sizeof wide, &ticket), 0);  /* past saxpy's 8 */
    CHECK_RC(ls_wait(S, ticket, 30 * SECOND, NULL), -LS_EPUSH);
    CHECK_RC(ls_list_dispatch(&commands[0], saxpy.id, 16, 1, 1, 2, slots, NULL, &push, sizeof push), 0);
    CHECK_RC(ls_list_submission_push(&commands[0]), -EINVAL);    /* push bytes of its own */
    CHECK_RC(ls_free_list(S, list), 0);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

TEST(dispatch_binds_from_offsets)
{
    struct ls_buffer b;
    CHECK_RC(ls_alloc(S, 8192, LS_BUFFER_SHARED, &b), 0);
    float *f = b.data;
    for (int i = 0; i < 2048; i++)
        f[i] = 1.0f;
    struct saxpy_push push = {64, 1.0f};
    uint32_t ids[2] = {b.id, b.id};
    uint64_t offsets[2] = {0, 4096}, ticket;
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, offsets, &push, sizeof push, &ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 10 * SECOND, NULL), 0);
    CHECK(f[1024] == 2.0f && f[1024 + 63] == 2.0f && f[1024 + 64] == 1.0f && f[0] == 1.0f);
    CHECK_RC(ls_free_buffer(S, b.id), 0);
}

TEST(rejected_tickets_carry_the_arbiters_status)
{
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &y), 0);
    struct saxpy_push push = {64, 1.0f};
    uint32_t ids[2] = {x.id, y.id}, bad[2] = {x.id, 424242};
    uint64_t t1, t2, t3, t4;
    CHECK_RC(ls_dispatch(S, 424242, 1, 1, 1, 2, ids, NULL, &push, sizeof push, &t1), 0);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, bad, NULL, &push, sizeof push, &t2), 0);
    CHECK_RC(ls_dispatch(S, saxpy.id, 0, 1, 1, 2, ids, NULL, &push, sizeof push, &t3), 0);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 1, ids, NULL, &push, sizeof push, &t4), 0);
    CHECK_RC(ls_wait(S, t1, 10 * SECOND, NULL), -LS_ENOPROGRAM);
    CHECK(strstr(ls_error_message(), "program") != NULL);
    CHECK_RC(ls_wait(S, t2, 10 * SECOND, NULL), -LS_ENOBUFFER);
    CHECK_RC(ls_wait(S, t3, 10 * SECOND, NULL), -LS_EGROUPS);
    CHECK_RC(ls_wait(S, t4, 10 * SECOND, NULL), -LS_EBINDINGS);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

TEST(dispatch_checks_its_arguments)
{
    uint32_t ids[9] = {0};
    uint64_t ticket;
    char push[129] = {0};
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 9, ids, NULL, NULL, 0, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 0, NULL, NULL, push, 129, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 0, NULL, NULL, NULL, 0, NULL), -EINVAL);
    CHECK_RC(ls_dispatch(NULL, saxpy.id, 1, 1, 1, 0, NULL, NULL, NULL, 0, &ticket), -EINVAL);
}

/* The worst value of each field the encoder takes, and NULL arrays: refused before a ticket is
 * issued, so the refusals spend no ticket number and leave no record for ls_wait_idle. */
TEST(refused_operations_issue_no_ticket)
{
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &y), 0);
    struct saxpy_push push = {64, 1.0f};
    uint32_t ids[9] = {x.id, y.id};
    uint64_t offsets[9] = {0}, first = 0, last = 0, ticket = 0;
    char big[129] = {0};
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, NULL, &push, sizeof push, &first), 0);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 9, ids, offsets, &push, sizeof push, &ticket), -EINVAL);
    CHECK(strstr(ls_error_message(), "ls_dispatch") != NULL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, NULL, big, sizeof big, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, NULL, NULL, &push, sizeof push, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, NULL, NULL, sizeof push, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, UINT32_MAX, ids, NULL, NULL, 0, &ticket), -EINVAL);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 0, NULL, NULL, big, UINT32_MAX, &ticket), -EINVAL);
    CHECK_RC(ls_copy(S, x.id, 0, y.id, 0, 64, NULL), -EINVAL);
    CHECK(ticket == 0);
    CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, NULL, &push, sizeof push, &last), 0);
    CHECK(last == first + 1);
    CHECK_RC(ls_wait_idle(S, 30 * SECOND), 0);
    CHECK_RC(ls_wait(S, first, 0, NULL), 0);
    CHECK_RC(ls_wait(S, last, 0, NULL), 0);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

TEST(wait_refuses_tickets_never_issued)
{
    CHECK_RC(ls_wait(S, 0, 0, NULL), -EINVAL);
    CHECK_RC(ls_wait(S, 1ull << 60, 0, NULL), -EINVAL);
    CHECK_RC(ls_poll(S, 1ull << 60), -EINVAL);
}

TEST(wait_times_out_and_poll_does_not_block)
{
    struct ls_buffer data;
    uint32_t n = 1024, iterations = busy_iterations(200000);
    CHECK_RC(ls_alloc(S, n * sizeof(uint32_t), LS_BUFFER_SHARED, &data), 0);
    struct busy_push push = {n, iterations};
    uint64_t ticket;
    CHECK_RC(ls_dispatch(S, busy.id, n / 64, 1, 1, 1, &data.id, NULL, &push, sizeof push, &ticket), 0);
    CHECK_RC(ls_poll(S, ticket), 0);
    CHECK_RC(ls_wait(S, ticket, 1000000, NULL), -LS_ETIMEOUT);
    CHECK_RC(ls_wait(S, ticket, LS_FOREVER, NULL), 0);
    CHECK_RC(ls_poll(S, ticket), 1);
    uint32_t *values = data.data;
    CHECK(values[0] == busy_value(0, iterations));
    CHECK(values[n - 1] == busy_value(n - 1, iterations));
    CHECK_RC(ls_free_buffer(S, data.id), 0);
}

TEST(copies_go_through_device_buffers)
{
    struct ls_buffer src, dev, dst;
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &src), 0);
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_DEVICE, &dev), 0);
    CHECK_RC(ls_alloc(S, 4096, LS_BUFFER_SHARED, &dst), 0);
    for (int i = 0; i < 1024; i++)
        ((uint32_t *)src.data)[i] = (uint32_t)i * 7u;
    memset(dst.data, 0, 4096);
    uint64_t in, out;
    CHECK_RC(ls_copy(S, src.id, 0, dev.id, 0, 4096, &in), 0);
    CHECK_RC(ls_copy(S, dev.id, 1024, dst.id, 0, 1024, &out), 0);
    CHECK_RC(ls_wait_idle(S, 10 * SECOND), 0);
    CHECK_RC(ls_wait(S, in, 0, NULL), 0);
    CHECK_RC(ls_wait(S, out, 0, NULL), 0);
    for (int i = 0; i < 256; i++)
        CHECK(((uint32_t *)dst.data)[i] == (uint32_t)(i + 256) * 7u);
    CHECK(((uint32_t *)dst.data)[256] == 0);
    CHECK_RC(ls_copy(S, src.id, 0, dst.id, 0, 1 << 20, &out), 0);
    CHECK_RC(ls_wait(S, out, 10 * SECOND, NULL), -LS_ERANGE);
    CHECK_RC(ls_free_buffer(S, src.id), 0);
    CHECK_RC(ls_free_buffer(S, dev.id), 0);
    CHECK_RC(ls_free_buffer(S, dst.id), 0);
}

TEST(thousands_pipelined_past_a_full_lane)
{
    enum { COUNT = 3000 };
    static uint64_t tickets[COUNT];
    struct ls_buffer x, y;
    CHECK_RC(ls_alloc(S, 256, LS_BUFFER_SHARED, &x), 0);
    CHECK_RC(ls_alloc(S, 256, LS_BUFFER_SHARED, &y), 0);
    float *ys = y.data;
    ((float *)x.data)[0] = 1.0f;
    ys[0] = 0.0f;
    struct saxpy_push push = {1, 1.0f};
    uint32_t ids[2] = {x.id, y.id};
    for (int i = 0; i < COUNT; i++)
        CHECK_RC(ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, NULL, &push, sizeof push, &tickets[i]), 0);
    for (int i = COUNT - 1; i >= 0; i--)
        CHECK_RC(ls_wait(S, tickets[i], 60 * SECOND, NULL), 0);
    CHECK(ys[0] == (float)COUNT);
    CHECK_RC(ls_free_buffer(S, x.id), 0);
    CHECK_RC(ls_free_buffer(S, y.id), 0);
}

struct worker {
    struct ls_buffer y;
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct saxpy_push push = {1, 1.0f};
    uint32_t ids[2] = {w->y.id, w->y.id};
    for (int i = 0; i < 200; i++) {
        uint64_t ticket;
        if (ls_dispatch(S, saxpy.id, 1, 1, 1, 2, ids, (uint64_t[]){256, 0}, &push, sizeof push, &ticket) ||
            ls_wait(S, ticket, 30 * SECOND, NULL))
            w->failures++;
    }
    return NULL;
}

TEST(threads_share_a_session)
{
    enum { THREADS = 4 };
    struct worker workers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i].failures = 0;
        CHECK_RC(ls_alloc(S, 512, LS_BUFFER_SHARED, &workers[i].y), 0);
        ((float *)workers[i].y.data)[0] = 0.0f;
        ((float *)workers[i].y.data)[64] = 1.0f;   /* x, bound 256 bytes in */
    }
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, worker_main, &workers[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        CHECK(workers[i].failures == 0);
        CHECK(((float *)workers[i].y.data)[0] == 200.0f);
        CHECK_RC(ls_free_buffer(S, workers[i].y.id), 0);
    }
}

TEST(stats_count_this_sessions_work)
{
    struct ls_stats stats;
    CHECK_RC(ls_stats(S, &stats), 0);
    CHECK(stats.submitted >= 3000);
    CHECK(stats.completed + stats.errors == stats.submitted);
    CHECK(stats.errors >= 5);
}

TEST(error_texts)
{
    CHECK(strcmp(ls_strerror(0), "success") == 0);
    CHECK(strstr(ls_strerror(-LS_ETIMEOUT), "timed out") != NULL);
    CHECK(strstr(ls_strerror(-LS_ENOPROGRAM), "program") != NULL);
    CHECK(strlen(ls_strerror(-ENOENT)) > 0);
}

int main(int argc, char **argv)
{
    shader_dir = argc > 1 ? argv[1] : "shaders";
    struct ls_options options = {.name = "c-tests"};
    if (ls_connect(&options, &S) < 0 || ls_load_program_file(S, shader("saxpy"), &saxpy) < 0 ||
        ls_load_program_file(S, shader("busy"), &busy) < 0) {
        printf("cannot set up: %s\n0 passed, 1 failed\n", ls_error_message());
        return 1;
    }
    static const struct test tests[] = {
#define T(name) {#name, name}
        T(connect_reports_its_mode_and_device),
        T(connect_with_every_option),
        T(connect_refuses_a_bad_priority),
        T(connect_refuses_a_bad_mode),
        T(daemon_mode_without_a_daemon_is_unavailable),
        T(connect_checks_its_arguments),
        T(load_program_reflects_the_interface),
        T(load_program_from_memory),
        T(load_program_refuses_garbage_and_missing_files),
        T(alloc_maps_shared_buffers_only),
        T(alloc_and_free_refuse_bad_requests),
        T(dispatch_computes_saxpy),
        T(command_list_runs_in_order_under_one_ticket),
        T(command_list_takes_buffers_and_push_constants_per_submission),
        T(bind_group_binds_offsets_and_ranges),
        T(dispatch_binds_from_offsets),
        T(rejected_tickets_carry_the_arbiters_status),
        T(dispatch_checks_its_arguments),
        T(refused_operations_issue_no_ticket),
        T(wait_refuses_tickets_never_issued),
        T(wait_times_out_and_poll_does_not_block),
        T(copies_go_through_device_buffers),
        T(thousands_pipelined_past_a_full_lane),
        T(threads_share_a_session),
        T(stats_count_this_sessions_work),
        T(error_texts),
#undef T
    };
    int failed = run_tests(tests, (int)(sizeof tests / sizeof tests[0]));
    ls_disconnect(S);
    return failed;
}
