/*
 * Flights: the engine's submissions to the device. NFLIGHT slots form a ring: head ..
 * head + nflights - 1 are submitted, in order, and the slot after them is the open flight,
 * taking the entries of a pass (at most LS_ENGINE_MAX_BATCH) until it is submitted: one
 * primary command buffer that runs the entries' recordings (vkCmdExecuteCommands) and one
 * fence. A timed flight (policy.timed, on a queue with timestamps) writes a timestamp
 * before its first recording and after each, into a mapped buffer, which is each command's
 * device time (queries 0 .. LS_ENGINE_MAX_BATCH of its pool; the rest, one per entry, are the
 * LS_OP_TIMESTAMP commands' own: recordings.c, "Timestamps"). A timestamp after a recording is
 * written at the bottom of the pipe (once the commands before it have ended), or, on a device
 * that ends each command before it begins the next (cfg.stamp_at_top: lavapipe, which flushes
 * before a timestamp at any other stage, about 2 us a command), at the top, the same moment
 * there. A batch also carries a progress word that the device bumps after each command, the
 * watchdog's measure of it (check_watchdog). The same mapped buffer holds a 16-byte slot per
 * entry for an indirect dispatch's clamped counts and verdict (recordings.c, "Indirect
 * dispatches"): retiring reads the verdict, and a refused count answers LS_EGROUPS. Retiring
 * the head flight answers its entries (answers.c) and releases what they held.
 */
#include "internal.h"

/* ------------------------------------------------------------------ submitting */

/* The flight taking entries (opened on first use), or NULL when every slot is in flight. */
static struct flight *open_flight(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return NULL;
    struct flight *f = flight_at(e, e->nflights);
    if (!f->open) {
        f->open = 1;
        f->urgent = 0;
        f->opened = ls_now_ns();
        f->count = 0;
        f->reported = 0;
        f->head_since = 0;
        f->progress_seen = 0;
        f->progress_at = 0;
        f->timed = e->policy.timed && e->cfg.timestamp_mask && f->queries;
        f->rank = e->pass_rank;
    }
    return f;
}

/* Whether flight f carries progress marks: a batch, with the mapped word to mark. */
static int marked_batch(const struct flight *f) { return f->progress && f->count > 1; }

/* Have the device write ``ended`` into flight f's progress word, after the command before it (each
 * recording ends with a barrier whose second scope holds transfers, and the next one's makes the
 * write visible to the host): the watchdog's measure of a batch, see check_watchdog. */
static void mark_progress(ls_engine *e, struct flight *f, uint32_t ended)
{
    e->vk.CmdFillBuffer(f->cb, f->results, PROGRESS_OFFSET, sizeof(uint32_t), ended);
}

/* Submit the open flight, if it holds work: 1 when it went to the device. A failed submission answers
 * its entries LS_EFAULT and says LS_EV_DEVICE. */
int submit(ls_engine *e)
{
    if (e->nflights >= NFLIGHT)
        return 0;
    struct flight *f = flight_at(e, e->nflights);
    if (!f->open)
        return 0;
    f->open = 0;
    if (!f->count)
        return 0;
    VkCommandBufferBeginInfo begin = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                      VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    VkResult result = e->vk.BeginCommandBuffer(f->cb, &begin);
    int marked = marked_batch(f);
    if (marked)
        *f->progress = 0;
    if (result == VK_SUCCESS && !f->timed && !marked) {
        e->vk.CmdExecuteCommands(f->cb, f->count, f->secondaries);  /* nothing goes between them */
    } else if (result == VK_SUCCESS) {  /* one recording at a time, each followed by its marks */
        if (f->timed) {  /* a timestamp before the first recording and after each */
            e->vk.CmdResetQueryPool(f->cb, f->queries, 0, LS_ENGINE_MAX_BATCH + 1);
            e->vk.CmdWriteTimestamp(f->cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, f->queries, 0);
        }
        for (uint32_t k = 0; k < f->count; k++) {
            e->vk.CmdExecuteCommands(f->cb, 1, &f->secondaries[k]);
            if (f->timed)
                e->vk.CmdWriteTimestamp(f->cb, e->cfg.stamp_at_top ? VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT
                                                                    : VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                        f->queries, k + 1);
            if (marked)
                mark_progress(e, f, k + 1);
        }
        if (f->timed) {
            e->vk.CmdCopyQueryPoolResults(f->cb, f->queries, 0, f->count + 1, f->results, 0, 8,
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
            VkMemoryBarrier barrier = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_TRANSFER_WRITE_BIT,
                                       VK_ACCESS_HOST_READ_BIT};
            e->vk.CmdPipelineBarrier(f->cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier,
                                     0, NULL, 0, NULL);
        }
    }
    if (result == VK_SUCCESS)
        result = e->vk.EndCommandBuffer(f->cb);
    if (result == VK_SUCCESS) {
        VkSubmitInfo info = {VK_STRUCTURE_TYPE_SUBMIT_INFO, NULL, 0, NULL, NULL, 1, &f->cb, 0, NULL};
        pthread_mutex_lock(&e->queue_lock);
        result = e->vk.QueueSubmit(e->queue, 1, &info, f->fence);
        pthread_mutex_unlock(&e->queue_lock);
    }
    if (result != VK_SUCCESS) {         /* lost device, or out of memory: fail this work, tell Python */
        for (uint32_t k = 0; k < f->count; k++)
            finish_entry(e, &f->entries[k], -LS_EFAULT, 0, 0, 0);
        flush_posts(e);
        f->count = 0;
        emit(e, LS_EV_DEVICE, 0, result, 0, 0, 0);
        e->device_lost = 1;
        return 0;
    }
    if (e->nflights == 0)
        f->head_since = ls_now_ns();
    e->nflights++;
    return 1;
}

