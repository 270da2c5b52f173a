/*
 * The libshare ring: the data plane between a client and the arbiter.
 *
 * Design
 * ------
 * A region holds a *submission ring* and a *completion ring*. The submission
 * ring is many-producer, one-consumer, but not through a shared tail: it is a
 * set of single-producer *lanes*. A producing thread claims a lane once (a
 * compare-and-swap on the lane's owner word) and from then on pushes with
 * plain stores and one store-release of its tail. There is no contended
 * atomic on the hot path, and a producer that dies cannot block anyone else,
 * because nobody else ever waits on its lane.
 *
 * Indexes are free-running uint32 counters masked at use: a lane is full when
 * tail - head == entries, the slot of position p is slots[p & mask].
 *
 * A half-written slot. A push first stores reserved_tail = tail + n, copies
 * the n descriptors into their slots, then store-releases tail = tail + n.
 * The consumer reads only [head, tail), so a producer killed while copying
 * leaves slots that are never read: the entries before them (already
 * published) and every other lane drain normally. A region belongs to one client
 * process, whose death ends its session, so nothing reclaims such a lane. A client
 * writes its descriptors with ls_push_op, which encodes one operation in place
 * between ls_reserve and ls_commit: the same two stores bracket the slot.
 *
 * The consumer trusts nothing in the region. At open it validates the header
 * and copies the geometry into private memory; it never reads a size or
 * offset from shared memory again. It keeps its own copy of every head (read
 * from the lanes at its first look, not at open: each lane's head lies on a
 * page of its own, which a client's view never needs) and of the completion
 * tail, and reads only the peer-written index of each ring,
 * rejecting a distance beyond the capacity as corruption (sticky: the region
 * is dead from then on, with the details in ls_last_error). Slots are copied
 * out before they are looked at, so a producer rewriting a slot cannot change
 * what was checked; a slot whose fields are out of range is handed over with
 * opcode LS_OP_BAD so the caller answers its ticket with an error.
 *
 * Sleep and wake follow io_uring's SQPOLL. A consumer that finds nothing
 * spins for a bounded time (yielding its core at each look: on a machine with
 * fewer cores than busy threads, a spinner that kept its core held off the
 * very thread it waited for; measured on a 2-core VM, a tiny round trip with
 * client, arbiter and lavapipe on one core took 93-98 us, 26 us with yields),
 * then sets LS_NEED_WAKEUP in sq_flags, issues a
 * full barrier, looks once more, and sleeps on the sq_bell futex word. A
 * producer, after publishing its tail, issues a full barrier and reads
 * sq_flags; only when the flag is set does it take it (exchange to 0), bump
 * sq_bell and wake the consumer. So while the consumer polls, producers make
 * no system call. The arbiter's engine sleeps on many rings at once, in poll(),
 * so a client given a doorbell (ls_set_wake_fd: one end of a datagram socket
 * pair whose other end only the arbiter holds) writes 8 bytes there instead of
 * waking the futex. The completion ring works the same way in the other
 * direction: a client thread sleeps on the cq_bell futex (LS_NEED_WAKEUP), and
 * an event loop, which cannot block in a futex, asks for a byte on its end of
 * the doorbell instead (ls_cq_arm sets LS_NEED_WAKEUP_FD) and polls it; the
 * poster takes both flags at once and wakes each kind of waiter it finds.
 * A consumer may also wait for the completion ring to drain: a client whose
 * ring holds work while every completion slot is taken cannot be given more
 * (its answers would have nowhere to go), and polling it would keep the
 * consumer's core busy for as long as the client chose not to read. So the
 * consumer sets LS_NEED_ROOM instead of LS_NEED_WAKEUP (ls_sq_arm_room: a
 * push could not be taken either, so it rings nothing), and ls_cq_pop, after
 * releasing slots, rings the consumer the same way a push does when it finds
 * that flag.
 * Every sleep is cut into slices of at most LS_SLICE_NS; between slices the
 * sleeper checks that its peer is alive (a pidfd, or the peer's state word),
 * so a dead peer is noticed within one slice.
 *
 * A client does not read this ring's completions itself: its ticket book
 * (tickets.c) pushes through ls_push_op, files what ls_cq_pop returns and
 * sleeps in ls_cq_wait, for the C API and the Python session alike.
 */
#define _GNU_SOURCE
#include "ring.h"
#include "sync.h"

#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define LS_SPIN_OFF_FACTOR 20           /* no spin while waits average 20 spins (see wait_for) */
#define LS_SLICE_NS 50000000LL          /* 50 ms: how long a dead peer can go unnoticed */
#define LS_HEADER_SIZE 128
#define LS_BELLS_SIZE 128
#define LS_NO_LANE 0xffffffffu

