/*
 * The engine's entry points: every ls_engine_* function that engine.h declares. Creating,
 * starting, placing, stopping and destroying the engine; adding, closing and removing clients;
 * their objects (programs, buffers, command lists and bind groups, each list's commands and each
 * group's entries checked as they are put) and counters; faults, plans and events. Each takes the engine's mutex for a
 * short while (ls_engine_dropped takes none: see there), and the engine's thread holds it for
 * one step of its loop at most (loop.c), so a call never waits for a device.
 */
#include "internal.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the engine */

/* The device's Vulkan entry points, from the loader the process has (or loads). */
static int load_vulkan(ls_engine *e)
{
    void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!loader)
        loader = dlopen("libvulkan.so.1", RTLD_NOW);
    if (!loader)
        return -ENOENT;
    PFN_vkGetDeviceProcAddr get = (PFN_vkGetDeviceProcAddr)dlsym(loader, "vkGetDeviceProcAddr");
    if (!get)
        return -ENOENT;
#define LOAD(name)                                                                 \
    if (!(e->vk.name = (PFN_vk##name)get(e->device, "vk" #name)))                  \
        return -ENOSYS;
    LOAD(QueueSubmit) LOAD(GetFenceStatus) LOAD(WaitForFences) LOAD(ResetFences) LOAD(CreateFence)
    LOAD(DestroyFence) LOAD(CreateCommandPool) LOAD(DestroyCommandPool) LOAD(AllocateCommandBuffers)
    LOAD(BeginCommandBuffer) LOAD(EndCommandBuffer) LOAD(CmdBindPipeline) LOAD(CmdPushDescriptorSetKHR)
    LOAD(CmdPushConstants) LOAD(CmdDispatch) LOAD(CmdCopyBuffer) LOAD(CmdPipelineBarrier) LOAD(CmdExecuteCommands)
    LOAD(CreateQueryPool)
    LOAD(DestroyQueryPool) LOAD(CmdResetQueryPool) LOAD(CmdWriteTimestamp) LOAD(CmdCopyQueryPoolResults)
    LOAD(CmdFillBuffer) LOAD(CmdUpdateBuffer) LOAD(CmdDispatchIndirect)
    LOAD(CreateBuffer) LOAD(DestroyBuffer) LOAD(GetBufferMemoryRequirements) LOAD(AllocateMemory) LOAD(FreeMemory)
    LOAD(BindBufferMemory) LOAD(MapMemory)
#undef LOAD
    e->vk.CmdDispatchBase = (PFN_vkCmdDispatchBase)get(e->device, "vkCmdDispatchBase");  /* 1.1: pieces */
    return 0;
}

int ls_engine_create(const struct ls_engine_config *config, ls_engine **out)
{
    if (!config->max_clients || config->max_clients > (1u << 20) || !config->offset_alignment)
        return -EINVAL;
    ls_engine *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    e->cfg = *config;
    e->device = (VkDevice)(uintptr_t)config->device;
    e->queue = (VkQueue)(uintptr_t)config->queue;
    e->policy = (struct ls_engine_policy){0, 1, 0, 50000, 16, 2, 1000000};
    e->fence_free = NO_FENCE;
    e->plan_stale = 1;
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->clients = calloc(config->max_clients, sizeof *e->clients);
    e->active = calloc(config->max_clients, sizeof *e->active);
    e->pollfds = calloc(config->max_clients + 1, sizeof *e->pollfds);
    e->poll_clients = calloc(config->max_clients + 1, sizeof *e->poll_clients);
    pthread_mutex_init(&e->lock, NULL);
    pthread_mutex_init(&e->queue_lock, NULL);
    int rc = e->wake_fd < 0 ? -errno : 0;
    if (!rc && (!e->clients || !e->active || !e->pollfds || !e->poll_clients))
        rc = -ENOMEM;
    if (!rc)
        rc = load_vulkan(e);
    VkCommandPoolCreateInfo pinfo = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, NULL,
                                     VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, config->family};
    if (!rc && e->vk.CreateCommandPool(e->device, &pinfo, NULL, &e->pool) != VK_SUCCESS)
        rc = -ENOMEM;
    for (int k = 0; !rc && k < NFLIGHT; k++) {
        struct flight *f = &e->flights[k];
        VkCommandBufferAllocateInfo ainfo = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, NULL, e->pool,
                                             VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
        VkFenceCreateInfo finfo = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, NULL, 0};
        if (e->vk.AllocateCommandBuffers(e->device, &ainfo, &f->cb) != VK_SUCCESS ||
            e->vk.CreateFence(e->device, &finfo, NULL, &f->fence) != VK_SUCCESS)
            rc = -ENOMEM;
        else if (config->timestamp_mask)
            create_timing(e, f);
    }
    if (rc) {
        ls_engine_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

int ls_engine_start(ls_engine *e)
{
    if (e->started)
        return -EALREADY;
    int rc = pthread_create(&e->thread, NULL, run, e);
    if (rc)
        return -rc;
    e->started = 1;
    while (!ls_load_acquire(&e->tid))  /* pairs with run()'s ls_store_release, its first thing */
        sched_yield();
    return 0;
}

int32_t ls_engine_thread_id(ls_engine *e)
{
    return e->started ? ls_load_acquire(&e->tid) : -ESRCH;  /* pairs with run()'s ls_store_release */
}

int ls_engine_place(ls_engine *e, int32_t core)
{
    if (!e->started)
        return -ESRCH;
    if (core >= CPU_SETSIZE)
        return -EINVAL;
    if (core >= 0) {
        cpu_set_t only;
        CPU_ZERO(&only);
        CPU_SET(core, &only);
        int rc = pthread_setaffinity_np(e->thread, sizeof only, &only);
        if (rc)
            return -rc;
    }
    ls_store_release(&e->placed, core >= 0);  /* pairs with poll_step's ls_load_acquire */
    return 0;
}

void ls_engine_wake(ls_engine *e)
{
    uint64_t one = 1;
    ssize_t written = write(e->wake_fd, &one, sizeof one);
    (void)written;                      /* saturated: the engine is awake anyway */
}

int ls_engine_stop(ls_engine *e, int64_t timeout_ns)
{
    if (!e->started)
        return 0;
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    e->stop_timeout_ns = timeout_ns;
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
    pthread_join(e->thread, NULL);
    e->started = 0;
    ls_store_release(&e->tid, 0);  /* pairs with ls_engine_thread_id's ls_load_acquire; a new run() stores its own */
    return e->abandoned;
}

int ls_engine_destroy(ls_engine *e)
{
    if (!e)
        return 0;
    if (e->started || e->abandoned || e->nflights)
        return -EBUSY;                  /* its command buffers and fences may still be in use */
    if (e->vk.DestroyFence) {
        for (int k = 0; k < NFLIGHT; k++) {
            struct flight *f = &e->flights[k];
            if (f->fence)
                e->vk.DestroyFence(e->device, f->fence, NULL);
            if (f->queries)
                e->vk.DestroyQueryPool(e->device, f->queries, NULL);
            if (f->results)
                e->vk.DestroyBuffer(e->device, f->results, NULL);
            if (f->results_memory)
                e->vk.FreeMemory(e->device, f->results_memory, NULL);  /* unmaps it */
        }
        if (e->pool)
            e->vk.DestroyCommandPool(e->device, e->pool, NULL);
    }
    for (uint32_t i = 0; e->clients && i < e->cfg.max_clients; i++)
        if (e->clients[i].region)
            ls_engine_remove_client(e, i);
    for (struct recording *r = e->spare, *next; r; r = next) {  /* their command buffers go with the pool */
        next = r->next;
        free(r);
    }
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    free(e->clients), free(e->active), free(e->pollfds), free(e->poll_clients);
    free(e->fence_nodes), free(e->events), free(e->plan);
    pthread_mutex_destroy(&e->lock);
    pthread_mutex_destroy(&e->queue_lock);
    free(e);
    return 0;
}

void ls_engine_set_policy(ls_engine *e, const struct ls_engine_policy *policy)
{
    pthread_mutex_lock(&e->lock);
    e->policy = *policy;
    if (e->policy.max_in_flight < 1 || e->policy.max_in_flight > NFLIGHT - 1)
        e->policy.max_in_flight = 2;
    e->nplan = 0;                       /* made under the old policy: ask again */
    e->plan_stale = 1;
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
}

int32_t ls_engine_queue_submit(ls_engine *e, uint64_t submit_info, uint64_t fence)
{
    pthread_mutex_lock(&e->queue_lock);
    VkResult result = e->vk.QueueSubmit(e->queue, 1, (const VkSubmitInfo *)(uintptr_t)submit_info,
                                        (VkFence)(uintptr_t)fence);
    pthread_mutex_unlock(&e->queue_lock);
    return result;
}

/* ------------------------------------------------------------------ clients */

/* Client slot, or NULL when the slot is out of range or free. */
static struct client *client_at(ls_engine *e, uint32_t slot)
{
    return slot < e->cfg.max_clients && e->clients[slot].region ? &e->clients[slot] : NULL;
}

int ls_engine_add_client(ls_engine *e, uint32_t slot, uint64_t region, int32_t doorbell_fd)
{
    if (slot >= e->cfg.max_clients || !region)
        return -EINVAL;
    pthread_mutex_lock(&e->lock);
    struct client *c = &e->clients[slot];
    int rc = c->region ? -EEXIST : 0;
    if (!rc) {
        memset(c, 0, sizeof *c);
        c->region = (ls_region *)(uintptr_t)region;
        c->doorbell_fd = doorbell_fd;
        c->active_index = e->nactive;
        c->rank = UNRANKED;
        e->active[e->nactive++] = slot;
    }
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);                  /* arm its ring */
    return rc;
}

int ls_engine_close_client(ls_engine *e, uint32_t slot, uint32_t reason)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = -ENOENT;
    if (c) {
        if (reason && !c->closing) {
            ls_close_consumer(c->region, reason);
            cancel_queued(e, slot, -(int32_t)reason);
            c->handed_over = reason == LS_EMOVED;  /* its session waits for what runs, then moves it */
        }
        c->closing = 1;
        cancel_after(e, slot, -(int32_t)(reason ? reason : LS_ECANCELED));  /* popped behind a list, unrun */
        if (!c->handed_over) {          /* a cut or list stops at its work on the device (handed over: continue_*) */
            end_cut(e, slot, -(int32_t)(reason ? reason : LS_ECANCELED));
            end_run(e, slot, -(int32_t)(reason ? reason : LS_ECANCELED));
        }
        flush_posts(e);
        settle_drops(e, slot);
        rc = (int)c->outstanding;
    }
    int rest = c && (c->cut.active || c->run.list);
    pthread_mutex_unlock(&e->lock);
    if (rest)
        ls_engine_wake(e);              /* to run the rest of its cut */
    return rc;
}

