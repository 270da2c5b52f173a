/*
 * One client: y = a * x + y on 4096 floats in zero-copy shared buffers,
 * dispatched 10 times, checked against the same sum computed here.
 *
 *   python bindings/c/build.py
 *   cc bindings/c/examples/saxpy.c $(pkg-config --cflags --libs bindings/c/build/libshare.pc) -o saxpy
 *   ./saxpy shaders/saxpy.spv
 *
 * Uses the daemon at LIBSHARE_PIPE_DIRECTORY when one runs, else an arbiter
 * embedded in this process.
 */
#include <libshare.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define N 4096
#define ROUNDS 10

struct push {
    uint32_t n;
    float a;
};

static int check(int rc, const char *what)
{
    if (rc < 0)
        fprintf(stderr, "%s: %s (%s)\n", what, ls_strerror(rc), ls_error_message());
    return rc < 0;
}

static int run(ls_session *s, const char *spirv)
{
    struct ls_program saxpy;
    struct ls_buffer x, y;
    if (check(ls_load_program_file(s, spirv, &saxpy), "load") ||
        check(ls_alloc(s, N * sizeof(float), LS_BUFFER_SHARED, &x), "alloc x") ||
        check(ls_alloc(s, N * sizeof(float), LS_BUFFER_SHARED, &y), "alloc y"))
        return 1;
    float *xs = x.data, *ys = y.data;
    for (int i = 0; i < N; i++) {
        xs[i] = (float)i;
        ys[i] = 1.0f;
    }
    struct push push = {N, 0.5f};
    uint32_t buffers[2] = {x.id, y.id};
    uint64_t ticket = 0;
    for (int round = 0; round < ROUNDS; round++)
        if (check(ls_dispatch(s, saxpy.id, N / 64, 1, 1, 2, buffers, NULL, &push, sizeof push, &ticket),
                  "dispatch"))
            return 1;
    if (check(ls_wait(s, ticket, 10 * 1000000000LL, NULL), "wait") || check(ls_wait_idle(s, LS_FOREVER), "idle"))
        return 1;
    for (int i = 0; i < N; i++) {
        float expected = 1.0f + ROUNDS * 0.5f * (float)i;
        if (fabsf(ys[i] - expected) > 1e-3f * fabsf(expected)) {
            fprintf(stderr, "y[%d] = %g, expected %g\n", i, ys[i], expected);
            return 1;
        }
    }
    struct ls_session_info info;
    ls_session_info(s, &info);
    printf("saxpy: %d dispatches of %d floats on %s (%s), result right\n", ROUNDS, N, info.device,
           info.embedded ? "embedded arbiter" : "daemon");
    return check(ls_free_buffer(s, x.id), "free") || check(ls_free_buffer(s, y.id), "free") ||
           check(ls_free_program(s, saxpy.id), "free program");
}

int main(int argc, char **argv)
{
    const char *spirv = argc > 1 ? argv[1] : "shaders/saxpy.spv";
    struct ls_options options = {.name = "c-saxpy"};
    ls_session *s;
    if (check(ls_connect(&options, &s), "connect"))
        return 1;
    int failed = run(s, spirv);
    ls_disconnect(s);
    return failed;
}
