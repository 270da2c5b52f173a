/*
 * The completion ring: one poster (the consumer, the arbiter), one reader (the client).
 *
 * Design
 * ------
 * The consumer posts a completion (struct ls_cqe) for every descriptor it
 * took, with plain copies into the slots and one store-release of the tail;
 * the client pops them with one store-release of the head. Each side keeps
 * its own index privately (cq_tail, cq_head in struct ls_region) and reads
 * only the other's from shared memory: a distance beyond the ring's capacity
 * is corruption, sticky as in ring.c.
 *
 * A post that publishes completions wakes the client's waiters that asked for
 * it (ring_notify_client, wake.c); a pop that frees slots wakes a consumer that
 * waits for room to answer in (ring_notify_consumer with LS_NEED_ROOM).
 *
 * A client does not read this ring's completions itself: its ticket book
 * (tickets.c) pushes through ls_push_op, files what ls_cq_pop returns and
 * sleeps in ls_cq_wait (wake.c), for the C API and the Python session alike.
 */
#include "region.h"

#include <string.h>

int ls_cq_space(ls_region *r)
{
    if (r->err.code)
        return r->err.code;
    /* Pairs with the client's store-release of head in ls_cq_pop. */
    uint32_t head = ls_load_acquire(&r->cq->head);
    uint32_t used = r->cq_tail - head;
    if (used > r->cq_entries)
        return ring_fail(r, -LS_ECORRUPT, LS_NO_LANE, head, r->cq_tail, r->cq_entries);
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
    if (n)
        ring_notify_client(r);
    return (int)n;
}

int ls_cq_ready(ls_region *r)
{
    if (r->err.code)
        return r->err.code;
    uint32_t tail = ls_load_acquire(&r->cq->tail);
    uint32_t ready = tail - r->cq_head;
    if (ready > r->cq_entries)
        return ring_fail(r, -LS_ECORRUPT, LS_NO_LANE, r->cq_head, tail, r->cq_entries);
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
        ring_notify_consumer(r, LS_NEED_ROOM);  /* a consumer waiting for room to answer in */
    return (int)n;
}