int ls_engine_remove_client(ls_engine *e, uint32_t slot)
{
    int locked = e->started;
    if (locked)
        pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = c ? 0 : -ENOENT;
    if (c) {
        c->closing = 1;
        if (c->cut.active)
            close_cut(e, c);            /* a stopped engine's: abandoned with its flights */
        close_run(e, c);
        free(c->after);
        settle_drops(e, slot);
        forget_recordings(e, c, NULL);
        free(c->buckets);
        free_objects(&c->objects, slot);
        uint32_t last = e->active[--e->nactive];
        e->active[c->active_index] = last;
        e->clients[last].active_index = c->active_index;
        memset(c, 0, sizeof *c);
    }
    if (locked)
        pthread_mutex_unlock(&e->lock);
    if (locked)
        ls_engine_wake(e);
    return rc;
}

int ls_engine_stats(ls_engine *e, uint32_t slot, struct ls_engine_stats *out)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    if (c) {
        *out = c->stats;
        out->outstanding = c->outstanding;
        out->closing = c->closing;
        out->muted = ls_now_ns() < c->muted_until;
        out->table_slots = c->objects.cap;
        out->table_probes = c->objects.longest;
    }
    pthread_mutex_unlock(&e->lock);
    return c ? 0 : -ENOENT;
}

