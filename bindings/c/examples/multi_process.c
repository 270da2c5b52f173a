/*
 * Four processes share one device: this process serves an arbiter (ls_serve)
 * in a private pipe directory, and four forked workers connect to it, each
 * running its own saxpy 50 times and checking its result.
 *
 *   multi_process SHADER_DIR            this process hosts the arbiter
 *   multi_process SHADER_DIR --daemon   every worker uses the daemon at LIBSHARE_PIPE_DIRECTORY
 *
 * The workers fork before this process makes any libshare call, so each
 * starts its own embedded Python on its first call (an interpreter must not
 * be forked with threads running); a pipe tells them when the arbiter listens.
 */
#include <libshare.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 4
#define N 2048
#define ROUNDS 50

struct push {
    uint32_t n;
    float a;
};

/* Says what failed, naming this worker's pid; returns 1 when rc is an error, else 0. */
static int report(int rc, const char *what)
{
    if (rc >= 0)
        return 0;
    fprintf(stderr, "pid %d: %s: %s (%s)\n", (int)getpid(), what, ls_strerror(rc), ls_error_message());
    return 1;
}

/* y = a*x + y, ROUNDS times, with a = worker + 1; returns 0 when the result is right. */
static int compute(ls_session *s, const char *spirv, int worker)
{
    struct ls_program saxpy;
    struct ls_buffer x, y;
    if (report(ls_load_program_file(s, spirv, &saxpy), "load") ||
        report(ls_alloc(s, N * sizeof(float), LS_BUFFER_SHARED, &x), "alloc") ||
        report(ls_alloc(s, N * sizeof(float), LS_BUFFER_SHARED, &y), "alloc"))
        return 1;
    float *xs = x.data, *ys = y.data;
    for (int i = 0; i < N; i++) {
        xs[i] = (float)(i % 100);
        ys[i] = 0.0f;
    }
    struct push push = {N, (float)(worker + 1)};
    uint32_t ids[2] = {x.id, y.id};
    uint64_t ticket;
    for (int round = 0; round < ROUNDS; round++)
        if (report(ls_dispatch(s, saxpy.id, N / 64, 1, 1, 2, ids, NULL, &push, sizeof push, &ticket), "dispatch"))
            return 1;
    if (report(ls_wait_idle(s, 60 * 1000000000LL), "wait idle") || report(ls_wait(s, ticket, 0, NULL), "wait"))
        return 1;
    for (int i = 0; i < N; i++) {
        float expected = ROUNDS * push.a * (float)(i % 100);
        if (fabsf(ys[i] - expected) > 1e-4f * expected) {
            fprintf(stderr, "pid %d: y[%d] = %g, expected %g\n", (int)getpid(), i, ys[i], expected);
            return 1;
        }
    }
    return 0;
}

static int worker_main(int worker, int ready_fd, const char *pipe_dir, const char *spirv)
{
    char byte;
    if (read(ready_fd, &byte, 1) != 1 || byte != 'y')
        return 1;                       /* the host could not start its arbiter */
    char name[32];
    snprintf(name, sizeof name, "c-worker-%d", worker);
    struct ls_options options = {.name = name, .mode = "daemon", .pipe_directory = pipe_dir};
    ls_session *s;
    if (report(ls_connect(&options, &s), "connect"))
        return 1;
    struct ls_session_info info;
    ls_session_info(s, &info);
    int failed = compute(s, spirv, worker);
    if (!failed)
        printf("pid %d worker %d (client %u): %d dispatches, result right\n", (int)getpid(), worker,
               info.client_id, ROUNDS);
    fflush(stdout);
    ls_disconnect(s);
    return failed;
}

int main(int argc, char **argv)
{
    char spirv[4096];
    snprintf(spirv, sizeof spirv, "%s/saxpy.spv", argc > 1 ? argv[1] : "shaders");
    int host = !(argc > 2 && strcmp(argv[2], "--daemon") == 0);
    char private_dir[] = "/tmp/libshare-example-XXXXXX";
    if (host && mkdtemp(private_dir) == NULL)
        return perror("mkdtemp"), 1;
    const char *pipe_dir = host ? private_dir : NULL;
    int ready[2];
    if (pipe(ready) < 0)
        return perror("pipe"), 1;
    pid_t pids[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        if ((pids[w] = fork()) == 0) {
            close(ready[1]);
            _exit(worker_main(w, ready[0], pipe_dir, spirv));
        }
    }
    close(ready[0]);
    int served = !host || !report(ls_serve(private_dir), "serve");
    for (int w = 0; w < WORKERS; w++)
        if (write(ready[1], served ? "y" : "n", 1) != 1)
            perror("write");
    close(ready[1]);
    int right = 0;
    for (int w = 0; w < WORKERS; w++) {
        int status;
        waitpid(pids[w], &status, 0);
        right += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (host) {
        ls_serve_stop();
        rmdir(private_dir);
    }
    printf("%d of %d workers right\n", right, WORKERS);
    return right != WORKERS;
}