_Static_assert(sizeof(struct ls_desc) == LS_DESC_SIZE, "descriptor is 256 bytes");
_Static_assert(sizeof(struct ls_cqe) == LS_CQE_SIZE, "completion is 32 bytes");
_Static_assert(sizeof(struct ls_region_header) == LS_HEADER_SIZE, "header is two cache lines");
_Static_assert(sizeof(struct ls_bells) == LS_BELLS_SIZE, "bells are two cache lines");
_Static_assert(sizeof(struct ls_lane) == 2 * LS_CACHELINE, "lane indexes are two cache lines");
_Static_assert(offsetof(struct ls_lane, head) == LS_CACHELINE, "head has its own cache line");
_Static_assert(sizeof(struct ls_cq) == 2 * LS_CACHELINE, "cq indexes are two cache lines");
_Static_assert(offsetof(struct ls_cq, head) == LS_CACHELINE, "cq head has its own cache line");

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

static int is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static struct ls_lane *lane_at(ls_region *r, uint32_t i)
{
    return (struct ls_lane *)(r->base + r->lanes_offset + (uint64_t)i * r->lane_stride);
}

static struct ls_desc *lane_slots(struct ls_lane *l) { return (struct ls_desc *)(l + 1); }

static int geometry_ok(uint32_t lane_count, uint32_t lane_entries, uint32_t cq_entries)
{
    return lane_count >= 1 && lane_count <= LS_MAX_LANES && is_pow2(lane_entries) &&
           lane_entries <= LS_MAX_ENTRIES && is_pow2(cq_entries) && cq_entries <= LS_MAX_ENTRIES;
}

int64_t ls_region_size(uint32_t lane_count, uint32_t lane_entries, uint32_t cq_entries)
{
    if (!geometry_ok(lane_count, lane_entries, cq_entries))
        return -EINVAL;
    uint64_t lane_stride = sizeof(struct ls_lane) + (uint64_t)lane_entries * LS_DESC_SIZE;
    uint64_t cq_offset = LS_HEADER_SIZE + LS_BELLS_SIZE + lane_count * lane_stride;
    uint64_t end = cq_offset + sizeof(struct ls_cq) + (uint64_t)cq_entries * LS_CQE_SIZE;
    return (int64_t)align_up(end, 4096);
}

int ls_region_format(void *base, uint64_t size, uint32_t lane_count, uint32_t lane_entries,
                     uint32_t cq_entries, uint32_t creator_pid)
{
    int64_t need = ls_region_size(lane_count, lane_entries, cq_entries);
    if (need < 0)
        return (int)need;
    if (size < (uint64_t)need)
        return -ENOSPC;
    /* Only the indexes are zeroed: the header, the bells, each lane's and the completion ring's
     * (ten pages of a 548 KiB region). A slot is written before its index publishes it, so its old
     * bytes are never read; and the memfd a region is made on reads as zeros anyway. Zeroing all
     * of it faulted in every page (Region.create: 690 us of CPU on a 2-core VM, now 96 us), where
     * a client that pushes from one thread touches one lane's. */
    struct ls_region_header *h = base;
    memset(base, 0, LS_HEADER_SIZE + LS_BELLS_SIZE);
    h->version = LS_RING_VERSION;
    h->region_size = (uint64_t)need;
    h->lane_count = lane_count;
    h->lane_entries = lane_entries;
    h->cq_entries = cq_entries;
    h->desc_size = LS_DESC_SIZE;
    h->cqe_size = LS_CQE_SIZE;
    h->creator_pid = creator_pid;
    h->lanes_offset = LS_HEADER_SIZE + LS_BELLS_SIZE;
    h->lane_stride = sizeof(struct ls_lane) + (uint64_t)lane_entries * LS_DESC_SIZE;
    h->cq_offset = h->lanes_offset + lane_count * h->lane_stride;
    for (uint32_t i = 0; i < lane_count; i++)
        memset((char *)base + h->lanes_offset + i * h->lane_stride, 0, sizeof(struct ls_lane));
    memset((char *)base + h->cq_offset, 0, sizeof(struct ls_cq));
    /* Pairs with the load-acquire of magic in ls_region_open: a peer that sees the
     * magic sees a complete header. */
    ls_store_release(&h->magic, LS_RING_MAGIC);
    return 0;
}

