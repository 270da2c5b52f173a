/*
 * The C client: the hot path in C, the control plane in the embedded Python.
 *
 * libshare.so is a cffi embedding library. Rare requests (connect, program
 * load, alloc, free, stats, disconnect) go through hooks into the Python
 * client (bindings/c/hooks.py drives libshare.Session): they cost a socket
 * round trip anyway, and one implementation serves both languages. Python
 * starts inside the process on the first such call.
 *
 * Dispatch, copy, wait and poll never enter Python. At connect the Python
 * session hands over the address of its ring region (still mapped by it) and
 * the arbiter's doorbell fd; this file opens its own view of the region with
 * the ring's C core, claims a submission lane, and from then on owns the
 * session's completion ring: the Python session is used for control requests
 * only and never pops a completion of a C session. A dispatch or copy is
 * written into the lane by the ring's ls_push_op, the one descriptor encoder
 * (the Python session calls it too), which also checks its fields.
 *
 * Tickets are numbered here and kept in the ring's ticket book (ls_tickets_*
 * in libshare/ring/tickets.c, the one the Python session keeps too): a
 * ticket's record is made in the same call as its push (ls_tickets_push), so
 * its completion always finds it, and it stays until ls_wait takes the result.
 * Two locks: `lock` guards the producer and the ticket counter (held for
 * microseconds, never across a sleep, but for a reattach); `cq_lock` makes one
 * thread at a time the completion ring's consumer, the only one that may sleep
 * on it. Order: cq_lock before lock. The ring itself (region, producer, peer
 * pidfd) is used under either lock and replaced only under both; the book
 * locks itself.
 *
 * Every way of asking notices a dead arbiter: waits sleep on the ring in slices
 * and the ring checks the arbiter's pidfd (or state word) between them, and
 * ls_poll, which never sleeps, takes a zero-length wait that makes the same
 * check.
 *
 * This file is the session and its hot path: the session's ring, errors,
 * submission, completions and waits. Two files complete it, compiled after it
 * in one translation unit (build.py), the one where cffi defines the hooks:
 * capi_control.c, the calls made through the embedded Python (connect,
 * programs, buffers, stats, serve), and capi_reattach.c, surviving the
 * arbiter (a ring that ended is replaced by the new arbiter's).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "sync.h"
#include "api.h"

#define LSX_HOOK static
#include "hooks.h"
#include "errors_table.h"

#define LSX_SLICE_NS 50000000LL         /* longest sleep between checks of a waiter's deadline */
#define LSX_FULL_WAIT_NS 1000000LL      /* a full lane waits this long for completions */
#define LSX_REATTACH_TRIES 3            /* a push reattaches at most this often before the loss is sticky */

struct ls_session {
    int32_t handle;
    int32_t peer_pidfd;                 /* the ring (these three): used under lock or cq_lock, */
    ls_region *region;                  /* replaced under both (reattach); NULL once lost there */
    ls_producer *producer;
    uint64_t generation;                /* rings so far: written under both locks, read under either */
    pthread_mutex_t lock;
    pthread_mutex_t cq_lock;
    uint64_t next_ticket;
    ls_tickets *book;                   /* the tickets in flight and their outcomes */
    uint32_t *lost_ids;                 /* buffers a reattach could not carry over (device buffers), */
    uint32_t nlost;                     /* refused with -LS_EBUFFERLOST until freed: under lock */
    int lost;                           /* sticky -LS_ELOST / -LS_ECORRUPT once the ring is dead for good */
    struct ls_session_info info;
};

/* Surviving the arbiter (capi_reattach.c). */
static int reattach(ls_session *s);
static void forget_lost(ls_session *s, uint32_t buffer_id);

/* ------------------------------------------------------------------ errors */

static __thread char error_text[512];

__attribute__((visibility("hidden"))) int lsx_set_error(int code, const char *message)
{
    snprintf(error_text, sizeof error_text, "%s", message ? message : "");
    return code;
}

__attribute__((format(printf, 2, 3))) static int fail(int code, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(error_text, sizeof error_text, format, args);
    va_end(args);
    return code;
}

