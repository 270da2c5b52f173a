/*
 * libshare C API: the declaration source of the client functions.
 *
 * The block between the cdef-begin and cdef-end markers is fed verbatim to
 * cffi's cdef() when bindings/c/build.py builds libshare.so, and
 * bindings/c/generate.py writes bindings/c/libshare.h from ring.h's block
 * followed by this one. Edit this file, never libshare.h.
 *
 * Conventions
 * - Every function returns 0 (or a count), or a negative code: -errno
 *   (-EINVAL for a bad argument, -ENOMEM, -ENOENT ...), -LS_E* from
 *   ring.h (a ticket the arbiter rejected), or -LS_E* from this header.
 *   After a failure, ls_error_message() says what went wrong in this thread.
 * - Timeouts are in nanoseconds; LS_FOREVER (a negative value) waits until
 *   the work is done or the arbiter is gone. No wait outlives its arbiter.
 * - Ownership: the caller owns every struct it passes in or gets filled.
 *   The session owns everything it hands out (mappings, programs, buffer
 *   ids) until they are freed or ls_disconnect() frees them all.
 * - Threads: every function may be called from any thread, concurrently on
 *   one session, except ls_disconnect(), which must be the session's last call.
 * - Surviving the arbiter: under the control daemon (libshare-control -d) a
 *   session whose arbiter dies or is restarted moves to the new one by itself,
 *   within the call that notices (any call; other threads pause meanwhile:
 *   milliseconds, at most the connect timeout). Program ids, buffer ids and
 *   shared buffers' mappings stay valid; work the old arbiter never ran is sent
 *   again under the same tickets; a ticket whose work it took and never
 *   answered fails with -LS_ERESTARTED. A device buffer does not survive:
 *   ls_dispatch() and ls_copy() on it return -LS_EBUFFERLOST until it is freed
 *   (allocate it again). Without the control daemon (or embedded, or
 *   terminated) the loss is sticky: -LS_ELOST.
 */
#ifndef LIBSHARE_API_H
#define LIBSHARE_API_H

#include <stdint.h>

/* cdef-begin */
#define LS_API_VERSION 1

/* Errors of the client API, returned negated, beside -errno and the ring's -LS_E* codes. */
#define LS_EUNAVAILABLE 1101            /* no arbiter answers and the mode forbids embedding one */
#define LS_ELOST 1102                   /* the arbiter died or closed this session and none took
                                           over (sticky): connect again */
#define LS_EQUOTA 1103                  /* a memory or compute limit would be exceeded */
#define LS_ETOOMANY 1104                /* the arbiter already serves its maximum of clients */
#define LS_ETERMINATED 1105             /* the operator terminated this client (sticky) */
#define LS_EINVALID 1106                /* the arbiter refused a request as invalid */
#define LS_ESERVER 1107                 /* the arbiter's device faulted */
#define LS_EPROTOCOL 1108               /* the arbiter broke the protocol */
#define LS_ETIMEOUT 1109                /* a wait ran past its timeout; the work goes on */
#define LS_EVULKAN 1110                 /* no usable Vulkan driver for an embedded arbiter */
#define LS_EPYTHON 1111                 /* the embedded Python failed: message and stderr say why */
#define LS_EDENIED 1112                 /* the arbiter refused this user (another uid) or this command */
#define LS_ENOTREADY 1113               /* the arbiter is in FAULT or INITIALIZING or shutting down;
                                           retry once it is ACTIVE */
#define LS_EFULL 1114                   /* every submission lane is taken, or a lane stayed full */
#define LS_ECLOSED 1115                 /* the session was closed */
#define LS_EREFUSED 1116                /* the arbiter refused the request for another reason:
                                           ls_error_message() says which */
#define LS_ERESTARTED 1117              /* the arbiter went away under this work and a new one took over:
                                           it may not have run, or partly; submit it again */
#define LS_EBUFFERLOST 1118             /* a device buffer died with the arbiter that held it */
#define LS_EQUARANTINED 1119            /* the arbiter refused this process or module: it brought
                                           arbiters down twice (ls_error_message() says how) */

