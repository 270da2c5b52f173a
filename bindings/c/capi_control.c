/*
 * The C client's control plane: the API calls made through the embedded
 * Python. Compiled after capi.c (the session and its hot path), in the unit
 * that build.py makes, where cffi defines the hooks (hooks.h).
 *
 * Each call checks its arguments in C and hands the rest to a hook, which
 * hooks.py implements on the Python session: connect, program load and free,
 * alloc and free, stats, disconnect, and serving an arbiter in this process.
 * A hook returns 1 on success, 0 only when Python never ran, or a negative
 * code: the embedded Python's refusals each come back with their own code
 * (hooks.py, through the error table of libshare/errors.py), their message set
 * with lsx_set_error(); -LS_EPYTHON means the Python side itself failed.
 *
 * Python runs with SIGPIPE held off (PYTHON). A control call that meets an
 * arbiter restart first (-LS_ERESTARTED from Python) reattaches the session
 * (capi_reattach.c) and is made again (CONTROL).
 */

/* ------------------------------------------------------------------ calling Python */

static int python_failed(void)
{
    return fail(-LS_EPYTHON, "the embedded Python could not start libshare (its traceback is on stderr); "
                             "rebuild libshare.so with the Python environment that has libshare installed");
}

/* A hook's answer as an API result: hooks return 1 on success, and 0 only when Python never ran. */
static int hooked(int rc) { return rc > 0 ? 0 : rc < 0 ? rc : python_failed(); }

/*
 * Python writes to sockets without MSG_NOSIGNAL and, embedded, leaves SIGPIPE
 * at its default: a peer that closed first would kill the C program. So
 * SIGPIPE is blocked in the calling thread while Python runs (threads Python
 * starts meanwhile, the embedded arbiter's, inherit the mask), and one that
 * arrived is consumed before the mask is restored: the write saw EPIPE instead.
 */
static void pipe_block(sigset_t *old)
{
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, old);
}