/* Without the lock: asked before each control request, which must not wait for a drain pass.
 * The slot is the asking client's own, added before its first request and removed after its
 * last; drop_client stores the flag before it closes the ring. */
int ls_engine_dropped(ls_engine *e, uint32_t slot)
{
    if (slot >= e->cfg.max_clients)
        return -ENOENT;
    return (int)ls_load_acquire(&e->clients[slot].dropped);  /* pairs with drop_client's ls_store_release */
}

int ls_engine_take_usage(ls_engine *e, uint32_t slot, struct ls_engine_stats *out)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    if (c) {
        int pending = c->closing ? 0 : waits(c);  /* now: the plan is made now */
        c->stats.pending = pending > 0 ? (uint32_t)pending : 0;   /* a corrupt ring: the next look drops it */
        *out = c->stats;
        out->outstanding = c->outstanding;
        out->table_slots = c->objects.cap;
        out->table_probes = c->objects.longest;
        c->stats.popped_since = c->stats.charged_since = c->stats.charged_ns_since = 0;
    }
    pthread_mutex_unlock(&e->lock);
    return c ? 0 : -ENOENT;
}

/* ------------------------------------------------------------------ objects */

/* The tail of every put, called with the engine's lock held: when rc (the put's checks) is 0, o goes into
 * client c's table (and, a view, holds its buffer of: objects.c, "Views"); then the lock is released and o
 * freed unless it went in. rc, or table_put's failure. */