#define LS_FOREVER -1                   /* a timeout that waits as long as the arbiter lives */

#define LS_BUFFER_SHARED 0              /* zero-copy host memory, mapped in this process */
#define LS_BUFFER_DEVICE 1              /* device-local memory, filled and read with ls_copy */

#define LS_CONSTANT_BOOL 1              /* struct ls_constant's type: value.u is 0 (false) or 1 (true) */
#define LS_CONSTANT_INT 2               /* value.i, a signed integer */
#define LS_CONSTANT_UINT 3              /* value.u, an unsigned integer */
#define LS_CONSTANT_FLOAT 4             /* value.f */
#define LS_MAX_CONSTANTS 64             /* most constants one ls_load_program_constants() sets */
#define LS_MAX_LIST 1024                /* most commands in one command list (ls_load_list) */
#define LS_MAX_BINDINGS 32              /* most buffers one program binds, through a bind group (ls_bind_group) */

/* How to connect. Zero (or NULL) fields take the defaults given on each field. */
struct ls_options {
    const char *name;                   /* shown by the operator tools; default "pid<pid>" */
    const char *priority;               /* "low", "normal", "high", "realtime"; default
                                           LIBSHARE_CLIENT_PRIORITY, else "normal" */
    const char *group;                  /* named group sharing limits; NULL: none */
    const char *mode;                   /* "auto" (daemon if one answers, else embedded),
                                           "daemon" or "embedded"; default LIBSHARE_MODE, else "auto" */
    const char *pipe_directory;         /* where the daemon listens; default LIBSHARE_PIPE_DIRECTORY,
                                           else $XDG_RUNTIME_DIR/libshare, else /tmp/libshare-$UID */
    int64_t timeout_ns;                 /* how long to wait for the daemon's answer; 0: 10 s */
};

/* What ls_session_info() reports. */
struct ls_session_info {
    uint32_t client_id;                 /* this session's id at the arbiter */
    uint32_t embedded;                  /* 1 when the arbiter runs inside this process */
    char device[256];                   /* the arbiter's device name, NUL-terminated */
};

/* A program loaded with ls_load_program(); its interface is read from the SPIR-V. */
struct ls_program {
    uint32_t id;                        /* the arbiter's id: pass it to ls_dispatch() */
    uint32_t bindings;                  /* buffers it takes: one per binding (an array of buffers: its
                                           length); past 8, through a bind group (ls_bind_group) */
    uint32_t push_size;                 /* bytes of push constants it declares */
    uint32_t local_size[3];             /* its workgroup size */
};

/* The value of one specialization constant (constant_id, local_size_x_id...) of a module. */
struct ls_constant {
    uint32_t id;                        /* its SpecId */
    uint32_t type;                      /* LS_CONSTANT_BOOL, _INT, _UINT or _FLOAT: which of value
                                           holds it; the arbiter checks it against the module's type */
    union {
        int64_t i;
        uint64_t u;
        double f;
    } value;
};

/* The length of one runtime-sized array of buffers (buffer B { ... } b[];) of a module. */
struct ls_array_length {
    uint32_t set;                       /* its descriptor set */
    uint32_t binding;                   /* its binding */
    uint32_t length;                    /* the buffers it takes, 1..LS_MAX_BINDINGS (with the module's
                                           other buffers, at most LS_MAX_BINDINGS in all) */
};

/* A buffer allocated with ls_alloc(). */
struct ls_buffer {
    uint32_t id;                        /* the arbiter's id: pass it to ls_dispatch()/ls_copy() */
    uint32_t kind;                      /* LS_BUFFER_SHARED or LS_BUFFER_DEVICE */
    uint64_t size;                      /* bytes, rounded up to whole pages */
    void *data;                         /* the shared buffer's mapping in this process, owned by
                                           the session until ls_free_buffer(); NULL for a device buffer */
};

/* One binding of a bind group (ls_bind_group): a buffer, the byte offset it binds from, the bytes bound. */
struct ls_binding {
    uint32_t buffer;                    /* a buffer id from ls_alloc (at a texel buffer: a view id from
                                           ls_texel_view, offset and range 0) */
    uint32_t pad;                       /* 0 */
    uint64_t offset;                    /* aligned as the device wants (a uniform buffer's: its own alignment) */
    uint64_t range;                     /* bytes bound; 0: to the buffer's end */
};

