/*
 * Recordings. Each client's descriptors are recorded once per distinct content
 * (everything but the ticket): bind, push descriptors (a buffer's range, or a texel view's
 * VkBufferView), push constants, dispatch, copy, fill or update, and one barrier, into a secondary
 * command buffer with
 * SIMULTANEOUS_USE (so several submissions may run it at once), cached by a hash
 * of the content in the client's table of at most CACHE_MAX, least recently used
 * first out (never one still in flight: past CACHE_MAX with all in flight, a
 * recording is made for the one use). check_desc (validate.c) runs on every
 * descriptor all the same; a hit only saves the recording. Lavapipe copies every
 * recorded command into allocations of its own, freed at the next reset (10 or so
 * mallocs and frees per dispatch): popping, checking, recording and submitting take
 * 0.8 us of the engine's time per tiny dispatch, 0.2 us with hits. A recording names
 * its client's objects by the ids of its key, and ls_engine_drop (and removing
 * the client) forgets every recording that names the object, before its handle
 * can be destroyed; one still in flight is reused only once it retires.
 *
 * A dispatch through a bind group (validate.c) has the group's id as its key's only
 * buffer id, but its recording binds the group's buffers: its objects are every
 * buffer the group named when it was recorded, the group and the program (the
 * users check_desc found), so dropping any of them, the group's buffers included,
 * forgets it. A group's entries never change under its id (a new group is a new
 * object, and a dropped one forgets its recordings), so a hit binds what the
 * group names now: the key's ids name the same objects for as long as the
 * recording lives, through a group as directly.
 *
 * A piece of a dispatch run in pieces (policy/engine_policy.c, "Pieces") is recorded
 * on its own, uncached, with vkCmdDispatchBase over its slice of the workgroups.
 *
 * Fills and updates record vkCmdFillBuffer and vkCmdUpdateBuffer (its bytes are the
 * descriptor's push[], copied into the recording, so a cached one replays the same bytes).
 * A barrier records nothing: every recording ends with record_barrier, so the commands of a
 * list and the descriptors of a session are already ordered and visible as across a barrier.
 *
 * Indirect dispatches. An LS_OP_DISPATCH_INDIRECT's group counts are in a client buffer when
 * it runs, maybe written by the command before it, so they are clamped on the device: its
 * recording runs the engine's clamp program (shaders/indirect_clamp.comp, one workgroup; its
 * pipeline is made by the device side and handed over as clamp_pipeline) over the client's
 * three counts, which writes them, or (0, 0, 0) and a verdict of 1 when one is past the
 * device's limit (max_groups) or their product past 2^32 - 1 (lavapipe counts workgroups in 32
 * bits: see check_desc), into a slot of the engine's own; then a barrier (shader write ->
 * indirect command read), the client's bindings and push constants, vkCmdDispatchIndirect
 * from that slot, and the usual barrier. The slot is the entry's own: 16 bytes at
 * SCRATCH_OFFSET + 16 * k of the mapped results buffer of the flight whose entry k runs it
 * (flights.c), never bound to a client's program (only the clamp program writes it and only
 * vkCmdDispatchIndirect reads it), and used again only once that flight has retired, so no
 * client reads, writes or observes another's counts. Since the slot belongs to a flight's
 * entry, an indirect dispatch's recording is made for that one entry, uncached (as a piece's
 * is): no two executions of one recording ever share a slot (SIMULTANEOUS_USE never applies
 * to one), and within the recording the clamp's write comes before the indirect read by its
 * barrier. (Counts alone would survive a shared slot: there is one queue, and every recording
 * ends with record_barrier, whose first scope holds the compute stage and the indirect read
 * before it, so one execution's read ends before the next one's clamp writes. Its verdict
 * would not: read as the flight retires, a shared slot holds the last execution's, so a
 * refused dispatch beside an accepted one would answer wrongly; test_indirect.py performs
 * that.) As the flight retires (retire_head) a verdict of 1 answers the command
 * LS_EGROUPS, having dispatched nothing; counts of 0 dispatch nothing and succeed (Vulkan's
 * rule). An indirect dispatch never runs in pieces (its size is unknown when it is recorded:
 * pieces_for takes only LS_OP_DISPATCH) but runs under the watchdog like any command.
 *
 * Timestamps. An LS_OP_TIMESTAMP records, into a query of the engine's own, vkCmdResetQueryPool,
 * vkCmdWriteTimestamp at BOTTOM_OF_PIPE (its first scope: every command before it in the queue,
 * which has ended when the stamp is written) and vkCmdCopyQueryPoolResults (64-bit, WAIT,
 * WITH_AVAILABILITY: the stamp and a 1 at offset[0] and offset[0] + 8 of the client's buffer, a
 * transfer write ordered after the commands before it by their record_barrier, whose second
 * scope holds transfer writes), then the usual barrier, which makes the copy seen by the
 * commands after it and by the host. The query is the entry's own, as an indirect dispatch's
 * slot is: STAMP_QUERY(k) of the query pool of the flight whose entry k runs it (flights.c, a
 * query per entry past those that time the entries), reset in the recording and used again only
 * once that flight has retired; so a timestamp's recording is made for its one entry, uncached,
 * and no client's stamp is ever another's. A flight without a pool answers it LS_EFAULT; a
 * device whose queue has no timestamps refuses it (check_desc: LS_EUNSUPPORTED).
 */