static int register_object(ls_engine *e, struct client *c, struct object *o, struct object *of, int rc)
{
    if (!rc)
        rc = table_put(&c->objects, o);
    if (!rc && of)
        hold_objects(&o->of, &of, 1);
    pthread_mutex_unlock(&e->lock);
    if (rc)
        free(o);
    return rc;
}

/* Add o to client slot's table (freed on failure). */
static int put_object(ls_engine *e, uint32_t slot, struct object *o)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = o->id & LS_LIST_ARG ? -EINVAL  /* a list's parameter, never an object (lists.c) */
             : !c ? -ENOENT : table_find(&c->objects, o->kind, o->id) ? -EEXIST : 0;
    return register_object(e, c, o, NULL, rc);
}

int ls_engine_put_program(ls_engine *e, uint32_t slot, uint32_t id, uint64_t pipeline, uint64_t layout,
                          uint32_t bindings, uint32_t uniform_mask, uint32_t array_mask, uint32_t push_size,
                          uint32_t flags, const uint16_t *formats)
{
    uint64_t past = bindings < 32 ? ~0u << bindings : 0;   /* the mask bits past its bindings */
    if (!pipeline || !layout || bindings > LS_ENGINE_MAX_BINDINGS || push_size > LS_MAX_PUSH ||
        (flags & ~LS_ENGINE_CUTTABLE) || (uniform_mask & past) || (array_mask & (past | 1)))
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_PROGRAM, .handle = pipeline, .layout = layout,
                         .bindings = bindings, .uniform_mask = uniform_mask, .array_mask = array_mask,
                         .push_size = push_size, .client = slot,
                         .cuttable = flags & LS_ENGINE_CUTTABLE};
    for (uint32_t k = 0; formats && k < bindings; k++)
        if (formats[k])
            o->formats[k] = formats[k], o->texel_mask |= 1u << k;
    return put_object(e, slot, o);
}

int ls_engine_put_view(ls_engine *e, uint32_t slot, uint32_t id, uint32_t buffer, uint64_t view, uint64_t offset,
                       uint64_t range, uint32_t format, uint32_t uses)
{
    if (!view || !range || format >= 16 || !uses || (uses & ~(LS_VIEW_STORAGE | LS_VIEW_UNIFORM)))
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_VIEW, .handle = view, .size = range, .format = format,
                         .uses = uses, .client = slot};
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    struct object **found = c ? table_find(&c->objects, LS_KIND_BUFFER, buffer) : NULL;
    struct object *of = found ? *found : NULL;  /* (table_put may move the slots) */
    int rc = !of ? -ENOENT : table_find(&c->objects, LS_KIND_VIEW, id) ? -EEXIST
           : offset > of->size || range > of->size - offset ? -ERANGE : 0;
    return register_object(e, c, o, of, rc);  /* the buffer lives while its view does */
}

int ls_engine_put_list(ls_engine *e, uint32_t slot, uint32_t id, const char *commands, uint32_t count,
                       uint32_t *bad)
{
    *bad = 0;
    if (!commands || !count || count > LS_ENGINE_MAX_LIST || id & LS_LIST_ARG)
        return -EINVAL;
    struct object *o = new_list(commands, count);
    if (!o)
        return -ENOMEM;
    o->id = id, o->client = slot;
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = !c ? -ENOENT : table_find(&c->objects, LS_KIND_LIST, id) ? -EEXIST : check_list(e, c, o, bad);
    return register_object(e, c, o, NULL, rc);
}