const char *ls_error_message(void) { return error_text; }

/* The messages of the LS_E* codes come from the error table (libshare/errors.py), through the
 * generated errors_table.h; -errno gets strerror's. */
const char *ls_strerror(int code)
{
    const char *message;
    if (code == 0)
        return "success";
    if (code > 0 || code == INT_MIN)    /* (INT_MIN has no negation) */
        return "not an error code";
    message = lsx_code_message(-code);
    return message ? message : strerror(-code);
}

/* ------------------------------------------------------------------ the ring */

static void free_session(ls_session *s)
{
    if (s->producer)
        ls_producer_close(s->producer);
    if (s->region)
        ls_region_close(s->region);
    if (s->peer_pidfd >= 0)
        close(s->peer_pidfd);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->cq_lock);
    ls_tickets_free(s->book);
    free(s->lost_ids);
    free(s);
}

/* Open the C side's own view of the region the Python session mapped. */
static int open_ring(ls_session *s, const struct lsx_conn *conn)
{
    int rc = ls_region_open((void *)(uintptr_t)conn->region_addr, conn->region_size, &s->region);
    if (rc < 0)
        return fail(-LS_EPROTOCOL, "the arbiter's ring region failed validation (%d)", rc);
    ls_set_wake_fd(s->region, conn->wake_fd);
    if (s->peer_pidfd >= 0)
        ls_set_peer_pidfd(s->region, s->peer_pidfd);
    rc = ls_producer_open(s->region, (uint32_t)syscall(SYS_gettid), (uint32_t)getpid(), &s->producer);
    if (rc == -EBUSY)
        return fail(-LS_EFULL, "cannot claim a submission lane: every lane of the ring is taken");
    if (rc < 0)
        return fail(rc, "cannot claim a submission lane (%s)", strerror(-rc));
    return 0;
}

/* ------------------------------------------------------------------ completions */

static int64_t deadline_of(int64_t timeout_ns)
{
    return timeout_ns < 0 ? INT64_MAX : ls_now_ns() + timeout_ns;
}

static int is_lost(ls_session *s) { return ls_load_relaxed(&s->lost); }

static int mark_lost(ls_session *s, int rc)
{
    int lost = rc == -LS_ECORRUPT ? -LS_ECORRUPT : -LS_ELOST;
    ls_store_relaxed(&s->lost, lost);
    return lost;
}

static int lost_error(ls_session *s)
{
    int lost = is_lost(s);
    return lost == -LS_ECORRUPT
               ? fail(lost, "the session's ring failed validation: the arbiter wrote garbage into it")
               : fail(-LS_ELOST, "the arbiter exited or closed this session; connect again");
}

/* Pop every ready completion into the book; the ring's error as is. Caller holds cq_lock. */
static int collect_ready(ls_session *s)
{
    return is_lost(s) ? is_lost(s) : ls_tickets_collect(s->book, s->region);  /* (a lost ring may be gone) */
}


/* After a ring error: 0 once the session is on a new arbiter's ring, else the sticky loss. Caller holds cq_lock. */
static int recover_locked(ls_session *s, int rc)
{
    if (is_lost(s))
        return is_lost(s);
    return rc == -LS_EPEERDEAD && !s->info.embedded ? reattach(s) : mark_lost(s, rc);
}

/* Same, from a thread that met the error on ring `generation` without cq_lock: 0 at once when another
 * thread has reattached since. */
static int recover(ls_session *s, int rc, uint64_t generation)
{
    pthread_mutex_lock(&s->cq_lock);
    rc = ls_load_relaxed(&s->generation) != generation ? 0 : recover_locked(s, rc);
    pthread_mutex_unlock(&s->cq_lock);
    return rc;
}

/*
 * One step of a wait for `ticket` (0: for every ticket): become the completion consumer, collect
 * what is ready, and while it is pending sleep up to the deadline (at most a slice).
 */
