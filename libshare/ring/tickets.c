/*
 * The ticket book: a client's record of its tickets in flight and of what each came to.
 *
 * One design serves both clients. The C API (bindings/c/capi.c) and the Python
 * session (libshare/client/completions.py, through libshare/ring/_tickets.py) each keep
 * one book per session: a ticket is recorded pending in the same call that
 * pushes its descriptor (ls_tickets_push), the one completion consumer files
 * every completion it pops into the book (ls_tickets_collect, ls_tickets_wait),
 * and a waiter takes its ticket's outcome out (ls_tickets_take). Nothing here
 * needs Python: a Python waiter sleeps in ls_tickets_wait with the GIL released.
 *
 * Records live in an open-addressing table (linear probing, backward-shift
 * deletion) under the book's own mutex, held for microseconds and never
 * across a sleep. Tickets are consecutive numbers, so a record's home slot is a
 * multiplicative hash of its number, not the number itself: consecutive homes
 * would make one long cluster, and a deletion walks to the end of its cluster. A record is pending, or done with its
 * status and device time. A pending record may carry two marks:
 *  - moved: the arbiter answered it -LS_EMOVED (it handed over and did not run
 *    it); the reattach sends it to the new arbiter and clears the mark;
 *  - orphan: nobody will ask for it (the Python Ticket was dropped): its
 *    completion is read and dropped, so pipelining without waiting keeps no
 *    record per dispatch. A done record that is forgotten goes at once.
 * A completion for a ticket with no pending record is ignored (the arbiter is
 * untrusted); so is a second one.
 *
 * The book does not serialize the completion ring: the caller is its one
 * consumer while it collects or waits (capi.c's cq_lock, the Python session's
 * _cq_lock), which is also what lets a reattach stop every reader.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ring.h"

#define CQE_BATCH 64
#define GOLDEN 0x9e3779b97f4a7c15ull    /* 2^64 / the golden ratio: Fibonacci hashing */

enum { SLOT_EMPTY, SLOT_PENDING, SLOT_DONE };
enum { MARK_MOVED = LS_TICKET_MOVED, MARK_ORPHAN = LS_TICKET_ORPHAN };

struct record {
    uint64_t ticket;
    uint64_t device_ns;
    int32_t status;                     /* once done */
    uint16_t state;                     /* SLOT_* */
    uint16_t marks;                     /* MARK_*, while pending */
};

struct ls_tickets {
    pthread_mutex_t lock;               /* guards everything below */
    struct record *slots;
    uint32_t cap;                       /* power of two; at most half used */
    uint32_t shift;                     /* 64 - log2(cap): a home slot is the hash's top bits */
    uint32_t used;
    uint32_t pending;                   /* orphans included: their completions are still due */
    uint64_t cancelled;                 /* completions filed with -LS_ECANCELED, ever */
};

/* ------------------------------------------------------------------ the table (caller holds lock) */

static uint32_t home(uint64_t ticket, uint32_t shift) { return (uint32_t)((ticket * GOLDEN) >> shift); }

static struct record *find(struct ls_tickets *t, uint64_t ticket)
{
    uint32_t mask = t->cap - 1;
    for (uint32_t i = home(ticket, t->shift);; i = (i + 1) & mask) {
        if (t->slots[i].state == SLOT_EMPTY)
            return NULL;
        if (t->slots[i].ticket == ticket)
            return &t->slots[i];
    }
}

static void place(struct record *slots, uint32_t cap, uint32_t shift, struct record record)
{
    uint32_t mask = cap - 1;
    uint32_t i = home(record.ticket, shift);
    while (slots[i].state != SLOT_EMPTY)
        i = (i + 1) & mask;
    slots[i] = record;
}

/* Room for one more record (growing the table when it would be over half full): 0 or -ENOMEM. */
static int make_room(struct ls_tickets *t)
{
    if ((t->used + 1) * 2 <= t->cap)
        return 0;
    if (t->cap > UINT32_MAX / 4)
        return -ENOMEM;
    struct record *bigger = calloc((size_t)t->cap * 2, sizeof *bigger);
    if (bigger == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->slots[i].state != SLOT_EMPTY)
            place(bigger, t->cap * 2, t->shift - 1, t->slots[i]);
    free(t->slots);
    t->slots = bigger;
    t->cap *= 2;
    t->shift--;
    return 0;
}