/* The flight taking entries, with room for one more (a full one is submitted first); NULL when every
 * slot is in flight. */
struct flight *flight_with_room(ls_engine *e)
{
    struct flight *f = open_flight(e);
    if (f && f->count == LS_ENGINE_MAX_BATCH) {
        submit(e);
        f = open_flight(e);
    }
    return f;
}

/* ------------------------------------------------------------------ retiring */

/* Each entry's device time, from flight f's timestamps (0 untimed). */
static void read_times(ls_engine *e, struct flight *f, uint64_t *ns)
{
    for (uint32_t k = 0; k < f->count; k++)
        ns[k] = f->timed ? (uint64_t)((double)((f->stamps[k + 1] - f->stamps[k]) & e->cfg.timestamp_mask) *
                                      e->cfg.timestamp_period_ns)
                         : 0;
}

/* Answer the head flight's entries with status (with keep, their objects stay counted) and free its slot. */
static void retire_head(ls_engine *e, int32_t status, int keep)
{
    struct flight *f = flight_at(e, 0);
    static uint64_t ns[LS_ENGINE_MAX_BATCH];  /* the engine thread's, or a stopped engine's caller */
    read_times(e, f, ns);
    uint64_t held = f->count && f->head_since ? (uint64_t)(ls_now_ns() - f->head_since) / f->count : 0;
    const volatile uint32_t *slots = f->stamps ? (const uint32_t *)((char *)f->stamps + SCRATCH_OFFSET) : NULL;
    for (uint32_t k = 0; k < f->count; k++) {
        int32_t s = status;             /* an indirect dispatch whose counts the clamp refused ran nothing */
        if (!s && f->entries[k].indirect && slots && slots[4 * k + 3])
            s = -LS_EGROUPS;
        finish_entry(e, &f->entries[k], s, s ? 0 : ns[k], held, keep);
    }
    flush_posts(e);
    f->count = 0;
    e->vk.ResetFences(e->device, 1, &f->fence);
    e->head = (e->head + 1) % NFLIGHT;
    e->nflights--;
    if (e->nflights)
        flight_at(e, 0)->head_since = ls_now_ns();
}

/* Retire every submitted flight whose fence has signalled, oldest first; 1 when one did. */
int retire(ls_engine *e)
{
    int retired = 0;
    while (e->nflights) {
        VkResult result = e->vk.GetFenceStatus(e->device, flight_at(e, 0)->fence);
        if (result == VK_NOT_READY)
            break;
        if (result != VK_SUCCESS && !e->device_lost) {
            e->device_lost = 1;
            emit(e, LS_EV_DEVICE, 0, result, 0, 0, 0);
        }
        retire_head(e, result == VK_SUCCESS && !e->faulted ? 0 : -LS_EFAULT, 0);
        retired = 1;
    }
    return retired;
}

/* ------------------------------------------------------------------ the watchdog */

/* The id of the one program that client slot's dispatches in flight f run, or 0 when they run none or
 * several (then which of them ran away cannot be told). A dispatch's program is its last user. */
static uint64_t flight_program(const struct flight *f, uint32_t slot)
{
    uint64_t program = 0;
    for (uint32_t k = 0; k < f->count; k++) {
        const struct entry *en = &f->entries[k];
        const struct object *o = en->nusers ? en->users[en->nusers - 1] : NULL;
        if (en->client != slot || !o || o->kind != LS_KIND_PROGRAM)
            continue;
        if (program && program != o->id)
            return 0;
        program = o->id;
    }
    return program;
}