#include "internal.h"

#define CACHE_MAX 64                    /* recordings a client keeps */
#define CACHE_BUCKETS 128

/* Put an unused recording (out of every table, in no flight) on the spare list: re-recorded next. */
static void spare_recording(ls_engine *e, struct recording *r)
{
    r->next = e->spare;
    e->spare = r;
}

/* A flight entry that ran r has retired: an uncached recording no entry runs is spare. */
void unuse(ls_engine *e, struct recording *r)
{
    if (--r->uses == 0 && !r->cached)
        spare_recording(e, r);
}

/* The barrier after every command: its writes are seen by the next command's reads and writes, and by the
 * host. */
static void record_barrier(ls_engine *e, VkCommandBuffer cb)
{
    VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL,
                               VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                               VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                                   VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT};
    VkPipelineStageFlags work = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    e->vk.CmdPipelineBarrier(cb, work, work | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier, 0, NULL, 0, NULL);
}

/* Bind dispatch d's program, buffers and push constants. buffers[]: the program's bindings, then d's
 * group when it names one (validate.c). */
static void record_bindings(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object *program,
                            struct object **buffers)
{
    e->vk.CmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipeline)program->handle);
    uint32_t n = program->bindings;
    if (n) {
        const struct group_entry *group = d->flags & LS_DESC_GROUP ? group_entries(buffers[n]) : NULL;
        VkDescriptorBufferInfo infos[LS_ENGINE_MAX_BINDINGS];
        VkBufferView views[LS_ENGINE_MAX_BINDINGS];
        VkWriteDescriptorSet writes[LS_ENGINE_MAX_BINDINGS];
        uint32_t nwrites = 0;
        for (uint32_t k = 0; k < n; k++) {  /* the range: the group's, else to the buffer's end, at most the limit */
            int uniform = program->uniform_mask >> k & 1, texel = program->texel_mask >> k & 1;
            VkDescriptorType type = texel ? (uniform ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
                                                     : VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER)
                                          : uniform ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                                                    : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            if (texel) {                /* a texel buffer: the view, with its own range (validate.c) */
                views[k] = (VkBufferView)buffers[k]->handle;
            } else {
                uint64_t offset = group ? group[k].offset : d->offset[k];
                uint64_t range = group && group[k].range ? group[k].range : buffers[k]->size - offset;
                uint64_t most = uniform ? e->cfg.max_uniform_range : e->cfg.max_storage_range;
                infos[k] = (VkDescriptorBufferInfo){(VkBuffer)buffers[k]->handle, offset, range < most ? range : most};
            }
            if (k && program->array_mask >> k & 1) {   /* the next element of the array: one write for all */
                writes[nwrites - 1].descriptorCount++;
                continue;
            }
            writes[nwrites] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, VK_NULL_HANDLE,
                                                     nwrites, 0, 1, type, NULL, texel ? NULL : &infos[k],
                                                     texel ? &views[k] : NULL};
            nwrites++;
        }
        e->vk.CmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipelineLayout)program->layout, 0,
                                      nwrites, writes);
    }
    if (program->push_size) {
        /* Every byte the program declares, zeros past the client's own: push constants keep what the last
         * push left, and a kernel reading bytes its dispatch did not push would read another client's. */
        uint8_t push[LS_MAX_PUSH] = {0};
        memcpy(push, d->push, d->push_size);
        e->vk.CmdPushConstants(cb, (VkPipelineLayout)program->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                               program->push_size, push);
    }
}