static void add_pending(struct ls_tickets *t, uint64_t ticket)
{
    place(t->slots, t->cap, t->shift, (struct record){.ticket = ticket, .state = SLOT_PENDING});
    t->used++;
    t->pending++;
}

static void remove_record(struct ls_tickets *t, struct record *record)
{
    uint32_t mask = t->cap - 1;
    uint32_t hole = (uint32_t)(record - t->slots);
    if (record->state == SLOT_PENDING)
        t->pending--;
    t->used--;
    for (uint32_t j = (hole + 1) & mask; t->slots[j].state != SLOT_EMPTY; j = (j + 1) & mask) {
        uint32_t at = home(t->slots[j].ticket, t->shift);
        /* The entry at j may fill the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (at > hole && at <= j) : (at > hole || at <= j);
        if (!stays) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].state = SLOT_EMPTY;
}

/* A pending record reaches its outcome (an orphan's goes unread). */
static void finish(struct ls_tickets *t, struct record *record, int32_t status, uint64_t device_ns)
{
    if (record->marks & MARK_ORPHAN) {
        remove_record(t, record);
        return;
    }
    record->state = SLOT_DONE;
    record->marks = 0;
    record->status = status;
    record->device_ns = device_ns;
    t->pending--;
}

static void file(struct ls_tickets *t, const struct ls_cqe *cqe)
{
    if (cqe->status == -LS_ECANCELED)
        t->cancelled++;
    struct record *record = find(t, cqe->ticket);
    if (record == NULL || record->state != SLOT_PENDING)
        return;                         /* not ours, or answered twice: the arbiter is untrusted */
    if (cqe->status == -LS_EMOVED)      /* not run: the reattach sends it to the new arbiter */
        record->marks |= MARK_MOVED;
    else
        finish(t, record, cqe->status, cqe->device_ns);
}

/* ------------------------------------------------------------------ the verbs */

int ls_tickets_new(ls_tickets **out)
{
    struct ls_tickets *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -ENOMEM;
    t->cap = 64;
    t->shift = 64 - 6;
    t->slots = calloc(t->cap, sizeof *t->slots);
    if (t->slots == NULL) {
        free(t);
        return -ENOMEM;
    }
    pthread_mutex_init(&t->lock, NULL);
    *out = t;
    return 0;
}

void ls_tickets_free(ls_tickets *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->slots);
    free(t);
}

int ls_tickets_push(ls_tickets *t, ls_producer *p, uint64_t ticket, uint32_t opcode, uint32_t program,
                    uint32_t groups_x, uint32_t groups_y, uint32_t groups_z, uint32_t nbuffers,
                    const uint32_t *buffers, uint32_t noffsets, const uint64_t *offsets, const void *push,
                    uint32_t push_size)
{
    pthread_mutex_lock(&t->lock);
    /* Room first: once pushed, the record must not fail (its completion may already be on the way). */
    int rc = make_room(t);
    if (rc == 0 && find(t, ticket) != NULL)
        rc = -EEXIST;
    if (rc == 0) {
        rc = ls_push_op(p, ticket, opcode, program, groups_x, groups_y, groups_z, nbuffers, buffers, noffsets,
                        offsets, push, push_size);
        if (rc == 1)
            add_pending(t, ticket);
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int ls_tickets_add(ls_tickets *t, uint64_t ticket)
{
    pthread_mutex_lock(&t->lock);
    int rc = make_room(t);
    if (rc == 0 && find(t, ticket) != NULL)
        rc = -EEXIST;
    if (rc == 0)
        add_pending(t, ticket);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int ls_tickets_collect(ls_tickets *t, ls_region *r)
{
    struct ls_cqe cqes[CQE_BATCH];
    int total = 0, n;
    do {
        n = ls_cq_pop(r, (char *)cqes, CQE_BATCH);
        if (n < 0)
            return n;
        pthread_mutex_lock(&t->lock);
        for (int i = 0; i < n; i++)
            file(t, &cqes[i]);
        pthread_mutex_unlock(&t->lock);
        total += n;
    } while (n == CQE_BATCH);
    return total;
}

int ls_tickets_state(ls_tickets *t, uint64_t ticket)
{
    pthread_mutex_lock(&t->lock);
    struct record *record = ticket ? find(t, ticket) : NULL;
    int state = ticket == 0 ? (t->pending ? LS_TICKET_PENDING : LS_TICKET_NONE)
                            : record == NULL ? LS_TICKET_NONE
                            : record->state == SLOT_DONE ? LS_TICKET_DONE : LS_TICKET_PENDING;
    pthread_mutex_unlock(&t->lock);
    return state;
}

int ls_tickets_wait(ls_tickets *t, ls_region *r, uint64_t ticket, int64_t spin_ns, int64_t timeout_ns,
                    int32_t *status, uint64_t *device_ns)
{
    int rc = ls_tickets_collect(t, r);
    if (rc >= 0 && ls_tickets_state(t, ticket) == LS_TICKET_PENDING) {
        rc = ls_cq_wait(r, 1, spin_ns, timeout_ns);
        if (rc >= 0 || rc == -ETIMEDOUT)
            rc = ls_tickets_collect(t, r);
    }
    if (rc < 0)
        return rc;
    return status && ticket ? ls_tickets_take(t, ticket, status, device_ns) : ls_tickets_state(t, ticket);
}

int ls_tickets_take(ls_tickets *t, uint64_t ticket, int32_t *status, uint64_t *device_ns)
{
    pthread_mutex_lock(&t->lock);
    struct record *record = find(t, ticket);
    int state = record == NULL ? LS_TICKET_NONE : record->state == SLOT_DONE ? LS_TICKET_DONE : LS_TICKET_PENDING;
    if (state == LS_TICKET_DONE) {
        if (status)
            *status = record->status;
        if (device_ns)
            *device_ns = record->device_ns;
        remove_record(t, record);
    }
    pthread_mutex_unlock(&t->lock);
    return state;
}

void ls_tickets_forget(ls_tickets *t, const uint64_t *tickets, uint32_t count)
{
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < count; i++) {
        struct record *record = find(t, tickets[i]);
        if (record != NULL && record->state == SLOT_DONE)
            remove_record(t, record);
        else if (record != NULL)
            record->marks |= MARK_ORPHAN;
    }
    pthread_mutex_unlock(&t->lock);
}

int ls_tickets_settle(ls_tickets *t, uint64_t ticket, int32_t status, uint64_t device_ns)
{
    pthread_mutex_lock(&t->lock);
    struct record *record = find(t, ticket);
    int pending = record != NULL && record->state == SLOT_PENDING;
    if (pending)
        file(t, &(struct ls_cqe){.ticket = ticket, .status = status, .device_ns = device_ns});
    pthread_mutex_unlock(&t->lock);
    return pending;
}

uint32_t ls_tickets_fail_pending(ls_tickets *t, int32_t status)
{
    pthread_mutex_lock(&t->lock);
    uint32_t failed = t->pending;
    for (uint32_t i = 0; i < t->cap && t->pending;) {
        struct record *record = &t->slots[i];
        if (record->state == SLOT_PENDING && !(record->marks & MARK_ORPHAN)) {
            finish(t, record, status, 0);
        } else if (record->state == SLOT_PENDING) {
            remove_record(t, record);   /* (an entry may shift into slot i: look at it again) */
            continue;
        }
        i++;
    }
    pthread_mutex_unlock(&t->lock);
    return failed;
}

void ls_tickets_drop(ls_tickets *t, uint64_t ticket)
{
    pthread_mutex_lock(&t->lock);
    struct record *record = find(t, ticket);
    if (record != NULL)
        remove_record(t, record);
    pthread_mutex_unlock(&t->lock);
}

int ls_tickets_list(ls_tickets *t, uint64_t *tickets, uint8_t *marks, uint32_t max)
{
    pthread_mutex_lock(&t->lock);
    uint32_t count = 0;
    for (uint32_t i = 0; i < t->cap; i++) {
        const struct record *record = &t->slots[i];
        if (record->state != SLOT_PENDING)
            continue;
        if (count < max) {
            tickets[count] = record->ticket;
            if (marks)
                marks[count] = (uint8_t)record->marks;
        }
        count++;
    }
    pthread_mutex_unlock(&t->lock);
    return (int)count;
}

void ls_tickets_resent(ls_tickets *t)
{
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->cap; i++)
        t->slots[i].marks &= (uint16_t)~MARK_MOVED;
    pthread_mutex_unlock(&t->lock);
}

uint32_t ls_tickets_pending(ls_tickets *t)
{
    pthread_mutex_lock(&t->lock);
    uint32_t pending = t->pending;
    pthread_mutex_unlock(&t->lock);
    return pending;
}

const uint64_t *ls_tickets_cancelled(ls_tickets *t) { return &t->cancelled; }