static int wait_step(ls_session *s, uint64_t ticket, int64_t deadline)
{
    pthread_mutex_lock(&s->cq_lock);
    int64_t left = deadline - ls_now_ns();
    int rc = is_lost(s) ? is_lost(s)
                        : ls_tickets_wait(s->book, s->region, ticket, LS_SPIN_NS,
                                          left <= 0 ? 0 : left < LSX_SLICE_NS ? left : LSX_SLICE_NS, NULL, NULL);
    if (rc < 0)
        rc = recover_locked(s, rc);     /* 0: on a new arbiter's ring, where the wait goes on */
    pthread_mutex_unlock(&s->cq_lock);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------------ checks */

static int check_session(ls_session *s)
{
    if (s == NULL)
        return fail(-EINVAL, "session is NULL");
    return is_lost(s) ? lost_error(s) : 0;
}

static int check_ticket(ls_session *s, uint64_t ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    if (ticket == 0 || ticket >= ls_load_relaxed(&s->next_ticket))
        return fail(-EINVAL, "ticket %llu was never issued by this session", (unsigned long long)ticket);
    return 0;
}

/* ------------------------------------------------------------------ submission */

/* One operation for ls_push_op, the ring's encoder (the Python session's too). */
struct lsx_op {
    const char *what;                   /* the API call, for error messages */
    uint32_t opcode, program, groups[3];
    uint32_t nbuffers, noffsets, push_size;
    const uint32_t *buffers;
    const uint64_t *offsets;
    const void *push;
};

/*
 * Push the operation as ticket `number` on the current ring and, once pushed, record it pending in
 * the book (one call: the book makes room for the record first, so recording cannot fail after the
 * push). Returns 1 pushed, 0 the lane is full, or a negative code. Caller holds lock.
 */
static int push_locked(ls_session *s, uint64_t number, const struct lsx_op *op)
{
    if (is_lost(s))
        return is_lost(s);
    for (uint32_t i = 0; i < s->nlost; i++) {
        for (uint32_t b = 0; op->buffers && b < op->nbuffers; b++)
            if (op->buffers[b] == s->lost_ids[i])
                return -LS_EBUFFERLOST;
        if (op->opcode == LS_OP_DISPATCH_INDIRECT && op->groups[0] == s->lost_ids[i])
            return -LS_EBUFFERLOST;     /* its counts' buffer */
    }
    return ls_tickets_push(s->book, s->producer, number, op->opcode, op->program, op->groups[0], op->groups[1],
                           op->groups[2], op->nbuffers, op->buffers, op->noffsets, op->offsets, op->push,
                           op->push_size);
}

/*
 * Give the operation a ticket and push it; when the lane is full, make room by reading completions.
 * A ring that ended (the arbiter died or handed over) is replaced by the new arbiter's (reattach),
 * where the push is made under the same number.
 */
static int submit(ls_session *s, const struct lsx_op *op, uint64_t *ticket)
{
    if (ticket == NULL)
        return fail(-EINVAL, "%s: ticket is NULL", op->what);
    uint64_t number = 0;                /* spent once a push found the lane full (another thread may take the next) */
    int rc, tries = 0;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        uint64_t generation = s->generation;
        uint64_t trying = number ? number : s->next_ticket;
        rc = push_locked(s, trying, op);
        if (rc >= 0 && number == 0) {
            number = trying;
            ls_store_relaxed(&s->next_ticket, number + 1);
        }
        pthread_mutex_unlock(&s->lock);
        if (rc == 1)
            break;
        if (rc == -LS_EBADSLOT || rc == -EINVAL)  /* refused by the encoder: no number spent */
            return fail(-EINVAL, "%s: %u buffers and %u push bytes, at most %d and %d, each array non-NULL "
                        "when its count is not 0", op->what, op->nbuffers, op->push_size, LS_MAX_BUFFERS,
                        LS_MAX_PUSH);
        if (rc == -ENOMEM)
            return fail(rc, "out of memory for the ticket book");
        if (rc == -LS_EBUFFERLOST)      /* (before any push: no number spent) */
            return fail(rc, "%s: a device buffer it uses died with the arbiter that held it (a restart keeps "
                        "shared buffers only): free it and allocate it again", op->what);
        if (rc == 0) {                  /* lane full: the arbiter waits for us to read completions */
            pthread_mutex_lock(&s->cq_lock);
            rc = is_lost(s) ? is_lost(s)
                            : ls_tickets_wait(s->book, s->region, 0, LS_SPIN_NS, LSX_FULL_WAIT_NS, NULL, NULL);
            if (rc < 0)
                rc = recover_locked(s, rc);
            pthread_mutex_unlock(&s->cq_lock);
        } else if (rc == -LS_EPEERDEAD && tries++ < LSX_REATTACH_TRIES) {
            rc = recover(s, rc, generation);
        } else if (!is_lost(s)) {
            rc = mark_lost(s, rc);
        }
        if (rc < 0)
            return lost_error(s);
    }
    *ticket = number;
    return 0;
}