/* The arbiter's counters for one session. */
struct ls_stats {
    uint64_t submitted;                 /* descriptors the arbiter took */
    uint64_t completed;                 /* completions it posted */
    uint64_t errors;                    /* of which failed */
    uint64_t device_ns;                 /* device time measured for this client */
    uint64_t memory_bytes;              /* bytes of buffers it holds now */
};

typedef struct ls_session ls_session;   /* a connection to an arbiter; opaque */

/*
 * Connect to the arbiter at the pipe directory, or, in mode "auto" when none
 * answers, start one inside this process (the embedded default).
 * options: may be NULL (every default). out: receives the session, which the
 * caller owns and releases with ls_disconnect().
 * Returns 0, -LS_EUNAVAILABLE (mode "daemon" and no daemon), -LS_ENOTREADY (the
 * daemon is in FAULT, INITIALIZING or shutting down), -LS_EDENIED (the daemon
 * serves another user), -LS_ETOOMANY, -LS_EFULL (every lane of the ring taken),
 * -LS_EVULKAN (embedded and no driver), -EINVAL (a bad option), -LS_EPYTHON (the
 * embedded Python itself failed: never for a refusal, which has its own code).
 */
int ls_connect(const struct ls_options *options, ls_session **out);

/*
 * Disconnect and free the session: its mappings, programs, buffers and ticket
 * records. Work already submitted still completes at the arbiter. NULL is a
 * no-op. No other call on the session may run during or after this one.
 */
void ls_disconnect(ls_session *session);

/* Fill *out with the session's client id (a new one after a reattach), mode and device name. Returns 0 or -EINVAL. */
int ls_session_info(ls_session *session, struct ls_session_info *out);

/*
 * Load a compute program from nbytes of SPIR-V at code (copied; the caller
 * keeps its memory). Fills *out. Returns 0, -LS_EINVALID (not SPIR-V the
 * arbiter accepts), -LS_ELOST.
 */
int ls_load_program(ls_session *session, const void *code, uint64_t nbytes, struct ls_program *out);

/* Same as ls_load_program() with the SPIR-V read from the file at path. -ENOENT when it is missing. */
int ls_load_program_file(ls_session *session, const char *path, struct ls_program *out);

/*
 * Same as ls_load_program() with count specialization constants (at most
 * LS_MAX_CONSTANTS; constants may be NULL when count is 0). The arbiter freezes
 * them into the module before it checks and compiles it, so out->local_size is
 * the specialized workgroup size; a reattach loads the program with them again.
 * Returns -LS_EINVALID also for an id the module does not declare or a value
 * its type cannot hold (ls_error_message() names it), -EINVAL for a bad type.
 */
int ls_load_program_constants(ls_session *session, const void *code, uint64_t nbytes,
                              const struct ls_constant *constants, uint32_t count, struct ls_program *out);

/*
 * Same as ls_load_program_constants() with the lengths of the module's
 * runtime-sized arrays of buffers (array_count of them, at most
 * LS_MAX_BINDINGS; arrays may be NULL when array_count is 0): each becomes an
 * array of that many buffers, passed one after the other (out->bindings counts
 * them); a reattach loads the program with them again. Returns -LS_EINVALID
 * also for a runtime array given no length, a length given for a binding that
 * is not one, or a length past the buffers a program binds (ls_error_message()
 * names the set and binding), -EINVAL for a NULL array with a count.
 */
int ls_load_program_arrays(ls_session *session, const void *code, uint64_t nbytes,
                           const struct ls_constant *constants, uint32_t count,
                           const struct ls_array_length *arrays, uint32_t array_count, struct ls_program *out);

/* Release a program; dispatches already submitted still run. Returns 0, -LS_EINVALID (unknown id). */
int ls_free_program(ls_session *session, uint32_t program_id);