/* The watchdog: the head submission's current command has run past the limit; one LS_EV_SUSPECT names
 * its client (and its program), or each client of an unmarked batch. A single command is
 * timed from when its submission reached the head of the queue. A batch carries a progress marker
 * after each command (mark_progress), so its clock restarts whenever the marker moves: a command is
 * caught within twice the watchdog (it may have started up to one watchdog before the marker was
 * last seen to move), and a batch of legal commands runs as long as they take (timed from the head
 * alone, 256 dispatches of a second each would fault the server for everyone). A batch without the
 * marker (no mapped buffer could be made) has twice the watchdog in all. */
void check_watchdog(ls_engine *e)
{
    if (!e->nflights || !e->policy.watchdog_ns || e->faulted)
        return;
    struct flight *f = flight_at(e, 0);
    int64_t now = ls_now_ns(), limit = (int64_t)e->policy.watchdog_ns, since = f->head_since;
    int marked = marked_batch(f);
    if (marked) {
        uint32_t ended = *f->progress;
        if (ended != f->progress_seen) {
            f->progress_seen = ended;
            f->progress_at = now;
        }
        if (f->progress_at > since)
            since = f->progress_at;
    } else if (f->count > 1) {
        limit *= 2;
    }
    int64_t running = now - since;
    if (f->reported || running <= limit)
        return;
    f->reported = 1;
    emit(e, LS_EV_WATCHDOG, 0, marked ? (int32_t)f->progress_seen : 0, marked, f->count, (uint64_t)running);
    if (marked && f->progress_seen < f->count) {  /* the marker names the command that runs: its client alone */
        const struct entry *en = &f->entries[f->progress_seen];
        const struct object *o = en->nusers ? en->users[en->nusers - 1] : NULL;
        uint64_t program = o && o->kind == LS_KIND_PROGRAM ? o->id : 0;
        emit(e, LS_EV_SUSPECT, en->client, 0, program ? LS_KIND_PROGRAM : 0, program, 0);
        return;
    }
    for (uint32_t k = 0; k < f->count; k++) {  /* no marker: every client of the submission */
        uint32_t slot = f->entries[k].client, seen = 0;
        for (uint32_t j = 0; j < k && !seen; j++)
            seen = f->entries[j].client == slot;
        if (!seen) {
            uint64_t program = flight_program(f, slot);
            emit(e, LS_EV_SUSPECT, slot, 0, program ? LS_KIND_PROGRAM : 0, program, 0);
        }
    }
}

/* ------------------------------------------------------------------ setup */

/* A query pool and a mapped buffer for a flight's timestamps, progress word and indirect dispatches' slots
 * (recordings.c, "Indirect dispatches"); the pool also holds a query per entry for an LS_OP_TIMESTAMP
 * (recordings.c, "Timestamps"). Without the pool the flight is untimed and refuses timestamps, without the
 * buffer it is also unmarked and refuses indirect dispatches (LS_EFAULT). */
void create_timing(ls_engine *e, struct flight *f)
{
    uint32_t count = FLIGHT_QUERIES;
    VkQueryPoolCreateInfo qinfo = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, NULL, 0, VK_QUERY_TYPE_TIMESTAMP, count,
                                   0};
    VkBufferCreateInfo binfo = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, SCRATCH_OFFSET + SCRATCH_SIZE,
                                VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                    VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT,
                                VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    if (e->vk.CreateQueryPool(e->device, &qinfo, NULL, &f->queries) != VK_SUCCESS)
        f->queries = VK_NULL_HANDLE;
    VkMemoryRequirements req;
    void *mapped = NULL;
    if (e->vk.CreateBuffer(e->device, &binfo, NULL, &f->results) == VK_SUCCESS) {
        e->vk.GetBufferMemoryRequirements(e->device, f->results, &req);
        VkMemoryAllocateInfo ainfo = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, req.size,
                                      e->cfg.host_memory_type};
        if ((req.memoryTypeBits >> e->cfg.host_memory_type & 1) &&
            e->vk.AllocateMemory(e->device, &ainfo, NULL, &f->results_memory) == VK_SUCCESS &&
            e->vk.BindBufferMemory(e->device, f->results, f->results_memory, 0) == VK_SUCCESS &&
            e->vk.MapMemory(e->device, f->results_memory, 0, VK_WHOLE_SIZE, 0, &mapped) == VK_SUCCESS) {
            f->stamps = mapped;
            f->progress = (volatile uint32_t *)((char *)mapped + PROGRESS_OFFSET);
            return;
        }
    }
    e->vk.DestroyQueryPool(e->device, f->queries, NULL);  /* untimed: the rest is freed by destroy */
    f->queries = VK_NULL_HANDLE;
}