int ls_engine_put_group(ls_engine *e, uint32_t slot, uint32_t id, uint32_t program, const uint32_t *buffers,
                        const uint64_t *offsets, const uint64_t *ranges, uint32_t count, uint32_t *bad)
{
    *bad = 0;
    if (!buffers || !offsets || !ranges || count > LS_ENGINE_MAX_BINDINGS)
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o + (size_t)count * sizeof(struct group_entry));
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_GROUP, .bindings = count, .client = slot};
    for (uint32_t k = 0; k < count; k++)
        group_entries(o)[k] = (struct group_entry){.buffer = buffers[k], .offset = offsets[k], .range = ranges[k]};
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    struct object **p = c ? table_find(&c->objects, LS_KIND_PROGRAM, program) : NULL;
    struct object *found[LS_ENGINE_MAX_BINDINGS];
    int rc = !c ? -ENOENT : !p ? -LS_ENOPROGRAM : (*p)->bindings != count ? -LS_EBINDINGS
           : table_find(&c->objects, LS_KIND_GROUP, id) ? -EEXIST : 0;
    if (!rc) {                          /* the program's layout, then each entry against it */
        o->uniform_mask = (*p)->uniform_mask, o->array_mask = (*p)->array_mask, o->texel_mask = (*p)->texel_mask;
        memcpy(o->formats, (*p)->formats, sizeof o->formats);
        rc = check_group(e, c, o, group_entries(o), count, found, bad);
    }
    return register_object(e, c, o, NULL, rc);
}

int ls_engine_put_buffer(ls_engine *e, uint32_t slot, uint32_t id, uint64_t buffer, uint64_t size)
{
    if (!buffer || !size)
        return -EINVAL;
    struct object *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    *o = (struct object){.id = id, .kind = LS_KIND_BUFFER, .handle = buffer, .size = size, .client = slot};
    return put_object(e, slot, o);
}

int ls_engine_drop(ls_engine *e, uint32_t slot, uint32_t kind, uint32_t id)
{
    pthread_mutex_lock(&e->lock);
    struct client *c = client_at(e, slot);
    int rc = c && table_find(&c->objects, kind, id) ? defer_drop(e, slot, kind, id) : -ENOENT;
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* ------------------------------------------------------------------ faults, plans and events */

void ls_engine_set_busy_word(ls_engine *e, uint64_t word_address)
{
    /* pairs with the ls_load_acquire in take and add_piece */
    ls_store_release(&e->busy, (volatile uint32_t *)(uintptr_t)word_address);
}

void ls_engine_set_fault(ls_engine *e, uint32_t faulted)
{
    pthread_mutex_lock(&e->lock);
    e->faulted = faulted != 0;
    if (e->started)
        retire(e);                      /* finished work: answered LS_EFAULT now */
    pthread_mutex_unlock(&e->lock);
    ls_engine_wake(e);
}

int ls_engine_in_flight(ls_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int n = (int)e->nflights;
    pthread_mutex_unlock(&e->lock);
    return n;
}

int ls_engine_in_flight_clients(ls_engine *e, uint32_t *out, uint32_t max)
{
    pthread_mutex_lock(&e->lock);
    uint32_t n = 0;
    for (uint32_t k = 0; k < e->nflights; k++) {
        struct flight *f = flight_at(e, k);
        for (uint32_t j = 0; j < f->count && n < max; j++) {
            uint32_t slot = f->entries[j].client, seen = 0;
            for (uint32_t i = 0; i < n && !seen; i++)
                seen = out[i] == slot;
            if (!seen)
                out[n++] = slot;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return (int)n;
}

int ls_engine_set_plan(ls_engine *e, const struct ls_engine_turn *turns, uint32_t count)
{
    pthread_mutex_lock(&e->lock);
    int rc = 0;
    if (count > e->plan_cap) {
        struct ls_engine_turn *grown = realloc(e->plan, count * sizeof *grown);
        if (grown)
            e->plan = grown, e->plan_cap = count;
        else
            rc = -ENOMEM;
    }
    if (!rc) {
        memcpy(e->plan, turns, count * sizeof *turns);
        e->nplan = count;
        for (uint32_t t = 0; t < count; t++)    /* piece_now's view of who outranks a cut */
            if (turns[t].client < e->cfg.max_clients)
                e->clients[turns[t].client].rank = turns[t].rank;
    }
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int ls_engine_events(ls_engine *e, struct ls_engine_event *out, uint32_t max)
{
    pthread_mutex_lock(&e->lock);
    uint32_t n = e->nevents < max ? e->nevents : max;
    memcpy(out, e->events, n * sizeof *out);
    memmove(e->events, e->events + n, (e->nevents - n) * sizeof *out);
    e->nevents -= n;
    pthread_mutex_unlock(&e->lock);
    return (int)n;
}
