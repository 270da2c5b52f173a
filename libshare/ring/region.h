/*
 * The ring's private header: a process's view of a region (struct ls_region), the lane
 * helpers, and the functions one of the ring's files calls in another. ring.h is the ABI
 * (the cdef that cffi reads and libshare.h copies); nothing here reaches Python or C clients.
 *
 * The ring's files, each opening with its part of the design:
 *   ring.c         the region: layout, geometry, format, open and its checks, sticky errors
 *   lanes.c        the submission lanes: claiming a lane, push and ls_push_op, the consumer's
 *                  pops and the one range check of a slot (ls_desc_check)
 *   completions.c  the completion ring: the consumer posts, the client pops
 *   wake.c         the peers and the sleep/wake handshake: states, doorbells, spins, futexes
 *   tickets.c      a client's ticket book (not part of the core: the engine does not link it)
 *   sync.h         every atomic and futex
 *
 * The functions declared here have hidden visibility: the modules that compile the ring in
 * (the ring's own, the engine's, libshare.so) export only what ring.h declares.
 */
#ifndef LIBSHARE_RING_REGION_H
#define LIBSHARE_RING_REGION_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ring.h"
#include "sync.h"

#include <stdint.h>

#define LS_HEADER_SIZE 128
#define LS_BELLS_SIZE 128
#define LS_NO_LANE 0xffffffffu

struct ls_region {
    uint8_t *base;
    uint64_t size;
    uint32_t lane_count, lane_entries, cq_entries;
    uint64_t lanes_offset, lane_stride, cq_offset;
    struct ls_bells *bells;
    struct ls_cq *cq;
    struct ls_cqe *cqes;
    uint32_t cq_tail;                   /* arbiter's private completion tail */
    uint32_t cq_head;                   /* client's private completion head */
    uint32_t next_lane;                 /* where the next pop starts (round robin) */
    int peer_pidfd;
    int wake_fd;
    struct ls_error_info err;           /* sticky once err.code != 0 */
    uint32_t heads[LS_MAX_LANES];       /* consumer's private lane heads (see consumer_heads) */
    uint32_t heads_read;                /* 1 once heads[] holds the lanes' heads */
    int64_t wait_ns;                    /* how long a wait that ended in work took, on average */
    uint32_t waits;                     /* waits so far: every 16th spins whatever wait_ns says */
    uint32_t spin_mode;                 /* LS_SPIN_YIELD (0), LS_SPIN_KEEP or LS_SPIN_NONE */
};

static inline struct ls_lane *lane_at(ls_region *r, uint32_t i)
{
    return (struct ls_lane *)(r->base + r->lanes_offset + (uint64_t)i * r->lane_stride);
}

static inline struct ls_desc *lane_slots(struct ls_lane *l) { return (struct ls_desc *)(l + 1); }

#pragma GCC visibility push(hidden)

/* ring.c */
/* Record why the region failed (sticky: every later call returns code) and return code. */
int ring_fail(ls_region *r, int code, uint32_t lane, uint32_t head, uint32_t tail, uint32_t cap);

/* wake.c */
/* Wake the consumer if it asked for it with flag (LS_NEED_WAKEUP after a push, LS_NEED_ROOM after a
 * completion pop). */
void ring_notify_consumer(ls_region *r, uint32_t flag);
/* Wake the client's waiters on completions (the futex's, and an async waiter's doorbell byte) if
 * they asked for it, after completions were published. */
void ring_notify_client(ls_region *r);
/* The shared sleep: spin on ready(r, want), then sleep on *bell with LS_NEED_WAKEUP in *flags, until
 * ready() is not 0, the peer whose state is *peer_state is gone (-LS_EPEERDEAD) or timeout_ns passes
 * (-ETIMEDOUT; a negative timeout waits forever). */
int ring_wait_for(ls_region *r, int (*ready)(ls_region *, uint32_t), uint32_t want, uint32_t *flags,
                  uint32_t *bell, const uint32_t *peer_state, int64_t spin_ns, int64_t timeout_ns);

#pragma GCC visibility pop

#endif