static int header_ok(const struct ls_region_header *h, uint64_t mapped_size)
{
    if (ls_load_acquire(&h->magic) != LS_RING_MAGIC || h->version != LS_RING_VERSION)
        return 0;
    if (h->desc_size != LS_DESC_SIZE || h->cqe_size != LS_CQE_SIZE)
        return 0;
    int64_t need = ls_region_size(h->lane_count, h->lane_entries, h->cq_entries);
    if (need < 0 || (uint64_t)need != h->region_size || h->region_size > mapped_size)
        return 0;
    uint64_t stride = sizeof(struct ls_lane) + (uint64_t)h->lane_entries * LS_DESC_SIZE;
    return h->lanes_offset == LS_HEADER_SIZE + LS_BELLS_SIZE && h->lane_stride == stride &&
           h->cq_offset == h->lanes_offset + h->lane_count * stride;
}

int ls_region_open(void *base, uint64_t mapped_size, ls_region **out)
{
    *out = NULL;
    if (mapped_size < LS_HEADER_SIZE + LS_BELLS_SIZE)
        return -LS_ECORRUPT;
    struct ls_region_header h;
    memcpy(&h, base, sizeof h);         /* one private snapshot: the peer may rewrite it */
    if (!header_ok(&h, mapped_size))
        return -LS_ECORRUPT;
    ls_region *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->base = base;
    r->size = h.region_size;
    r->lane_count = h.lane_count;
    r->lane_entries = h.lane_entries;
    r->cq_entries = h.cq_entries;
    r->lanes_offset = h.lanes_offset;
    r->lane_stride = h.lane_stride;
    r->cq_offset = h.cq_offset;
    r->bells = (struct ls_bells *)(r->base + LS_HEADER_SIZE);
    r->cq = (struct ls_cq *)(r->base + r->cq_offset);
    r->cqes = (struct ls_cqe *)(r->cq + 1);
    r->cq_tail = ls_load_acquire(&r->cq->tail);
    r->cq_head = ls_load_acquire(&r->cq->head);
    r->peer_pidfd = -1;
    r->wake_fd = -1;
    r->err.lane = LS_NO_LANE;
    *out = r;
    return 0;
}

void ls_region_close(ls_region *r) { free(r); }

struct ls_region_header *ls_region_header_of(ls_region *r) { return (struct ls_region_header *)r->base; }

struct ls_bells *ls_region_bells(ls_region *r) { return r->bells; }

void ls_last_error(ls_region *r, struct ls_error_info *out) { *out = r->err; }

static int fail(ls_region *r, int code, uint32_t lane, uint32_t head, uint32_t tail, uint32_t cap)
{
    r->err.code = code;
    r->err.lane = lane;
    r->err.head = head;
    r->err.tail = tail;
    r->err.capacity = cap;
    return code;
}

/* A byte on the doorbell socket for an async waiter. Never blocks (MSG_DONTWAIT: a full socket
 * has its wake-up already) and never raises SIGPIPE. */