static void pipe_restore(const sigset_t *old)
{
    sigset_t pending, pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (!sigismember(old, SIGPIPE) && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        sigtimedwait(&pipe, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Call a hook with SIGPIPE held off; its result as an API result. */
#define PYTHON(call)                                                                                \
    ({                                                                                              \
        sigset_t old_mask_;                                                                         \
        pipe_block(&old_mask_);                                                                     \
        int hook_rc_ = (call);                                                                      \
        pipe_restore(&old_mask_);                                                                   \
        hook_rc_;                                                                                   \
    })

/* A control call (a hook): once more after a reattach when it met an arbiter restart first. */
#define CONTROL(s, call)                                                                            \
    ({                                                                                              \
        uint64_t generation_ = ls_load_relaxed(&(s)->generation);                                   \
        int control_rc_ = hooked(PYTHON(call));                                                     \
        if (control_rc_ == -LS_ERESTARTED)                                                          \
            control_rc_ = recover((s), -LS_EPEERDEAD, generation_) == 0 ? hooked(PYTHON(call))       \
                                                                        : lost_error(s);            \
        control_rc_;                                                                                \
    })

/* ------------------------------------------------------------------ the calls */

static int shutdown_registered;

static void shutdown_python(void) { (void)PYTHON(lsx_py_shutdown()); }

int ls_connect(const struct ls_options *options, ls_session **out)
{
    if (out == NULL)
        return fail(-EINVAL, "ls_connect: out is NULL");
    *out = NULL;
    struct ls_options defaults = {0};
    struct lsx_conn conn = {.peer_pidfd = -1};
    int rc = hooked(PYTHON(lsx_py_connect(options ? options : &defaults, &conn)));
    if (rc < 0)
        return rc;
    if (conn.handle <= 0)
        return python_failed();
    ls_session *s = calloc(1, sizeof *s);
    if (s == NULL || ls_tickets_new(&s->book) < 0) {
        free(s);
        (void)PYTHON(lsx_py_close(conn.handle));
        return fail(-ENOMEM, "out of memory for a session");
    }
    s->handle = conn.handle;
    s->peer_pidfd = conn.peer_pidfd;
    s->next_ticket = 1;
    s->info.client_id = conn.client_id;
    s->info.embedded = conn.embedded;
    memcpy(s->info.device, conn.device, sizeof s->info.device);
    s->info.device[sizeof s->info.device - 1] = 0;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->cq_lock, NULL);
    if ((rc = open_ring(s, &conn)) < 0) {
        free_session(s);
        (void)PYTHON(lsx_py_close(conn.handle));
        return rc;
    }
    if (!ls_exchange(&shutdown_registered, 1))
        atexit(shutdown_python);        /* the embedded Python never finalizes: close its arbiter */
    *out = s;
    return 0;
}

void ls_disconnect(ls_session *s)
{
    if (s == NULL)
        return;
    int32_t handle = s->handle;
    free_session(s);                    /* stop using the region before Python unmaps it */
    (void)PYTHON(lsx_py_close(handle));
}

int ls_session_info(ls_session *s, struct ls_session_info *out)
{
    if (s == NULL || out == NULL)
        return fail(-EINVAL, "ls_session_info: session or out is NULL");
    *out = s->info;
    return 0;
}

int ls_load_program(ls_session *s, const void *code, uint64_t nbytes, struct ls_program *out)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (code == NULL || nbytes == 0 || out == NULL)
        return fail(-EINVAL, "ls_load_program: code is NULL or empty, or out is NULL");
    return CONTROL(s, lsx_py_load_program(s->handle, code, nbytes, NULL, NULL, 0, NULL, 0, out));
}

int ls_load_program_file(ls_session *s, const char *path, struct ls_program *out)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (path == NULL || out == NULL)
        return fail(-EINVAL, "ls_load_program_file: path or out is NULL");
    return CONTROL(s, lsx_py_load_program(s->handle, NULL, 0, path, NULL, 0, NULL, 0, out));
}

int ls_load_program_constants(ls_session *s, const void *code, uint64_t nbytes,
                              const struct ls_constant *constants, uint32_t count, struct ls_program *out)
{
    return ls_load_program_arrays(s, code, nbytes, constants, count, NULL, 0, out);
}

int ls_load_program_arrays(ls_session *s, const void *code, uint64_t nbytes, const struct ls_constant *constants,
                           uint32_t count, const struct ls_array_length *arrays, uint32_t array_count,
                           struct ls_program *out)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (code == NULL || nbytes == 0 || out == NULL || (constants == NULL && count > 0))
        return fail(-EINVAL, "ls_load_program_constants: code is NULL or empty, out is NULL, or constants "
                    "is NULL with a count");
    if (count > LS_MAX_CONSTANTS)
        return fail(-EINVAL, "ls_load_program_constants: %u constants, at most %d", count, LS_MAX_CONSTANTS);
    for (uint32_t k = 0; k < count; k++)
        if (constants[k].type < LS_CONSTANT_BOOL || constants[k].type > LS_CONSTANT_FLOAT ||
            (constants[k].type == LS_CONSTANT_BOOL && constants[k].value.u > 1))
            return fail(-EINVAL, "ls_load_program_constants: constant %u (id %u) has type %u; a type is "
                        "LS_CONSTANT_BOOL (value.u 0 or 1), _INT, _UINT or _FLOAT", k, constants[k].id,
                        constants[k].type);
    if ((arrays == NULL && array_count > 0) || array_count > LS_MAX_BINDINGS)
        return fail(-EINVAL, "ls_load_program_arrays: arrays is NULL with a count, or %u arrays (at most %d)",
                    array_count, LS_MAX_BINDINGS);
    return CONTROL(s, lsx_py_load_program(s->handle, code, nbytes, NULL, constants, count, arrays, array_count,
                                          out));
}