int ls_dispatch(ls_session *s, uint32_t program, uint32_t groups_x, uint32_t groups_y, uint32_t groups_z,
                uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets, const void *push,
                uint32_t push_size, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {
        .what = "ls_dispatch",
        .opcode = LS_OP_DISPATCH,
        .program = program,
        .groups = {groups_x, groups_y, groups_z},
        .nbuffers = nbuffers,
        .buffers = buffers,
        .noffsets = offsets ? nbuffers : 0,   /* NULL: every offset 0 */
        .offsets = offsets,
        .push = push,
        .push_size = push_size,
    };
    return submit(s, &op, ticket);
}

int ls_dispatch_group(ls_session *s, uint32_t program, uint32_t groups_x, uint32_t groups_y, uint32_t groups_z,
                      uint32_t group, const void *push, uint32_t push_size, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {.what = "ls_dispatch_group", .opcode = LS_OP_DISPATCH | LS_DESC_GROUP << 16,
                        .program = program, .groups = {groups_x, groups_y, groups_z}, .nbuffers = 1,
                        .buffers = &group, .push = push, .push_size = push_size};
    return submit(s, &op, ticket);
}

int ls_copy(ls_session *s, uint32_t src, uint64_t src_offset, uint32_t dst, uint64_t dst_offset,
            uint64_t nbytes, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    uint32_t buffers[2] = {src, dst};
    uint64_t offsets[3] = {src_offset, dst_offset, nbytes};
    struct lsx_op op = {
        .what = "ls_copy",
        .opcode = LS_OP_COPY,
        .nbuffers = 2,
        .buffers = buffers,
        .noffsets = 3,
        .offsets = offsets,
    };
    return submit(s, &op, ticket);
}

int ls_fill(ls_session *s, uint32_t buffer, uint64_t offset, uint64_t nbytes, uint32_t value, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    uint64_t offsets[2] = {offset, nbytes};
    struct lsx_op op = {.what = "ls_fill", .opcode = LS_OP_FILL, .nbuffers = 1, .buffers = &buffer, .noffsets = 2,
                        .offsets = offsets, .push = &value, .push_size = sizeof value};
    return submit(s, &op, ticket);
}

int ls_update(ls_session *s, uint32_t buffer, uint64_t offset, const void *data, uint32_t nbytes, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {.what = "ls_update", .opcode = LS_OP_UPDATE, .nbuffers = 1, .buffers = &buffer,
                        .noffsets = 1, .offsets = &offset, .push = data, .push_size = nbytes};
    return submit(s, &op, ticket);
}

int ls_timestamp(ls_session *s, uint32_t buffer, uint64_t offset, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {.what = "ls_timestamp", .opcode = LS_OP_TIMESTAMP, .nbuffers = 1, .buffers = &buffer,
                        .noffsets = 1, .offsets = &offset};
    return submit(s, &op, ticket);
}

int ls_dispatch_indirect(ls_session *s, uint32_t program, uint32_t counts, uint64_t counts_offset, uint32_t nbuffers,
                         const uint32_t *buffers, const uint64_t *offsets, const void *push, uint32_t push_size,
                         uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {
        .what = "ls_dispatch_indirect",
        .opcode = LS_OP_DISPATCH_INDIRECT,
        .program = program,
        .groups = {counts, (uint32_t)counts_offset, (uint32_t)(counts_offset >> 32)},
        .nbuffers = nbuffers,
        .buffers = buffers,
        .noffsets = offsets ? nbuffers : 0,
        .offsets = offsets,
        .push = push,
        .push_size = push_size,
    };
    return submit(s, &op, ticket);
}

