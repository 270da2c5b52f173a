/*
 * Private: the control-plane calls that the C API (capi_control.c and
 * capi_reattach.c) makes into the embedded Python (bindings/c/hooks.py).
 * build.py feeds the cdef block to cffi with LSX_HOOK replaced by
 * extern "Python"; the C API sees them as static functions that cffi defines
 * in the same translation unit. Not part of libshare.h.
 *
 * Each hook returns 1 on success (cffi returns 0 when Python could not start)
 * or a negative code, after setting the thread's message with lsx_set_error().
 */
#ifndef LIBSHARE_HOOKS_H
#define LIBSHARE_HOOKS_H

#include <stdint.h>

/* cdef-begin */
/* What a connect hands to the C side. */
struct lsx_conn {
    int32_t handle;                     /* the Python session's key, > 0 */
    int32_t wake_fd;                    /* this client's doorbell, owned by the Python session */
    int32_t peer_pidfd;                 /* a pidfd of a daemon, owned by C; -1 when embedded */
    uint32_t client_id;
    uint32_t embedded;
    uint32_t pad;
    uint64_t region_addr;               /* the ring region, mapped by the Python session */
    uint64_t region_size;
    char device[256];
};

/* A ticket in flight when the arbiter went away: C fills ticket and moved, Python the rest. */
struct lsx_flight {
    uint64_t ticket;
    uint64_t device_ns;                 /* out, with done: the device time of a completion Python read */
    int32_t status;                     /* out, with done: the arbiter's status, or -LS_ERESTARTED (taken,
                                           never answered: it may or may not have run) */
    uint32_t moved;                     /* in: the old arbiter answered it -LS_EMOVED (handing over) */
    uint32_t done;                      /* out: 1 settled with status; 0 sent to the new arbiter (pending) */
    uint32_t pad;
};

LSX_HOOK int lsx_py_connect(const struct ls_options *options, struct lsx_conn *out);
/* Move the session to the arbiter that replaced a lost one (the C side no longer uses the old ring
 * and has read its completion ring): fills out (handle unchanged) and each flight. A negative code
 * when the session cannot reattach (embedded, no control daemon, terminated...): the loss is sticky. */
LSX_HOOK int lsx_py_reattach(int32_t handle, struct lsx_flight *flights, uint32_t count, struct lsx_conn *out);
/* The ids of the session's buffers lost at a reattach (device buffers): the first `capacity` in
 * ids, how many there are in *count. */
LSX_HOOK int lsx_py_lost_buffers(int32_t handle, uint32_t *ids, uint32_t capacity, uint32_t *count);
LSX_HOOK int lsx_py_close(int32_t handle);
LSX_HOOK int lsx_py_load_program(int32_t handle, const char *code, uint64_t nbytes, const char *path,
                                 const struct ls_constant *constants, uint32_t count,
                                 const struct ls_array_length *arrays, uint32_t array_count, struct ls_program *out);
#define LSX_FREE_LIST 2                 /* lsx_py_free's is_program for a command list */
#define LSX_FREE_GROUP 3                /* ... for a bind group */
#define LSX_FREE_VIEW 4                 /* ... for a texel view */
LSX_HOOK int lsx_py_free(int32_t handle, uint32_t is_program, uint32_t id);
LSX_HOOK int lsx_py_load_list(int32_t handle, const char *commands, uint32_t count, uint32_t *out);
LSX_HOOK int lsx_py_bind_group(int32_t handle, uint32_t program, const struct ls_binding *bindings, uint32_t count,
                               uint32_t *out);
LSX_HOOK int lsx_py_alloc(int32_t handle, uint64_t nbytes, uint32_t kind, struct ls_buffer *out);
LSX_HOOK int lsx_py_texel_view(int32_t handle, uint32_t buffer, const char *format, uint64_t offset,
                               uint64_t nbytes, uint32_t *out);
LSX_HOOK int lsx_py_stats(int32_t handle, struct ls_stats *out);
LSX_HOOK int lsx_py_serve(const char *pipe_directory);
LSX_HOOK int lsx_py_serve_stop(void);
LSX_HOOK int lsx_py_shutdown(void);

/* Set this thread's error message (the hooks call it); returns code. */
int lsx_set_error(int code, const char *message);
/* cdef-end */

#endif