/*
 * Allocate a buffer of nbytes: kind LS_BUFFER_SHARED (zero-copy: out->data is
 * this process's mapping, which the device reads and writes) or
 * LS_BUFFER_DEVICE (out->data is NULL; use ls_copy). Fills *out.
 * Returns 0, -LS_EINVALID (size 0 or too large), -LS_EQUOTA, -EINVAL (kind).
 */
int ls_alloc(ls_session *session, uint64_t nbytes, uint32_t kind, struct ls_buffer *out);

/*
 * Release a buffer. Work already submitted on it still completes at the
 * arbiter, but a shared buffer's mapping is gone here when this returns.
 * Returns 0, -LS_EINVALID (unknown id).
 */
int ls_free_buffer(ls_session *session, uint32_t buffer_id);

/*
 * A texel view (docs/programs.md, "Texel buffers"): nbytes of buffer (0: whole texels to its end)
 * from byte offset, seen as texels of format ("r32f", "r32ui", "rgba8", "rgba32f", ...: the names
 * of libshare/protocol/texels.py), to pass in ls_dispatch()'s buffers (offset 0) at a kernel's
 * texel buffer (uniform samplerBuffer, layout(r32f) uniform imageBuffer). *view receives its id.
 * The arbiter checks that the buffer is this session's, the format one the device supports, the
 * offset a multiple of its minTexelBufferOffsetAlignment and the range whole texels within the
 * buffer: -LS_EINVALID names what it refuses; -EINVAL (format or view NULL). ls_free_view()
 * forgets one (a submitted dispatch still completes); freeing a buffer frees its views.
 */
int ls_texel_view(ls_session *session, uint32_t buffer, const char *format, uint64_t offset, uint64_t nbytes,
                  uint32_t *view);
int ls_free_view(ls_session *session, uint32_t view);

/*
 * Queue program over groups_x * groups_y * groups_z workgroups on nbuffers
 * buffers (ids from ls_alloc, or from ls_texel_view at texel buffers, bound at
 * bindings 0..nbuffers-1, each from the byte offset in offsets[i], 0 for a view;
 * offsets may be NULL for all 0) with push_size
 * bytes of push constants. Returns at once: *ticket receives the ticket to
 * wait on. Runs in C (no Python): one descriptor pushed into the ring.
 * Returns 0, -EINVAL (more than 8 buffers or 128 push bytes, buffers or push
 * NULL with a count, ticket NULL: no ticket is issued), -LS_EBUFFERLOST (a
 * device buffer that died with an arbiter: no ticket), -LS_ELOST (also when the
 * arbiter has closed this session's ring; after an arbiter restart under the
 * control daemon the session moves to the new arbiter and the work goes there
 * instead). Invalid ids, ranges and group counts are reported by ls_wait() on
 * the ticket.
 */
int ls_dispatch(ls_session *session, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets,
                const void *push, uint32_t push_size, uint64_t *ticket);

/*
 * Queue a copy of nbytes from buffer src at src_offset to buffer dst at
 * dst_offset (shared or device buffers). Returns at once with *ticket, like
 * ls_dispatch(). Runs in C.
 */
int ls_copy(ls_session *session, uint32_t src, uint64_t src_offset, uint32_t dst, uint64_t dst_offset,
            uint64_t nbytes, uint64_t *ticket);

/*
 * Queue a fill of nbytes of buffer from offset (both multiples of 4) with the 32-bit value, or a
 * write of nbytes of data (4..128, a multiple of 4, carried in the descriptor) into buffer at
 * offset (a multiple of 4). Return at once with *ticket, like ls_dispatch() (-EINVAL: data NULL,
 * or more than 128 bytes); a range past the buffer is reported by ls_wait() (-LS_ERANGE). Run in C.
 */
int ls_fill(ls_session *session, uint32_t buffer, uint64_t offset, uint64_t nbytes, uint32_t value,
            uint64_t *ticket);
int ls_update(ls_session *session, uint32_t buffer, uint64_t offset, const void *data, uint32_t nbytes,
              uint64_t *ticket);