/* Record dispatch d from its first workgroup (0, or its own base: LS_DESC_BASE); with base, only its groups
 * base..base+count-1 past that (a piece: engine_policy.c, "Pieces"). */
static void record_dispatch(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object *program,
                            struct object **buffers, const uint32_t *base, const uint32_t *count)
{
    uint32_t first[3];
    record_bindings(e, cb, d, program, buffers);
    for (int k = 0; k < 3; k++)
        first[k] = dispatch_base(d, k) + (base ? base[k] : 0);
    if (base || (d->flags & LS_DESC_BASE))
        e->vk.CmdDispatchBase(cb, first[0], first[1], first[2], base ? count[0] : d->groups[0],
                              base ? count[1] : d->groups[1], base ? count[2] : d->groups[2]);
    else
        e->vk.CmdDispatch(cb, d->groups[0], d->groups[1], d->groups[2]);
}

/* Record copy, fill or update d (a barrier records nothing: every recording ends with one). */
static void record_transfer(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object **buffers)
{
    VkBuffer first = (VkBuffer)buffers[0]->handle;
    if (d->opcode == LS_OP_COPY) {
        VkBufferCopy region = {d->offset[0], d->offset[1], d->offset[2]};
        e->vk.CmdCopyBuffer(cb, first, (VkBuffer)buffers[1]->handle, 1, &region);
    } else if (d->opcode == LS_OP_FILL) {
        uint32_t value;
        memcpy(&value, d->push, sizeof value);
        e->vk.CmdFillBuffer(cb, first, d->offset[0], d->offset[1], value);
    } else if (d->opcode == LS_OP_UPDATE) {
        e->vk.CmdUpdateBuffer(cb, first, d->offset[0], d->push_size, d->push);
    }
}

/* Record the clamp of indirect dispatch d's counts (in buffer counts) into slot k of flight f's results,
 * and the barrier that makes them the indirect read's ("Indirect dispatches" above). */
static void record_clamp(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object *counts,
                         const struct flight *f, uint32_t k)
{
    uint64_t at = d->groups[1] | (uint64_t)d->groups[2] << 32;
    uint64_t base = at - at % e->cfg.offset_alignment, range = counts->size - base;
    VkDescriptorBufferInfo infos[2] = {
        {(VkBuffer)counts->handle, base, range < e->cfg.max_storage_range ? range : e->cfg.max_storage_range},
        {f->results, SCRATCH_OFFSET, SCRATCH_SIZE}};
    VkWriteDescriptorSet writes[2];
    for (uint32_t b = 0; b < 2; b++)
        writes[b] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, NULL, VK_NULL_HANDLE, b, 0, 1,
                                           VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, NULL, &infos[b], NULL};
    uint32_t push[5] = {(uint32_t)((at - base) / 4), k, e->cfg.max_groups[0], e->cfg.max_groups[1],
                        e->cfg.max_groups[2]};
    VkPipelineLayout layout = (VkPipelineLayout)e->cfg.clamp_layout;
    e->vk.CmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipeline)e->cfg.clamp_pipeline);
    e->vk.CmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 2, writes);
    e->vk.CmdPushConstants(cb, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, push);
    e->vk.CmdDispatch(cb, 1, 1, 1);
    VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_SHADER_WRITE_BIT,
                               VK_ACCESS_INDIRECT_COMMAND_READ_BIT};
    e->vk.CmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, 0, 1,
                             &barrier, 0, NULL, 0, NULL);
}

