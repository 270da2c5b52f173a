/*
 * The libshare ring: the data plane between a client and the arbiter.
 *
 * Design
 * ------
 * A region holds a *submission ring* and a *completion ring*, in one shared
 * mapping (the layout is in ring.h). The submission ring is many-producer,
 * one-consumer, as a set of single-producer *lanes*, one per producing thread
 * (lanes.c); the completion ring is single-producer, single-consumer
 * (completions.c); each side sleeps when it finds nothing and is woken by the
 * other (wake.c). region.h lists the files.
 *
 * Indexes are free-running uint32 counters masked at use: a ring is full when
 * tail - head == entries, the slot of position p is slots[p & mask].
 *
 * The consumer trusts nothing in the region. At open it validates the header
 * and copies the geometry into private memory; it never reads a size or
 * offset from shared memory again. It keeps its own copy of the indexes it
 * writes (each lane's head, the completion tail) and reads only the
 * peer-written index of each ring, rejecting a distance beyond the capacity as
 * corruption: sticky, the region is dead from then on, with the details in
 * ls_last_error (ring_fail).
 *
 * This file: the region's geometry, format, open and close.
 */
#include "region.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct ls_desc) == LS_DESC_SIZE, "descriptor is 256 bytes");
_Static_assert(sizeof(struct ls_cqe) == LS_CQE_SIZE, "completion is 32 bytes");
_Static_assert(sizeof(struct ls_region_header) == LS_HEADER_SIZE, "header is two cache lines");
_Static_assert(sizeof(struct ls_bells) == LS_BELLS_SIZE, "bells are two cache lines");
_Static_assert(sizeof(struct ls_lane) == 2 * LS_CACHELINE, "lane indexes are two cache lines");
_Static_assert(offsetof(struct ls_lane, head) == LS_CACHELINE, "head has its own cache line");
_Static_assert(sizeof(struct ls_cq) == 2 * LS_CACHELINE, "cq indexes are two cache lines");
_Static_assert(offsetof(struct ls_cq, head) == LS_CACHELINE, "cq head has its own cache line");

static int is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

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
     * of it would fault in every page, where a client that pushes from one thread touches one
     * lane's. */
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

int ring_fail(ls_region *r, int code, uint32_t lane, uint32_t head, uint32_t tail, uint32_t cap)
{
    r->err.code = code;
    r->err.lane = lane;
    r->err.head = head;
    r->err.tail = tail;
    r->err.capacity = cap;
    return code;
}
