/*
 * Each client's objects: its programs, buffers, command lists, bind groups and texel views, by the ids it
 * chose, in a table of its own.
 *
 * Lifetime. Every command holds a count on the program and buffers it names (hold_objects);
 * ls_engine_drop of an object still counted marks it, and the last retirement
 * queues LS_EV_RELEASED so that the control plane destroys it then. A drop
 * while descriptors that the client published before it still wait in its ring
 * waits for them to be popped (defer_drop), as the plan pops them, so that they
 * find the object (and for a command list that runs, and what was popped behind it: lists.c).
 *
 * Views. A texel view (LS_KIND_VIEW, ls_engine_put_view) is a VkBufferView over a range of one of
 * the client's buffers. It holds that buffer as a command does (one count of in_flight, from its
 * put until it is freed), so a buffer is never destroyed under a view, nor under a command that
 * names only the view: its LS_EV_RELEASED follows the view's. The control plane drops a buffer's
 * views before the buffer (drain/drainer.py); a descriptor that names a view whose buffer was
 * dropped all the same is refused (check_desc).
 *
 * The table. Open addressing, keyed by (kind, id), with linear probes. A removed slot holds the
 * table's own address (a tombstone), so probes go on past it. Live entries and tombstones together
 * never fill more than half the slots, so every probe ends at an empty one. When they would,
 * the table is rebuilt without its tombstones at the size its live entries need: a client that
 * allocates and frees for ever keeps a table of constant size.
 *
 * The ids are the client's to choose (a reattaching session names them, any increasing ids up
 * to 2^31), so the hash is keyed: each rebuild draws two random words, and the id passes through
 * murmur3's finaliser twice with a word mixed in before each. Unkeyed, a client that inverts
 * the finaliser can pick 4,096 ids of one probe run, and every lookup of its dispatches walks it
 * (the engine's CPU per descriptor goes from 3.7 to 28 us, for every client). A put that still
 * probes past PROBE_LIMIT draws new words and rebuilds.
 */
#include "internal.h"

#include <sys/random.h>

#define PROBE_LIMIT 64

/* ------------------------------------------------------------------ the table */

static uint32_t fmix32(uint32_t h)
{
    h ^= h >> 16, h *= 0x85ebca6bu;
    h ^= h >> 13, h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

static uint32_t hash_key(const struct table *t, uint32_t kind, uint32_t id)
{
    return fmix32(fmix32(id ^ t->key[0]) ^ t->key[1] ^ kind);
}

/* The slot that holds (kind, id), or NULL. */
struct object **table_find(struct table *t, uint32_t kind, uint32_t id)
{
    if (!t->cap)
        return NULL;
    for (uint32_t i = hash_key(t, kind, id) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        struct object *o = t->slots[i];
        if (!o)
            return NULL;
        if (is_taken(t, o) && o->id == id && o->kind == kind)
            return &t->slots[i];
    }
}

/* Where o goes: the first free slot (or tombstone) of its probe run; *probes: the slots looked at. */
static uint32_t table_slot(const struct table *t, const struct object *o, uint32_t *probes)
{
    uint32_t i = hash_key(t, o->kind, o->id) & (t->cap - 1);
    for (*probes = 1; is_taken(t, t->slots[i]); ++*probes)
        i = (i + 1) & (t->cap - 1);
    return i;
}

/* Rebuild with room for live entries to double before the next rebuild, tombstones gone, and a
 * new key. */
static int table_rebuild(struct table *t, uint32_t live)
{
    uint32_t cap = 16, probes;
    while (cap < 4 * live)
        cap *= 2;
    struct object **old = t->slots, **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -ENOMEM;
    uint32_t old_cap = t->cap;
    if (getrandom(t->key, sizeof t->key, 0) != sizeof t->key)
        t->key[0] += 0x9e3779b9u, t->key[1] ^= (uint32_t)ls_now_ns();  /* no entropy: a new key all the same */
    t->slots = slots, t->cap = cap, t->used = t->live = 0;
    for (uint32_t k = 0; k < old_cap; k++) {
        if (!is_taken(t, old[k]))
            continue;
        slots[table_slot(t, old[k], &probes)] = old[k];
        t->used++, t->live++;
    }
    free(old);
    return 0;
}

/* Add o, whose (kind, id) the table does not hold. */
int table_put(struct table *t, struct object *o)
{
    if (2 * (t->used + 1) > t->cap) {
        int rc = table_rebuild(t, t->live + 1);
        if (rc < 0)
            return rc;
    }
    uint32_t probes, i = table_slot(t, o, &probes);
    if (probes > PROBE_LIMIT && table_rebuild(t, t->live + 1) == 0)
        i = table_slot(t, o, &probes);
    t->longest = probes > t->longest ? probes : t->longest;
    t->used += !t->slots[i];            /* a tombstone reused was counted already */
    t->live++;
    t->slots[i] = o;
    return 0;
}

static void table_remove(struct table *t, struct object **slot)
{
    *slot = (struct object *)t;
    t->live--;
}

/* Free o, and let go of the buffer a view holds: the last hold of a freed buffer destroys it too. */
static void free_object(ls_engine *e, struct object *o)
{
    struct object *of = o->of;
    free(o);
    if (of)
        release(e, of);
}

/* Free the objects of table t, of client slot being removed, and the table's slots; one that
 * work still names (a stopped engine's abandoned work) is marked freed and leaked, never freed.
 * Idle views go first, so that their buffers are idle too (a buffer out of the table, held by
 * a view only, goes with it). */
void free_objects(struct table *t, uint32_t slot)
{
    for (int views = 1; views >= 0; views--)
        for (uint32_t i = 0; i < t->cap; i++) {
            struct object *o = t->slots[i];
            if (!is_taken(t, o) || (o->kind == LS_KIND_VIEW) != views)
                continue;
            t->slots[i] = NULL;
            if (o->in_flight) {
                o->freed = 1, o->client = slot;  /* abandoned work still names it: leak, never free */
            } else if (o->of) {
                struct object *of = o->of;
                free(o);
                if (--of->in_flight == 0 && of->freed)
                    free(of);
            } else {
                free(o);
            }
        }
    free(t->slots);
}

/* ------------------------------------------------------------------ holds and drops */

/* Put n objects in held[], each counted in use until a release() of it (a command or a cut holds them). */
void hold_objects(struct object **held, struct object *const *objects, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        held[i] = objects[i];
        objects[i]->in_flight++;
    }
}