/* Record timestamp d into entry k of flight f's own query and from there into buffer stamps: the stamp
 * once every command before it has ended, copied with its availability ("Timestamps" above). */
static void record_stamp(ls_engine *e, VkCommandBuffer cb, const struct ls_desc *d, struct object *stamps,
                         const struct flight *f, uint32_t k)
{
    e->vk.CmdResetQueryPool(cb, f->queries, STAMP_QUERY(k), 1);
    e->vk.CmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, f->queries, STAMP_QUERY(k));
    e->vk.CmdCopyQueryPoolResults(cb, f->queries, STAMP_QUERY(k), 1, (VkBuffer)stamps->handle, d->offset[0], 16,
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT |
                                      VK_QUERY_RESULT_WITH_AVAILABILITY_BIT);
}

/* The descriptor's content past its ticket, hashed a word at a time. */
static uint64_t hash_desc(const struct ls_desc *d)
{
    const unsigned char *p = (const unsigned char *)d + sizeof d->ticket;
    uint64_t h = 0x9e3779b97f4a7c15ull, w;
    for (size_t k = 0; k + 8 <= sizeof *d - sizeof d->ticket; k += 8) {
        memcpy(&w, p + k, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 32);
}

/* Take r out of client c's cache (onto the spare list once no flight runs it). */
static void unlink_recording(ls_engine *e, struct client *c, struct recording *r)
{
    struct recording **at = &c->buckets[r->hash % CACHE_BUCKETS];
    while (*at != r)
        at = &(*at)->next;
    *at = r->next;
    c->nrecordings--;
    r->cached = 0;
    if (!r->uses)
        spare_recording(e, r);
}

/* Forget every recording of client c that names object o (every one, with o NULL): its
 * handles are about to be destroyed. One still run by a flight is spare once it retires. */
void forget_recordings(ls_engine *e, struct client *c, const struct object *o)
{
    for (uint32_t b = 0; c->buckets && b < CACHE_BUCKETS; b++)
        for (struct recording *r = c->buckets[b], *next; r; r = next) {
            next = r->next;
            int names = !o;
            for (uint32_t k = 0; k < r->nobjects && !names; k++)
                names = r->objects[k] == o;
            if (names)
                unlink_recording(e, c, r);
        }
}

/* A recording to reuse: spare, new, or (the client's cache full) its least recently used idle one. */
static struct recording *free_recording(ls_engine *e, struct client *c)
{
    if (c->nrecordings >= CACHE_MAX) {
        struct recording *oldest = NULL;
        for (uint32_t b = 0; b < CACHE_BUCKETS; b++)
            for (struct recording *r = c->buckets[b]; r; r = r->next)
                if (!r->uses && (!oldest || r->last < oldest->last))
                    oldest = r;
        if (oldest)
            unlink_recording(e, c, oldest);   /* idle: onto the spare list, taken below */
    }
    struct recording *r = e->spare;
    if (r) {
        e->spare = r->next;
        return r;
    }
    r = calloc(1, sizeof *r);
    VkCommandBufferAllocateInfo info = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, e->pool,
                                        VK_COMMAND_BUFFER_LEVEL_SECONDARY, 1};
    if (r && e->vk.AllocateCommandBuffers(e->device, &info, &r->cb) != VK_SUCCESS) {
        free(r);
        r = NULL;
    }
    return r;
}

/* A new recording, uncached, of checked descriptor d of client c (with base and count, of those groups
 * of the dispatch only; an indirect dispatch's for entry k of flight f); NULL when Vulkan cannot record it. */