/* ------------------------------------------------------------------ command lists */

static int encoded(int rc, const char *what, uint32_t nbuffers, uint32_t push_size)
{
    if (rc == 1)
        return 0;
    return fail(-EINVAL, "%s: slot NULL, or %u buffers and %u push bytes, at most %d and %d, each array "
                "non-NULL when its count is not 0", what, nbuffers, push_size, LS_MAX_BUFFERS, LS_MAX_PUSH);
}

int ls_list_dispatch(struct ls_desc *slot, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                     uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets,
                     const void *push, uint32_t push_size)
{
    uint64_t zeros[LS_MAX_BUFFERS] = {0};  /* offsets NULL: every offset 0, as ls_dispatch() */
    int rc = ls_encode_op((char *)slot, LS_OP_DISPATCH, program, groups_x, groups_y, groups_z, nbuffers, buffers,
                          nbuffers, offsets ? offsets : nbuffers <= LS_MAX_BUFFERS ? zeros : NULL, push,
                          push_size);
    return encoded(rc, "ls_list_dispatch", nbuffers, push_size);
}

int ls_list_dispatch_group(struct ls_desc *slot, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                           uint32_t groups_z, uint32_t group, const void *push, uint32_t push_size)
{
    int rc = ls_encode_op((char *)slot, LS_OP_DISPATCH | LS_DESC_GROUP << 16, program, groups_x, groups_y, groups_z,
                          1, &group, 0, NULL, push, push_size);
    return encoded(rc, "ls_list_dispatch_group", 0, push_size);
}

int ls_list_copy(struct ls_desc *slot, uint32_t src, uint64_t src_offset, uint32_t dst, uint64_t dst_offset,
                 uint64_t nbytes)
{
    uint32_t buffers[2] = {src, dst};
    uint64_t offsets[3] = {src_offset, dst_offset, nbytes};
    return encoded(ls_encode_op((char *)slot, LS_OP_COPY, 0, 0, 0, 0, 2, buffers, 3, offsets, NULL, 0),
                   "ls_list_copy", 2, 0);
}

int ls_list_submission_push(struct ls_desc *slot)
{
    if (!slot || (slot->opcode != LS_OP_DISPATCH && slot->opcode != LS_OP_DISPATCH_INDIRECT) || slot->push_size)
        return fail(-EINVAL, "ls_list_submission_push: an encoded dispatch with no push bytes of its own");
    slot->flags |= LS_DESC_SUBMISSION_PUSH;
    return 0;
}

int ls_list_fill(struct ls_desc *slot, uint32_t buffer, uint64_t offset, uint64_t nbytes, uint32_t value)
{
    uint64_t offsets[2] = {offset, nbytes};
    return encoded(ls_encode_op((char *)slot, LS_OP_FILL, 0, 0, 0, 0, 1, &buffer, 2, offsets, &value, sizeof value),
                   "ls_list_fill", 1, sizeof value);
}

int ls_list_update(struct ls_desc *slot, uint32_t buffer, uint64_t offset, const void *data, uint32_t nbytes)
{
    return encoded(ls_encode_op((char *)slot, LS_OP_UPDATE, 0, 0, 0, 0, 1, &buffer, 1, &offset, data, nbytes),
                   "ls_list_update", 1, nbytes);
}

int ls_list_barrier(struct ls_desc *slot)
{
    return encoded(ls_encode_op((char *)slot, LS_OP_BARRIER, 0, 0, 0, 0, 0, NULL, 0, NULL, NULL, 0),
                   "ls_list_barrier", 0, 0);
}

int ls_list_timestamp(struct ls_desc *slot, uint32_t buffer, uint64_t offset)
{
    return encoded(ls_encode_op((char *)slot, LS_OP_TIMESTAMP, 0, 0, 0, 0, 1, &buffer, 1, &offset, NULL, 0),
                   "ls_list_timestamp", 1, 0);
}