static void ring_bell(ls_region *r)
{
    char one = 1;
    if (r->wake_fd >= 0 && send(r->wake_fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return;                         /* full, or the client's end is gone: nothing to wake */
}

void ls_set_consumer(ls_region *r, uint32_t pid, uint32_t state)
{
    ls_store_relaxed(&r->bells->consumer_pid, pid);
    ls_store_release(&r->bells->consumer_state, state);
    if (state == LS_PEER_CLOSED) {      /* wake a client asleep on completions so it sees the close */
        ls_futex_wake_impl(&r->bells->cq_bell, INT_MAX);
        ring_bell(r);
    }
}

void ls_close_consumer(ls_region *r, uint32_t reason)
{
    /* The first reason stays: a ring closed for a reason (terminated, faulted, handed over) is
     * closed again, with 0, when the arbiter shuts down, and the client must still read why. */
    int closed_for_a_reason = ls_load_acquire(&r->bells->consumer_state) == LS_PEER_CLOSED &&
                              ls_load_acquire(&r->bells->close_reason) != 0;
    if (!closed_for_a_reason)
        ls_store_relaxed(&r->bells->close_reason, reason);
    ls_set_consumer(r, ls_load_acquire(&r->bells->consumer_pid), LS_PEER_CLOSED);
}

uint32_t ls_close_reason(const ls_region *r)
{
    if (ls_load_acquire(&r->bells->consumer_state) != LS_PEER_CLOSED)
        return 0;
    return ls_load_acquire(&r->bells->close_reason);
}

void ls_set_client(ls_region *r, uint32_t pid, uint32_t state)
{
    ls_store_relaxed(&r->bells->client_pid, pid);
    ls_store_release(&r->bells->client_state, state);
}

void ls_set_peer_pidfd(ls_region *r, int pidfd) { r->peer_pidfd = pidfd; }

void ls_set_wake_fd(ls_region *r, int doorbell_fd) { r->wake_fd = doorbell_fd; }

int ls_set_spin_mode(ls_region *r, uint32_t mode)
{
    if (mode > LS_SPIN_NONE)
        return -EINVAL;
    r->spin_mode = mode;
    return 0;
}

static int pidfd_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

/* The one range check of a descriptor's fields, on whole values: ls_desc_check applies it to a
 * slot's copy, ls_push_op to its arguments before they are narrowed into a slot. */
static int fields_check(uint32_t opcode, uint32_t nbuffers, uint32_t push_size, uint32_t flags)
{
    if (opcode > LS_OP_MAX || nbuffers > LS_MAX_BUFFERS || push_size > LS_MAX_PUSH || flags != 0)
        return -LS_EBADSLOT;
    return 0;
}

/* ------------------------------------------------------------------ producer */

static int thread_gone(uint32_t pid, uint32_t tid)
{
    return syscall(SYS_tgkill, (pid_t)pid, (pid_t)tid, 0) != 0 && errno == ESRCH;
}

struct ls_producer {
    ls_region *r;
    struct ls_lane *lane;
    uint32_t index, tid;
};

static int lane_claim(ls_region *r, uint32_t tid, uint32_t pid)
{
    for (uint32_t i = 0; i < r->lane_count; i++) {
        struct ls_lane *l = lane_at(r, i);
        uint32_t expected = 0;
        if (ls_cas(&l->owner_tid, &expected, tid)) {
            ls_store_release(&l->owner_pid, pid);
            return (int)i;
        }
    }
    /* A lane still held by an exited thread of this process can be taken over:
     * a thread cannot exit in the middle of a push, so its lane is consistent. */
    for (uint32_t i = 0; i < r->lane_count; i++) {
        struct ls_lane *l = lane_at(r, i);
        uint32_t owner = ls_load_acquire(&l->owner_tid);
        if (ls_load_relaxed(&l->owner_pid) == pid && owner && thread_gone(pid, owner) &&
            ls_cas(&l->owner_tid, &owner, tid))
            return (int)i;
    }
    return -EBUSY;
}

int ls_producer_open(ls_region *r, uint32_t tid, uint32_t pid, ls_producer **out)
{
    *out = NULL;
    if (tid == 0)
        return -EINVAL;
    int lane = lane_claim(r, tid, pid);
    if (lane < 0)
        return lane;
    ls_producer *p = malloc(sizeof *p);
    if (!p) {
        struct ls_lane *l = lane_at(r, (uint32_t)lane);
        ls_store_relaxed(&l->owner_pid, 0);
        ls_store_release(&l->owner_tid, 0);
        return -ENOMEM;
    }
    p->r = r;
    p->lane = lane_at(r, (uint32_t)lane);
    p->index = (uint32_t)lane;
    p->tid = tid;
    *out = p;
    return 0;
}

/* Gives the lane back (unless someone took it over) and frees the handle. */
void ls_producer_close(ls_producer *p)
{
    uint32_t expected = p->tid;
    if (ls_load_relaxed(&p->lane->owner_tid) == p->tid)
        ls_store_relaxed(&p->lane->owner_pid, 0);
    ls_cas(&p->lane->owner_tid, &expected, 0);
    free(p);
}

int ls_producer_lane(ls_producer *p) { return (int)p->index; }

/* Free slots in a lane as the producer sees them, or -LS_ECORRUPT. */
static int lane_free(ls_region *r, struct ls_lane *l, uint32_t *tail_out)
{
    uint32_t tail = ls_load_relaxed(&l->tail);   /* ours: we are its only writer */
    /* Pairs with the consumer's store-release of head in ls_sq_pop: the slots
     * it has released are no longer being read. */
    uint32_t head = ls_load_acquire(&l->head);
    uint32_t used = tail - head;
    if (used > r->lane_entries)
        return -LS_ECORRUPT;
    *tail_out = tail;
    return (int)(r->lane_entries - used);
}

/* Wake the consumer if it asked for it with flag (LS_NEED_WAKEUP after a push, LS_NEED_ROOM after a
 * completion pop); the first waker takes every flag, and the consumer arms again. */
static void notify_consumer(ls_region *r, uint32_t flag)
{
    struct ls_bells *b = r->bells;
    /* Pairs with the ls_smp_mb in ls_sq_wait (ls_sq_arm, ls_sq_arm_room) after it sets its flags:
     * either it sees our tail (or head), or we see its flag. */
    ls_smp_mb();
    if (!(ls_load_relaxed(&b->sq_flags) & flag))
        return;
    if (!(ls_exchange(&b->sq_flags, 0) & flag))
        return;                         /* another producer took the wake */
    ls_fetch_add(&b->sq_bell, 1);
    if (r->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t written = write(r->wake_fd, &one, sizeof one);
        (void)written;                  /* a full doorbell already wakes its reader */
    } else {
        ls_futex_wake_impl(&b->sq_bell, 1);
    }
}

int ls_space(ls_producer *p)
{
    uint32_t tail;
    return lane_free(p->r, p->lane, &tail);
}

int ls_push(ls_producer *p, const char *descs, uint32_t count)
{
    ls_region *r = p->r;
    struct ls_lane *l = p->lane;
    uint32_t tail;
    int space = lane_free(r, l, &tail);
    if (space <= 0)
        return space;
    uint32_t n = count < (uint32_t)space ? count : (uint32_t)space;
    if (n == 0)
        return 0;
    ls_store_relaxed(&l->reserved_tail, tail + n);
    uint32_t mask = r->lane_entries - 1;
    uint32_t first = (tail & mask);
    uint32_t before_wrap = r->lane_entries - first;
    uint32_t part = n < before_wrap ? n : before_wrap;
    memcpy(lane_slots(l) + first, descs, (size_t)part * LS_DESC_SIZE);
    memcpy(lane_slots(l), descs + (size_t)part * LS_DESC_SIZE, (size_t)(n - part) * LS_DESC_SIZE);
    /* Pairs with the consumer's load-acquire of tail in ls_sq_pop: it sees the slots. */
    ls_store_release(&l->tail, tail + n);
    notify_consumer(r, LS_NEED_WAKEUP);
    return (int)n;
}

int ls_reserve(ls_producer *p, uint32_t count, struct ls_desc **slots)
{
    ls_region *r = p->r;
    struct ls_lane *l = p->lane;
    uint32_t tail;
    int space = lane_free(r, l, &tail);
    if (space <= 0)
        return space;
    uint32_t first = tail & (r->lane_entries - 1);
    uint32_t n = count;
    if (n > (uint32_t)space)
        n = (uint32_t)space;
    if (n > r->lane_entries - first)
        n = r->lane_entries - first;    /* contiguous slots only */
    ls_store_relaxed(&l->reserved_tail, tail + n);
    *slots = lane_slots(l) + first;
    return (int)n;
}

int ls_commit(ls_producer *p, uint32_t count)
{
    struct ls_lane *l = p->lane;
    uint32_t tail = ls_load_relaxed(&l->tail);
    if (ls_load_relaxed(&l->reserved_tail) - tail < count)
        return -EINVAL;                 /* committing more than was reserved */
    ls_store_release(&l->tail, tail + count);   /* pairs with ls_sq_pop's load-acquire */
    notify_consumer(p->r, LS_NEED_WAKEUP);
    return 0;
}

/*
 * The client's one way to write a descriptor (the Python session and bindings/c both call it):
 * encode the operation straight into the lane's next slot (ls_reserve), then publish it
 * (ls_commit). Every byte of the slot is written, unused ids, offsets and push bytes as zeros,
 * so equal operations give equal slots. Nothing is reserved for a refused call: fields out of
 * range (fields_check, the consumer's own check, on the whole argument values) or more than
 * LS_MAX_BUFFERS offsets give -LS_EBADSLOT, a NULL array with a count -EINVAL, and a consumer
 * that closed its side -LS_EPEERDEAD (the work would never be read).
 */
int ls_push_op(ls_producer *p, uint64_t ticket, uint32_t opcode, uint32_t program, uint32_t groups_x,
               uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers,
               uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size)
{
    if (fields_check(opcode, nbuffers, push_size, 0) < 0 || noffsets > LS_MAX_BUFFERS)
        return -LS_EBADSLOT;
    if ((nbuffers && buffers == NULL) || (noffsets && offsets == NULL) || (push_size && push == NULL))
        return -EINVAL;
    if (ls_load_acquire(&p->r->bells->consumer_state) == LS_PEER_CLOSED)
        return -LS_EPEERDEAD;
    struct ls_desc *d;
    int n = ls_reserve(p, 1, &d);
    if (n <= 0)
        return n;                       /* 0: the lane is full */
    d->ticket = ticket;
    d->program = program;
    d->opcode = (uint16_t)opcode;
    d->nbuffers = (uint8_t)nbuffers;
    d->push_size = (uint8_t)push_size;
    d->groups[0] = groups_x;
    d->groups[1] = groups_y;
    d->groups[2] = groups_z;
    d->flags = 0;
    for (uint32_t i = 0; i < LS_MAX_BUFFERS; i++) {
        d->buffer[i] = i < nbuffers ? buffers[i] : 0;
        d->offset[i] = i < noffsets ? offsets[i] : 0;
    }
    if (push_size)
        memcpy(d->push, push, push_size);
    memset(d->push + push_size, 0, LS_MAX_PUSH - push_size);
    return ls_commit(p, 1) < 0 ? -LS_ECORRUPT : 1;
}

/* ------------------------------------------------------------------ consumer */

int ls_desc_check(const struct ls_desc *d)
{
    return fields_check(d->opcode, d->nbuffers, d->push_size, d->flags);
}

/* The consumer's private heads, read from the lanes at its first look, not at ls_region_open: each
 * lane's head lies on a page of its own, and a client (which opens the region but never consumes)
 * would pay a page fault for each lane on its way to its welcome if they were read at open. */
static void consumer_heads(ls_region *r)
{
    if (r->heads_read)
        return;
    for (uint32_t i = 0; i < r->lane_count; i++)
        r->heads[i] = ls_load_acquire(&lane_at(r, i)->head);
    r->heads_read = 1;
}

/* Entries ready in one lane, or -LS_ECORRUPT (recorded) when its tail is impossible. */
static int lane_ready(ls_region *r, uint32_t i, uint32_t *tail_out)
{
    consumer_heads(r);
    /* Pairs with the producer's store-release of tail: the slots before it are written. */
    uint32_t tail = ls_load_acquire(&lane_at(r, i)->tail);
    uint32_t ready = tail - r->heads[i];
    if (ready > r->lane_entries)
        return fail(r, -LS_ECORRUPT, i, r->heads[i], tail, r->lane_entries);
    *tail_out = tail;
    return (int)ready;
}

int ls_sq_pending(ls_region *r)
{
    if (r->err.code)
        return r->err.code;
    int total = 0;
    for (uint32_t i = 0; i < r->lane_count; i++) {
        uint32_t tail;
        int ready = lane_ready(r, i, &tail);
        if (ready < 0)
            return ready;
        total += ready;
    }
    return total;
}

int ls_sq_marks(ls_region *r, uint32_t *marks, uint32_t max)
{
    if (r->err.code)
        return r->err.code;
    if (max < r->lane_count)
        return -EINVAL;
    for (uint32_t i = 0; i < r->lane_count; i++) {
        int ready = lane_ready(r, i, &marks[i]);
        if (ready < 0)
            return ready;
    }
    return (int)r->lane_count;
}

int ls_sq_passed(ls_region *r, const uint32_t *marks, uint32_t n)
{
    consumer_heads(r);
    for (uint32_t i = 0; i < n && i < r->lane_count; i++)
        if ((int32_t)(r->heads[i] - marks[i]) < 0)
            return 0;
    return 1;
}

static void copy_out(ls_region *r, uint32_t lane, uint32_t from, uint32_t n, char *out)
{
    struct ls_desc *slots = lane_slots(lane_at(r, lane));
    uint32_t mask = r->lane_entries - 1;
    for (uint32_t k = 0; k < n; k++) {
        struct ls_desc *d = (struct ls_desc *)(out + (size_t)k * LS_DESC_SIZE);
        memcpy(d, &slots[(from + k) & mask], LS_DESC_SIZE);
        if (ls_desc_check(d))           /* checked on our private copy */
            d->opcode = LS_OP_BAD;
    }
}

int ls_sq_pop(ls_region *r, char *out, uint32_t max)
{
    if (r->err.code)
        return r->err.code;
    uint32_t got = 0;
    for (uint32_t step = 0; step < r->lane_count && got < max; step++) {
        uint32_t i = (r->next_lane + step) % r->lane_count;
        uint32_t tail;
        int ready = lane_ready(r, i, &tail);
        if (ready < 0)
            return ready;
        uint32_t n = (uint32_t)ready < max - got ? (uint32_t)ready : max - got;
        if (n == 0)
            continue;
        copy_out(r, i, r->heads[i], n, out + (size_t)got * LS_DESC_SIZE);
        r->heads[i] += n;
        /* Pairs with the producer's load-acquire of head: these slots may be reused. */
        ls_store_release(&lane_at(r, i)->head, r->heads[i]);
        got += n;
    }
    r->next_lane = (r->next_lane + 1) % r->lane_count;
    return (int)got;
}

static int peer_gone(ls_region *r, const uint32_t *state_word)
{
    return ls_load_acquire(state_word) == LS_PEER_CLOSED || pidfd_exited(r->peer_pidfd);
}

/*
 * The shared sleep: spin on ready() for spin_ns, then sleep on *bell with
 * NEED_WAKEUP set in *flags, in slices, until ready() > 0, the peer is gone,
 * or timeout_ns passes (a negative timeout waits forever, slice by slice).
 * Each step of the spin yields the core (ls_spin_step): a spinner that shares
 * its core with the thread it waits for lets it run at once. A yield may also
 * hand the core to an unrelated busy thread for a whole time slice, so each
 * view has a spin mode (ls_set_spin_mode, from the session's priority):
 *   LS_SPIN_YIELD  (normal, high) yield at each look, and keep spinning while
 *                  waits average up to LS_SPIN_OFF_FACTOR spins;
 *   LS_SPIN_KEEP   (realtime) keep the core, and spin only while waits end
 *                  within the spin on average: its spin must not hold a core
 *                  the arbiter needs to answer it;
 *   LS_SPIN_NONE   (low) sleep at once: background work does not poll.
 * Past the threshold only every 16th wait spins; one that ends within its spin
 * turns spinning back on (the average alone would not: waits that sleep are slow
 * because they sleep). Measured on a 2-core VM with lavapipe (issue 13's benches,
 * three runs each, the engine's polls yielding too, unplaced): eight Python
 * clients against eight private devices 0.69-0.86x with the spins of before
 * (keep the core, one spin), 0.88-1.04x yielding with one spin, 1.12-1.19x with
 * these modes; a realtime client's p99 under 7 low clients 0.6-1.7 ms before,
 * 2.5-5.3 ms when every client yielded and spun longer, 0.8-2.1 ms with these
 * modes. With the engine yielding only where it is placed with lavapipe's
 * thread (engine/wait.c, "Cores"), the engine's polls decide more than these modes:
 * 0.58-0.62x with the clients' modes alone, 0.93-1.12x placed.
 */
static int wait_for(ls_region *r, int (*ready)(ls_region *, uint32_t), uint32_t want,
                    uint32_t *flags, uint32_t *bell, const uint32_t *peer_state,
                    int64_t spin_ns, int64_t timeout_ns)
{
    int64_t start = ls_now_ns();
    int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
    int n;
    if (r->spin_mode == LS_SPIN_NONE)
        spin_ns = 0;
    int off = r->wait_ns > (r->spin_mode == LS_SPIN_KEEP ? 1 : LS_SPIN_OFF_FACTOR) * spin_ns;
    if (off && (r->waits & 15))
        spin_ns = 0;
    r->waits++;
    for (uint32_t iter = 0;; iter++) {
        if ((n = ready(r, want)) != 0) {
            int64_t took = ls_now_ns() - start;
            r->wait_ns = off ? took : r->wait_ns + (took - r->wait_ns) / 8;
            return n;
        }
        if ((iter & 7) == 0 && ls_now_ns() - start >= spin_ns)
            break;
        if (r->spin_mode == LS_SPIN_KEEP)
            ls_cpu_relax();
        else
            ls_spin_step();
    }
    for (;;) {
        uint32_t seen = ls_load_acquire(bell);
        ls_fetch_or(flags, LS_NEED_WAKEUP);  /* beside an async waiter's LS_NEED_WAKEUP_FD */
        /* Pairs with the waker's ls_smp_mb after it publishes: either we see its
         * entries below, or it sees NEED_WAKEUP and bumps the bell. */
        ls_smp_mb();
        if ((n = ready(r, want)) != 0)
            break;
        if (peer_gone(r, peer_state)) {
            n = -LS_EPEERDEAD;
            break;
        }
        int64_t now = ls_now_ns();
        if (now >= deadline) {
            n = -ETIMEDOUT;
            break;
        }
        int64_t slice = deadline - now < LS_SLICE_NS ? deadline - now : LS_SLICE_NS;
        ls_futex_wait_impl(bell, seen, slice);
    }
    ls_fetch_and(flags, ~(uint32_t)LS_NEED_WAKEUP);
    if (n > 0)
        r->wait_ns += (ls_now_ns() - start - r->wait_ns) / 8;
    return n;
}

static int sq_ready(ls_region *r, uint32_t want)
{
    (void)want;
    return ls_sq_pending(r);
}

int ls_sq_wait(ls_region *r, int64_t spin_ns, int64_t timeout_ns)
{
    struct ls_bells *b = r->bells;
    return wait_for(r, sq_ready, 1, &b->sq_flags, &b->sq_bell, &b->client_state, spin_ns,
                    timeout_ns);
}

int ls_sq_arm(ls_region *r)
{
    ls_store_relaxed(&r->bells->sq_flags, LS_NEED_WAKEUP);
    /* Pairs with the producer's ls_smp_mb in notify_consumer: either the caller
     * sees the entries counted here, or the producer sees NEED_WAKEUP and rings. */
    ls_smp_mb();
    return ls_sq_pending(r);
}

int ls_sq_arm_room(ls_region *r)
{
    ls_store_relaxed(&r->bells->sq_flags, LS_NEED_ROOM);  /* a push could not be taken: it rings nothing */
    /* Pairs with the ls_smp_mb in notify_consumer after ls_cq_pop releases slots. */
    ls_smp_mb();
    return ls_cq_space(r);
}

void ls_sq_disarm(ls_region *r) { ls_store_relaxed(&r->bells->sq_flags, 0); }

/* ------------------------------------------------------------------ completions */

int ls_cq_space(ls_region *r)
{
    if (r->err.code)
        return r->err.code;
    /* Pairs with the client's store-release of head in ls_cq_pop. */
    uint32_t head = ls_load_acquire(&r->cq->head);
    uint32_t used = r->cq_tail - head;
    if (used > r->cq_entries)
        return fail(r, -LS_ECORRUPT, LS_NO_LANE, head, r->cq_tail, r->cq_entries);
    return (int)(r->cq_entries - used);
}

int ls_cq_post(ls_region *r, const char *cqes, uint32_t count)
{
    int space = ls_cq_space(r);
    if (space < 0)
        return space;
    uint32_t n = count < (uint32_t)space ? count : (uint32_t)space;
    uint32_t mask = r->cq_entries - 1;
    for (uint32_t k = 0; k < n; k++)
        memcpy(&r->cqes[(r->cq_tail + k) & mask], cqes + (size_t)k * LS_CQE_SIZE, LS_CQE_SIZE);
    r->cq_tail += n;
    /* Pairs with the client's load-acquire of tail in ls_cq_ready. */
    ls_store_release(&r->cq->tail, r->cq_tail);
    struct ls_bells *b = r->bells;
    /* Pairs with the ls_smp_mb in ls_cq_wait (wait_for) after it sets NEED_WAKEUP. */
    ls_smp_mb();
    uint32_t wanted;
    if (n && ls_load_relaxed(&b->cq_flags) && (wanted = ls_exchange(&b->cq_flags, 0))) {
        if (wanted & LS_NEED_WAKEUP) {
            ls_fetch_add(&b->cq_bell, 1);
            ls_futex_wake_impl(&b->cq_bell, INT_MAX);
        }
        if (wanted & LS_NEED_WAKEUP_FD)
            ring_bell(r);
    }
    return (int)n;
}

int ls_cq_ready(ls_region *r)
{
    if (r->err.code)
        return r->err.code;
    uint32_t tail = ls_load_acquire(&r->cq->tail);
    uint32_t ready = tail - r->cq_head;
    if (ready > r->cq_entries)
        return fail(r, -LS_ECORRUPT, LS_NO_LANE, r->cq_head, tail, r->cq_entries);
    return (int)ready;
}

int ls_cq_pop(ls_region *r, char *out, uint32_t max)
{
    int ready = ls_cq_ready(r);
    if (ready <= 0)
        return ready;
    uint32_t n = (uint32_t)ready < max ? (uint32_t)ready : max;
    uint32_t mask = r->cq_entries - 1;
    for (uint32_t k = 0; k < n; k++)
        memcpy(out + (size_t)k * LS_CQE_SIZE, &r->cqes[(r->cq_head + k) & mask], LS_CQE_SIZE);
    r->cq_head += n;
    /* Pairs with the arbiter's load-acquire of head in ls_cq_space. */
    ls_store_release(&r->cq->head, r->cq_head);
    if (n)
        notify_consumer(r, LS_NEED_ROOM);  /* a consumer waiting for room to answer in */
    return (int)n;
}

static int cq_ready_at_least(ls_region *r, uint32_t want)
{
    int ready = ls_cq_ready(r);
    return (ready < 0 || (uint32_t)ready >= want) ? ready : 0;
}

int ls_cq_arm(ls_region *r)
{
    ls_fetch_or(&r->bells->cq_flags, LS_NEED_WAKEUP_FD);
    /* Pairs with the ls_smp_mb in ls_cq_post after it publishes: either the caller sees the
     * completions counted here, or the poster sees LS_NEED_WAKEUP_FD and sends a byte. */
    ls_smp_mb();
    return ls_cq_ready(r);
}

int ls_cq_wait(ls_region *r, uint32_t min_ready, int64_t spin_ns, int64_t timeout_ns)
{
    struct ls_bells *b = r->bells;
    if (min_ready == 0 || min_ready > r->cq_entries)
        return -EINVAL;
    return wait_for(r, cq_ready_at_least, min_ready, &b->cq_flags, &b->cq_bell,
                    &b->consumer_state, spin_ns, timeout_ns);
}

/* ------------------------------------------------------------------ futex */

int ls_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    return ls_futex_wait_impl(word, expected, timeout_ns);
}

int ls_futex_wake(uint32_t *word, int32_t count) { return ls_futex_wake_impl(word, count); }
