/*
 * The submission lanes: many producers, one consumer, no shared tail.
 *
 * Design
 * ------
 * The submission ring is a set of single-producer *lanes*. A producing thread
 * claims a lane once (a compare-and-swap on the lane's owner word) and from
 * then on pushes with plain stores and one store-release of its tail. There is
 * no contended atomic on the hot path, and a producer that dies cannot block
 * anyone else, because nobody else ever waits on its lane.
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
 * The consumer keeps its own copy of every head (read from the lanes at its
 * first look, not at open: each lane's head lies on a page of its own, which a
 * client's view never needs) and reads only the producers' tails, a tail
 * further than the lane's capacity from its head being corruption. Slots are
 * copied out before they are looked at, so a producer rewriting a slot cannot
 * change what was checked; a slot whose fields are out of range is handed over
 * with opcode LS_OP_BAD so the caller answers its ticket with an error. That
 * range check (fields_check) is the one a push applies to its arguments too; a push gives the
 * descriptor's flags in the high 16 bits of its opcode argument (LS_DESC_GROUP: ring.h).
 *
 * A push wakes a sleeping consumer through ring_notify_consumer (wake.c).
 */
#include "region.h"

#include <stdlib.h>
#include <string.h>

/* The one range check of a descriptor's fields, on whole values: ls_desc_check applies it to a
 * slot's copy, ls_push_op to its arguments before they are narrowed into a slot. */
static int fields_check(uint32_t opcode, uint32_t nbuffers, uint32_t push_size, uint32_t flags)
{
    if (opcode > LS_OP_MAX || nbuffers > LS_MAX_BUFFERS || push_size > LS_MAX_PUSH ||
        (flags & ~(LS_DESC_GROUP | LS_DESC_BASE)))
        return -LS_EBADSLOT;
    if ((flags & LS_DESC_GROUP) && ((opcode != LS_OP_DISPATCH && opcode != LS_OP_DISPATCH_INDIRECT) || nbuffers))
        return -LS_EBADSLOT;
    if ((flags & LS_DESC_BASE) && (!(flags & LS_DESC_GROUP) || opcode != LS_OP_DISPATCH))
        return -LS_EBADSLOT;            /* a base rides in a group dispatch's unused buffer ids */
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

int ls_producer_unconsumed(ls_producer *p)
{
    uint32_t tail;
    int free = lane_free(p->r, p->lane, &tail);
    return free < 0 ? free : (int)p->r->lane_entries - free;
}

int ls_space(ls_producer *p)
{
    uint32_t tail;
    return lane_free(p->r, p->lane, &tail);
}

/* Copies up to count descriptors in, through ls_reserve and ls_commit: twice when the
 * free slots wrap past the lane's end. Returns how many went in, or a negative error. */
int ls_push(ls_producer *p, const char *descs, uint32_t count)
{
    uint32_t done = 0;
    while (done < count) {
        struct ls_desc *slots;
        int n = ls_reserve(p, count - done, &slots);
        if (n <= 0)
            return done > 0 ? (int)done : n;
        memcpy(slots, descs + (size_t)done * LS_DESC_SIZE, (size_t)n * LS_DESC_SIZE);
        ls_commit(p, (uint32_t)n);
        done += (uint32_t)n;
    }
    return (int)done;
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
    ring_notify_consumer(p->r, LS_NEED_WAKEUP);
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
static int op_check(uint32_t opcode, uint32_t nbuffers, const uint32_t *buffers, uint32_t noffsets,
                    const uint64_t *offsets, const void *push, uint32_t push_size)
{
    uint32_t flags = opcode >> 16, group = flags & LS_DESC_GROUP;  /* a group's id rides as buffers[0], */
    uint32_t named = flags & LS_DESC_BASE ? 4 : 1;                   /* and a base as buffers[1..3] */
    if ((group && nbuffers != named) || fields_check(opcode & 0xffff, group ? 0 : nbuffers, push_size, flags) < 0 ||
        noffsets > LS_MAX_BUFFERS)
        return -LS_EBADSLOT;
    if ((nbuffers && buffers == NULL) || (noffsets && offsets == NULL) || (push_size && push == NULL))
        return -EINVAL;
    return 0;
}

/* Write every byte of slot d: the one encoding of a descriptor (ls_push_op, ls_encode_op). */
static void encode(struct ls_desc *d, uint64_t ticket, uint32_t opcode, uint32_t program, uint32_t groups_x,
                   uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers,
                   uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size)
{
    d->ticket = ticket;
    d->program = program;
    d->opcode = (uint16_t)opcode;       /* the low 16 bits; the high 16 are the flags (op_check) */
    d->flags = opcode >> 16;
    d->nbuffers = d->flags & LS_DESC_GROUP ? 0 : (uint8_t)nbuffers;
    d->push_size = (uint8_t)push_size;
    d->groups[0] = groups_x;
    d->groups[1] = groups_y;
    d->groups[2] = groups_z;
    for (uint32_t i = 0; i < LS_MAX_BUFFERS; i++) {
        d->buffer[i] = i < nbuffers ? buffers[i] : 0;
        d->offset[i] = i < noffsets ? offsets[i] : 0;
    }
    if (push_size)
        memcpy(d->push, push, push_size);
    memset(d->push + push_size, 0, LS_MAX_PUSH - push_size);
}

int ls_push_op(ls_producer *p, uint64_t ticket, uint32_t opcode, uint32_t program, uint32_t groups_x,
               uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers,
               uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size)
{
    int rc = op_check(opcode, nbuffers, buffers, noffsets, offsets, push, push_size);
    if (rc < 0)
        return rc;
    if (ls_load_acquire(&p->r->bells->consumer_state) == LS_PEER_CLOSED)
        return -LS_EPEERDEAD;
    struct ls_desc *d;
    int n = ls_reserve(p, 1, &d);
    if (n <= 0)
        return n;                       /* 0: the lane is full */
    encode(d, ticket, opcode, program, groups_x, groups_y, groups_z, nbuffers, buffers, noffsets, offsets, push,
           push_size);
    return ls_commit(p, 1) < 0 ? -LS_ECORRUPT : 1;
}

int ls_encode_op(char *slot, uint32_t opcode, uint32_t program, uint32_t groups_x, uint32_t groups_y,
                 uint32_t groups_z, uint32_t nbuffers, const uint32_t *buffers, uint32_t noffsets,
                 const uint64_t *offsets, const void *push, uint32_t push_size)
{
    int rc = slot ? op_check(opcode, nbuffers, buffers, noffsets, offsets, push, push_size) : -EINVAL;
    if (rc < 0)
        return rc;
    encode((struct ls_desc *)slot, 0, opcode, program, groups_x, groups_y, groups_z, nbuffers, buffers, noffsets,
           offsets, push, push_size);
    return 1;
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
        return ring_fail(r, -LS_ECORRUPT, i, r->heads[i], tail, r->lane_entries);
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