/*
 * Queue a timestamp: once every command queued before it has ended, the device's timestamp as a
 * uint64 into buffer at offset (a multiple of 8) and a uint64 1, its availability, at offset + 8
 * (docs/programs.md, "Timestamps"); ticks of the device's timestamp period. Returns at once with
 * *ticket, like ls_dispatch(); ls_wait() reports a range past the buffer or a misaligned offset
 * (-LS_ERANGE) and a device whose queue has no timestamps (-LS_EUNSUPPORTED). Runs in C.
 */
int ls_timestamp(ls_session *session, uint32_t buffer, uint64_t offset, uint64_t *ticket);

/*
 * Queue program on nbuffers buffers, as ls_dispatch(), over the workgroup counts the device reads
 * when it runs: three uint32 at byte counts_offset (a multiple of 4) of buffer counts. The arbiter
 * clamps them on the device (docs/programs.md, "Indirect dispatches"): counts of 0 run nothing;
 * a count past the device's limit or a product past 2^32 - 1 runs nothing and ls_wait() returns
 * -LS_EGROUPS. Runs in C.
 */
int ls_dispatch_indirect(ls_session *session, uint32_t program, uint32_t counts, uint64_t counts_offset,
                         uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets, const void *push,
                         uint32_t push_size, uint64_t *ticket);

/*
 * Command lists (docs/programs.md, "Command lists"): commands recorded once and run in order by one
 * descriptor, answered by one ticket. ls_list_dispatch(), ls_list_copy(), ls_list_fill(),
 * ls_list_update(), ls_list_barrier() (checked; changes nothing, every command ending with a
 * barrier already), ls_list_dispatch_indirect() (its counts may be written by a command before
 * it) and ls_list_timestamp() (as ls_timestamp(): the commands before it have ended) encode
 * a command into a slot of the caller's array (the ring's one encoder and its check: -EINVAL for
 * what ls_dispatch() refuses); ls_load_list() hands count of them (1..LS_MAX_LIST) to the arbiter,
 * which checks each as it checks a dispatch (-LS_EINVALID names the first it refuses) and keeps
 * the list as *list. ls_submit_list() runs it like ls_dispatch() (in C, one descriptor); ls_wait()
 * on its ticket gives the device time of all its commands and the first failure among them.
 * ls_free_list() forgets it (a submitted run still completes). A session that reattaches hands
 * its lists to the new arbiter with its buffers and programs.
 *
 * Parameters: a command's buffer id LS_LIST_ARG | k (k < LS_MAX_BUFFERS) names slot k of each
 * submission, and ls_list_submission_push() makes an encoded dispatch with no push bytes of its
 * own (else -EINVAL) take each submission's. ls_submit_list_with() gives them: nbuffers buffers
 * (slots 0 to the highest the list uses) at offsets (NULL: all 0), push_size push bytes (at most what
 * every such command's program takes); ls_wait() then says -LS_EBINDINGS, -LS_EPUSH or
 * -LS_ENOBUFFER for a submission that does not fit. ls_submit_list() submits with none.
 */
int ls_list_dispatch(struct ls_desc *slot, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                     uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets,
                     const void *push, uint32_t push_size);
int ls_list_copy(struct ls_desc *slot, uint32_t src, uint64_t src_offset, uint32_t dst, uint64_t dst_offset,
                 uint64_t nbytes);
int ls_list_fill(struct ls_desc *slot, uint32_t buffer, uint64_t offset, uint64_t nbytes, uint32_t value);
int ls_list_update(struct ls_desc *slot, uint32_t buffer, uint64_t offset, const void *data, uint32_t nbytes);
int ls_list_barrier(struct ls_desc *slot);
int ls_list_timestamp(struct ls_desc *slot, uint32_t buffer, uint64_t offset);
int ls_list_dispatch_indirect(struct ls_desc *slot, uint32_t program, uint32_t counts, uint64_t counts_offset,
                              uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets,
                              const void *push, uint32_t push_size);
int ls_load_list(ls_session *session, const struct ls_desc *commands, uint32_t count, uint32_t *list);
int ls_list_submission_push(struct ls_desc *slot);
int ls_submit_list(ls_session *session, uint32_t list, uint64_t *ticket);
int ls_submit_list_with(ls_session *session, uint32_t list, uint32_t nbuffers, const uint32_t *buffers,
                        const uint64_t *offsets, const void *push, uint32_t push_size, uint64_t *ticket);