int ls_free_program(ls_session *s, uint32_t program_id)
{
    int rc = check_session(s);
    return rc < 0 ? rc : CONTROL(s, lsx_py_free(s->handle, 1, program_id));
}

int ls_load_list(ls_session *s, const struct ls_desc *commands, uint32_t count, uint32_t *list)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (commands == NULL || list == NULL || count == 0 || count > LS_MAX_LIST)
        return fail(-EINVAL, "ls_load_list: commands or list is NULL, or %u commands (1 to %d)", count,
                    LS_MAX_LIST);
    return CONTROL(s, lsx_py_load_list(s->handle, (const char *)commands, count, list));
}

int ls_free_list(ls_session *s, uint32_t list)
{
    int rc = check_session(s);
    return rc < 0 ? rc : CONTROL(s, lsx_py_free(s->handle, LSX_FREE_LIST, list));
}

int ls_bind_group(ls_session *s, uint32_t program, const struct ls_binding *bindings, uint32_t count,
                  uint32_t *group)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (bindings == NULL || group == NULL || count == 0 || count > LS_MAX_BINDINGS)
        return fail(-EINVAL, "ls_bind_group: bindings or group is NULL, or %u bindings (1 to %d)", count,
                    LS_MAX_BINDINGS);
    return CONTROL(s, lsx_py_bind_group(s->handle, program, bindings, count, group));
}

int ls_free_group(ls_session *s, uint32_t group)
{
    int rc = check_session(s);
    return rc < 0 ? rc : CONTROL(s, lsx_py_free(s->handle, LSX_FREE_GROUP, group));
}

int ls_alloc(ls_session *s, uint64_t nbytes, uint32_t kind, struct ls_buffer *out)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (out == NULL)
        return fail(-EINVAL, "ls_alloc: out is NULL");
    if (kind != LS_BUFFER_SHARED && kind != LS_BUFFER_DEVICE)
        return fail(-EINVAL, "ls_alloc: kind must be LS_BUFFER_SHARED or LS_BUFFER_DEVICE (got %u)", kind);
    if ((rc = CONTROL(s, lsx_py_alloc(s->handle, nbytes, kind, out))) == 0)
        forget_lost(s, out->id);        /* (the new arbiter gave a lost id out again) */
    return rc;
}

int ls_free_buffer(ls_session *s, uint32_t buffer_id)
{
    int rc = check_session(s);
    if (rc == 0 && (rc = CONTROL(s, lsx_py_free(s->handle, 0, buffer_id))) == 0)
        forget_lost(s, buffer_id);
    return rc;
}

int ls_texel_view(ls_session *s, uint32_t buffer, const char *format, uint64_t offset, uint64_t nbytes,
                  uint32_t *view)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (format == NULL || view == NULL)
        return fail(-EINVAL, "ls_texel_view: format or view is NULL");
    if ((rc = CONTROL(s, lsx_py_texel_view(s->handle, buffer, format, offset, nbytes, view))) == 0)
        forget_lost(s, *view);          /* (the new arbiter gave a lost id out again) */
    return rc;
}

int ls_free_view(ls_session *s, uint32_t view)
{
    int rc = check_session(s);
    if (rc == 0 && (rc = CONTROL(s, lsx_py_free(s->handle, LSX_FREE_VIEW, view))) == 0)
        forget_lost(s, view);
    return rc;
}

int ls_stats(ls_session *s, struct ls_stats *out)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (out == NULL)
        return fail(-EINVAL, "ls_stats: out is NULL");
    return CONTROL(s, lsx_py_stats(s->handle, out));
}

int ls_serve(const char *pipe_directory)
{
    if (pipe_directory == NULL || *pipe_directory == 0)
        return fail(-EINVAL, "ls_serve: pipe_directory is NULL or empty");
    return hooked(PYTHON(lsx_py_serve(pipe_directory)));
}

void ls_serve_stop(void) { (void)PYTHON(lsx_py_serve_stop()); }