int ls_list_dispatch_indirect(struct ls_desc *slot, uint32_t program, uint32_t counts, uint64_t counts_offset,
                              uint32_t nbuffers, const uint32_t *buffers, const uint64_t *offsets,
                              const void *push, uint32_t push_size)
{
    uint64_t zeros[LS_MAX_BUFFERS] = {0};  /* offsets NULL: every offset 0, as ls_dispatch() */
    int rc = ls_encode_op((char *)slot, LS_OP_DISPATCH_INDIRECT, program, counts, (uint32_t)counts_offset,
                          (uint32_t)(counts_offset >> 32), nbuffers, buffers, nbuffers,
                          offsets ? offsets : nbuffers <= LS_MAX_BUFFERS ? zeros : NULL, push, push_size);
    return encoded(rc, "ls_list_dispatch_indirect", nbuffers, push_size);
}

int ls_submit_list(ls_session *s, uint32_t list, uint64_t *ticket)
{
    return ls_submit_list_with(s, list, 0, NULL, NULL, NULL, 0, ticket);
}

int ls_submit_list_with(ls_session *s, uint32_t list, uint32_t nbuffers, const uint32_t *buffers,
                        const uint64_t *offsets, const void *push, uint32_t push_size, uint64_t *ticket)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    struct lsx_op op = {.what = "ls_submit_list", .opcode = LS_OP_LIST, .program = list, .nbuffers = nbuffers,
                        .buffers = buffers, .noffsets = offsets ? nbuffers : 0, .offsets = offsets,
                        .push = push, .push_size = push_size};
    return submit(s, &op, ticket);
}

/* ------------------------------------------------------------------ waiting */

int ls_wait(ls_session *s, uint64_t ticket, int64_t timeout_ns, uint64_t *device_ns)
{
    int rc = check_ticket(s, ticket);
    if (rc < 0)
        return rc;
    int64_t deadline = deadline_of(timeout_ns);
    for (;;) {
        int32_t status = 0;             /* (no record: taken already, 0) */
        if (ls_tickets_take(s->book, ticket, &status, device_ns) != LS_TICKET_PENDING)
            return status ? fail(status, "ticket %llu: %s", (unsigned long long)ticket, ls_strerror(status))
                          : 0;
        if (is_lost(s))
            return lost_error(s);
        if (ls_now_ns() >= deadline)
            return fail(-LS_ETIMEOUT, "ticket %llu not done after %lld ns", (unsigned long long)ticket,
                        (long long)timeout_ns);
        if ((rc = wait_step(s, ticket, deadline)) < 0)
            return lost_error(s);
    }
}

int ls_poll(ls_session *s, uint64_t ticket)
{
    int rc = check_ticket(s, ticket);
    if (rc < 0)
        return rc;
    if (ls_tickets_state(s->book, ticket) == LS_TICKET_PENDING && pthread_mutex_trylock(&s->cq_lock) == 0) {
        /* (a busy cq_lock: another thread is collecting already) No spin, no sleep: collects, and
         * notices a dead or closed arbiter. */
        rc = is_lost(s) ? is_lost(s) : ls_tickets_wait(s->book, s->region, ticket, 0, 0, NULL, NULL);
        if (rc < 0)
            rc = recover_locked(s, rc); /* (a reattach blocks: milliseconds, the session's timeout at most) */
        pthread_mutex_unlock(&s->cq_lock);
        if (rc < 0)
            return lost_error(s);
    }
    return ls_tickets_state(s->book, ticket) != LS_TICKET_PENDING;
}

int ls_wait_idle(ls_session *s, int64_t timeout_ns)
{
    int rc = check_session(s);
    if (rc < 0)
        return rc;
    int64_t deadline = deadline_of(timeout_ns);
    uint32_t pending;
    while ((pending = ls_tickets_pending(s->book)) != 0) {
        if (ls_now_ns() >= deadline)
            return fail(-LS_ETIMEOUT, "%u tickets still running after %lld ns", pending, (long long)timeout_ns);
        if ((rc = wait_step(s, 0, deadline)) < 0)
            return lost_error(s);
    }
    return 0;
}