static struct recording *record_in(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                                   uint32_t nusers, const uint32_t *base, const uint32_t *count,
                                   const struct flight *f, uint32_t k)
{
    struct recording *r = free_recording(e, c);
    if (!r)
        return NULL;
    VkCommandBufferInheritanceInfo inherit = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
    VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                      VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, &inherit};
    if (e->vk.BeginCommandBuffer(r->cb, &begin) != VK_SUCCESS) {   /* resets it (the pool allows) */
        spare_recording(e, r);
        return NULL;
    }
    if (d->opcode == LS_OP_DISPATCH) {
        record_dispatch(e, r->cb, d, users[nusers - 1], users, base, count);
    } else if (d->opcode == LS_OP_DISPATCH_INDIRECT) {
        record_clamp(e, r->cb, d, users[nusers - 2], f, k);
        record_bindings(e, r->cb, d, users[nusers - 1], users);
        e->vk.CmdDispatchIndirect(r->cb, f->results, SCRATCH_OFFSET + 16 * (uint64_t)k);
    } else if (d->opcode == LS_OP_TIMESTAMP) {
        record_stamp(e, r->cb, d, users[0], f, k);
    } else {
        record_transfer(e, r->cb, d, users);
    }
    record_barrier(e, r->cb);
    if (e->vk.EndCommandBuffer(r->cb) != VK_SUCCESS) {
        spare_recording(e, r);
        return NULL;
    }
    r->uses = 0;
    r->cached = 0;
    r->nobjects = nusers;
    memcpy(r->objects, users, nusers * sizeof *users);
    return r;
}

struct recording *record(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                         uint32_t nusers, const uint32_t *base, const uint32_t *count)
{
    return record_in(e, c, d, users, nusers, base, count, NULL, 0);
}

/*
 * The recording of a checked descriptor d of client c, whose objects check_desc put in users[]:
 * the cached one with the same content, or a new one (cached unless every recording the client
 * has is in flight). NULL when Vulkan cannot record it. Lookups are by content within the
 * client, whose ids name the same objects for as long as a recording lives (forget_recordings).
 */
struct recording *recording_for(ls_engine *e, struct client *c, const struct ls_desc *d,
                                struct object **users, uint32_t nusers)
{
    struct ls_desc key = *d;
    key.ticket = 0;
    uint64_t hash = hash_desc(&key);
    e->lookups++;
    if (!c->buckets && !(c->buckets = calloc(CACHE_BUCKETS, sizeof *c->buckets)))
        return NULL;
    for (struct recording *r = c->buckets[hash % CACHE_BUCKETS]; r; r = r->next)
        if (r->hash == hash && !memcmp(&r->key, &key, sizeof key)) {
            r->last = e->lookups;
            return r;
        }
    struct recording *r = record(e, c, d, users, nusers, NULL, NULL);
    if (!r)
        return NULL;
    r->key = key;
    r->hash = hash;
    r->last = e->lookups;
    r->cached = c->nrecordings < CACHE_MAX;
    if (r->cached) {
        struct recording **bucket = &c->buckets[hash % CACHE_BUCKETS];
        r->next = *bucket, *bucket = r;
        c->nrecordings++;
    }
    return r;
}

/* The recording of checked descriptor d of client c for the next entry of flight f: an indirect dispatch's
 * or a timestamp's own, made for that entry (its counts' slot, or its query, is the entry's: "Indirect
 * dispatches" and "Timestamps" above; NULL without the clamp program or f's mapped results buffer, or
 * without f's query pool), else recording_for's. */
struct recording *recording_in(ls_engine *e, struct client *c, const struct ls_desc *d, struct object **users,
                               uint32_t nusers, struct flight *f)
{
    if (d->opcode == LS_OP_TIMESTAMP)
        return f->queries ? record_in(e, c, d, users, nusers, NULL, NULL, f, f->count) : NULL;
    if (d->opcode != LS_OP_DISPATCH_INDIRECT)
        return recording_for(e, c, d, users, nusers);
    if (!e->cfg.clamp_pipeline || !f->stamps)
        return NULL;
    return record_in(e, c, d, users, nusers, NULL, NULL, f, f->count);
}