/* Count one hold of o off; the last one of an object the client has freed destroys it (LS_EV_RELEASED). */
void release(ls_engine *e, struct object *o)
{
    if (--o->in_flight == 0 && o->freed) {
        emit(e, LS_EV_RELEASED, o->client, 0, o->kind, o->id, 0);
        free_object(e, o);
    }
}

/* Forget object (kind, id) of client slot: destroyed now (0) or by its last command's
 * retirement (1: LS_EV_RELEASED then); with emit_idle, one that is idle is announced by
 * LS_EV_RELEASED too (a deferred drop, whose caller was told 1 long ago). -ENOENT if unknown. */
static int drop_now(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id, int emit_idle)
{
    struct client *c = &e->clients[slot];
    struct object **found = table_find(&c->objects, kind, id);
    if (!found)
        return -ENOENT;
    struct object *o = *found;
    table_remove(&c->objects, found);
    forget_recordings(e, c, o);
    if (o->in_flight) {
        o->freed = 1;
        return 1;
    }
    if (emit_idle)
        emit(e, LS_EV_RELEASED, slot, 0, kind, id, 0);
    free_object(e, o);
    return 0;
}

/* Carry out the drops of client slot whose descriptors published before the free are all
 * popped now (all of them, once it closes: nothing more is popped then). */
void settle_drops(ls_engine *e, uint32_t slot)
{
    struct client *c = &e->clients[slot];
    for (struct pending_drop **p = &c->drops; *p;) {
        struct pending_drop *d = *p;
        if (!c->closing && c->region && (c->run.list || c->nafter || !ls_sq_passed(c->region, d->marks, d->nmarks))) {
            p = &d->next;
            continue;
        }
        *p = d->next;
        drop_now(e, slot, d->kind, d->id, 1);
        free(d);
    }
}

/* A drop waits, the object still in the table, while descriptors that the client published
 * before it wait in its ring: they were pushed before the free and must still find the object.
 * (Popped and submitted at once instead, whatever the plan says, they would let a low client
 * that sends a free, even a refused one, after queueing heavy work make a realtime client's
 * round trip take hundreds of milliseconds, the length of that work.) Descriptors it
 * publishes after the free may find the object too, until the drop is carried out: the client's
 * own object, which still counts against its limits (Client.held). */
int defer_drop(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id)
{
    struct client *c = &e->clients[slot];
    if (c->closing || !c->region || (!c->run.list && !c->nafter && ls_sq_pending(c->region) <= 0))
        /* (a corrupt ring: dropped at the next look; a list and what waits behind it: lists.c) */
        return drop_now(e, slot, kind, id, 0);
    struct pending_drop *d = malloc(sizeof *d + LS_MAX_LANES * sizeof(uint32_t));
    int lanes = d ? ls_sq_marks(c->region, d->marks, LS_MAX_LANES) : -ENOMEM;
    if (lanes < 0) {
        free(d);
        return drop_now(e, slot, kind, id, 0);
    }
    d->kind = kind, d->id = id, d->nmarks = (uint32_t)lanes;
    d->next = c->drops;
    c->drops = d;
    return 1;
}