int ls_free_list(ls_session *session, uint32_t list);

/*
 * Bind groups (docs/programs.md, "Bind groups"): a program's buffers bound once, each with its own
 * offset and range, named by one id. ls_bind_group() hands count bindings (the program's count, in
 * its binding order; at most LS_MAX_BINDINGS) to the arbiter, which checks each (-LS_EINVALID names
 * the first it refuses) and keeps them as *group, for every program of the same layout. A program with
 * more than 8 buffers is dispatched only so. ls_dispatch_group() queues a dispatch over the group like
 * ls_dispatch() (in C, one descriptor); ls_list_dispatch_group() encodes one into a command list's
 * slot. A buffer (or texel view) of the group freed since fails the dispatch (-LS_ENOBUFFER from
 * ls_wait()).
 * ls_free_group() forgets it (queued dispatches still run). A session that reattaches hands its
 * groups to the new arbiter with its buffers and programs.
 */
int ls_bind_group(ls_session *session, uint32_t program, const struct ls_binding *bindings, uint32_t count,
                  uint32_t *group);
int ls_dispatch_group(ls_session *session, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                      uint32_t groups_z, uint32_t group, const void *push, uint32_t push_size, uint64_t *ticket);
int ls_list_dispatch_group(struct ls_desc *slot, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                           uint32_t groups_z, uint32_t group, const void *push, uint32_t push_size);
int ls_free_group(ls_session *session, uint32_t group);

/*
 * Wait until the ticket's work is done, at most timeout_ns (LS_FOREVER: no
 * limit). Returns 0 when it succeeded (and stores the device time in
 * *device_ns when device_ns is not NULL and the arbiter measured it), the
 * ticket's negative LS_E* status when the arbiter rejected or failed it,
 * -LS_ERESTARTED (the arbiter went away with the work in flight and a new one
 * took over: it may not have run, or partly; submit it again), -LS_ETIMEOUT (the
 * ticket stays valid), -LS_ELOST, or -EINVAL (a ticket this session never
 * issued). The first wait that returns the result consumes the ticket's
 * record; a later wait on it returns 0. Runs in C (Python only to reattach).
 */
int ls_wait(ls_session *session, uint64_t ticket, int64_t timeout_ns, uint64_t *device_ns);

/*
 * Whether the ticket's work is done, without blocking (but to reattach after
 * an arbiter restart): 1 done (the result waits for ls_wait), 0 still running,
 * or a negative code (-EINVAL, -LS_ELOST: each call checks that the arbiter
 * lives, so polling sees its death). Runs in C.
 */
int ls_poll(ls_session *session, uint64_t ticket);

/*
 * Wait until every ticket submitted so far is done, at most timeout_ns.
 * Errors stay with their tickets (ls_wait reports them). Returns 0,
 * -LS_ETIMEOUT or -LS_ELOST. Runs in C.
 */
int ls_wait_idle(ls_session *session, int64_t timeout_ns);

/* Fill *out with the arbiter's counters for this session (a new arbiter's start at 0). Returns 0 or -LS_ELOST. */
int ls_stats(ls_session *session, struct ls_stats *out);

/*
 * Serve an arbiter inside this process at pipe_directory (created mode 0700
 * if missing), so that other processes can connect to it in mode "daemon"
 * (a C program hosting its workers, as examples/multi_process.c does).
 * Returns 0, -EBUSY (this process already serves one, or another arbiter
 * serves pipe_directory: it is left alone), -LS_EVULKAN, -errno.
 */
int ls_serve(const char *pipe_directory);

/* Stop the arbiter ls_serve() started: finish in-flight work, tell its clients. Idempotent. */
void ls_serve_stop(void);

/*
 * The message of the last failure of a libshare call in this thread ("" when
 * none). The string belongs to libshare and stays valid until the thread's
 * next failing libshare call.
 */
const char *ls_error_message(void);

/* A fixed description of a code returned by any libshare function (a static string). */
const char *ls_strerror(int code);
/* cdef-end */

#endif
