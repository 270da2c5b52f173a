/* VkCommandPool and VkCommandBuffer: the lifecycle, and a recording loaded as the arbiter's command lists.
 *
 * A pool is an object of the device's table holding the command buffers allocated from it; a
 * command buffer is dispatchable (the loader's slot first, ICD_LOADER_MAGIC), allocated on its own,
 * and found again only through a pool's array (vkFreeCommandBuffers, vkCmdExecuteCommands check
 * that a pointer the application gives is one of the device's before following it).
 *
 * Recording. vkBeginCommandBuffer starts a recording (resetting one not initial, as
 * vkResetCommandBuffer does; one pending is LS_ICD_INVALID). Either reset is allowed from a pool
 * without RESET_COMMAND_BUFFER_BIT, which Vulkan forbids and real drivers allow: Kompute records its
 * sequences again so, and a reset only drops what this process holds. Each vkCmd* appends 256-byte
 * descriptors (libshare/ring/ring.h's struct ls_desc) to it
 * through ls_icd_record: record.c's copies, fills, updates, barriers, events and secondary command
 * buffers, dispatch.c's dispatches with their bind groups, push constants and descriptor sets. The
 * recording's private state (struct ls_icd_recording) is in commands.h. A secondary command buffer
 * is never loaded: its descriptors stay here, for vkCmdExecuteCommands to inline, until it is reset
 * or freed.
 *
 * Errors while recording. The first failure (a wrong handle, a range past a buffer, no pipeline
 * bound, a descriptor never written, a bind group the arbiter refused, a command not offered) is
 * kept, written on stderr once, and answered by vkEndCommandBuffer: LS_ICD_INVALID for invalid use,
 * VK_ERROR_OUT_OF_DEVICE_MEMORY where the arbiter's quota refused; the command buffer is then
 * invalid and never submitted.
 *
 * vkEndCommandBuffer (primary) cuts the descriptors into lists of at most LS_ENGINE_MAX_LIST (1024),
 * each loaded with {"op":"load_list"} and the descriptors as payload, or the same list loaded before
 * by any recording of the device (cache.c: content decides); the arbiter checks every command
 * (engine/lists.c) and a refusal is the command buffer's error. An empty command buffer
 * holds no list (its submission has nothing to run). The arbiter holds at most 1024 lists and 65536
 * commands in them a session (LISTS_PER_CLIENT, LIST_COMMANDS_PER_CLIENT, serve/requests.py) and a
 * device is one session: 1024 executable command buffers of up to 64 commands each, or 64 of 1024;
 * past that vkEndCommandBuffer answers VK_ERROR_OUT_OF_DEVICE_MEMORY (the arbiter's QuotaExceeded)
 * and the application frees or resets one (idle lists the cache keeps are freed first). A
 * recording holds at most MOST_COMMANDS descriptors (all a session's lists may hold). Reset, free and destroy give the command buffer's lists and
 * bind groups back to the cache; a command buffer freed while pending is released by the last
 * ls_icd_command_buffer_done. A ONE_TIME_SUBMIT command buffer stays executable after its
 * submission: Vulkan makes it invalid, lavapipe runs it again when submitted again, and so does this.
 *
 * Locking. Every call that changes a command buffer's state, asks the arbiter or looks up the
 * device's objects holds the device's lock; the recording itself is the application's to
 * synchronize (Vulkan's external synchronization of a command buffer and its pool), so
 * ls_icd_record takes no lock. ls_icd_command_buffer_take and _done are called with it held. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "descriptor.h"

#define LIST_COMMANDS 1024u                   /* LS_ENGINE_MAX_LIST */
#define MOST_COMMANDS (64u * LIST_COMMANDS)   /* LIST_COMMANDS_PER_CLIENT: all a session's lists may hold */

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

struct ls_icd_command_buffer *ls_icd_command_buffer_of(VkCommandBuffer handle)
{
    return (struct ls_icd_command_buffer *)handle;
}

VkResult ls_icd_fail(struct ls_icd_command_buffer *cb, VkResult result, const char *why)
{
    struct ls_icd_recording *rec = cb->recording;
    if (rec->error == VK_SUCCESS) {
        rec->error = result;
        fprintf(stderr, "libshare Vulkan driver: a command buffer is invalid: %s\n", why);
    }
    return rec->error;
}

int ls_icd_grow(void **items, uint32_t *capacity, uint32_t wanted, size_t size)
{
    uint32_t more = *capacity ? *capacity : 16;
    void *grown;
    if (wanted <= *capacity)
        return 0;
    if (wanted > (1u << 30))
        return -1;
    while (more < wanted)
        more *= 2;
    grown = realloc(*items, (size_t)more * size);
    if (grown == NULL)
        return -1;
    *items = grown;
    *capacity = more;
    return 0;
}

VkResult ls_icd_record(struct ls_icd_command_buffer *cb, const struct ls_desc *command)
{
    struct ls_icd_recording *rec = cb->recording;
    if (cb->state != LS_ICD_CB_RECORDING)
        return LS_ICD_INVALID; /* (no recording to keep the error in) */
    if (rec->error != VK_SUCCESS)
        return rec->error;
    if (rec->ncommands == MOST_COMMANDS)
        return ls_icd_fail(cb, VK_ERROR_OUT_OF_DEVICE_MEMORY, "more commands than a session's 64 lists hold");
    if (ls_icd_grow((void **)&rec->commands, &rec->capacity, rec->ncommands + 1, sizeof(*rec->commands)) < 0)
        return ls_icd_fail(cb, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
    rec->commands[rec->ncommands++] = *command;
    return VK_SUCCESS;
}

int ls_icd_keep_held(struct ls_icd_command_buffer *cb, struct ls_icd_cached *cached)
{
    struct ls_icd_recording *rec = cb->recording;
    if (ls_icd_grow((void **)&rec->held, &rec->held_capacity, rec->nheld + 1, sizeof(*rec->held)) < 0) {
        ls_icd_cache_release(cb->device, cached);
        ls_icd_fail(cb, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
        return -1;
    }
    rec->held[rec->nheld++] = cached;
    return 0;
}

/* Everything a recording holds, given back (the device's lock held): its lists and groups to the cache. */
static void forget(struct ls_icd_command_buffer *cb)
{
    struct ls_icd_recording *rec = cb->recording;
    for (uint32_t i = 0; i < rec->nheld; i++)
        ls_icd_cache_release(cb->device, rec->held[i]);
    ls_icd_pushed_free(cb->device, rec->pushed, LS_ICD_MOST_SETS);
    free(cb->lists);
    free(rec->commands);
    free(rec->held);
    free(rec->events);
    cb->lists = NULL;
    cb->nlists = 0;
    memset(rec, 0, offsetof(struct ls_icd_recording, level));
    cb->state = LS_ICD_CB_INITIAL;
}

static void release(struct ls_icd_command_buffer *cb)
{
    forget(cb);
    free(cb->recording);
    free(cb);
}

/* ---------------------------------------------------------------- pools */

/* What a command pool holds, freed at vkDestroyDevice (the session closed: the arbiter freed its lists
 * and groups with it, so none is asked for); other kinds are left alone. */
void ls_icd_command_pool_free(struct ls_icd_object *object)
{
    if (object->kind != LS_ICD_COMMAND_POOL)
        return;
    for (uint32_t i = 0; i < object->u.command_pool.nbuffers; i++) {
        struct ls_icd_command_buffer *cb = object->u.command_pool.buffers[i];
        struct ls_icd_recording *rec = cb->recording;
        free(rec->held); /* (what it holds: ls_icd_cache_free) */
        free(rec->commands);
        free(rec->events);
        free(rec);
        free(cb->lists);
        free(cb);
    }
    free(object->u.command_pool.buffers);
    object->u.command_pool.buffers = NULL;
    object->u.command_pool.nbuffers = 0;
}

static struct ls_icd_command_pool *pool_of(struct ls_icd_device *device, VkCommandPool pool)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)pool, LS_ICD_COMMAND_POOL);
    return object ? &object->u.command_pool : NULL;
}

/* ``handle`` when it is a command buffer of ``device`` (in one of its pools), else NULL. */
struct ls_icd_command_buffer *ls_icd_command_buffer_find(struct ls_icd_device *device, const void *handle)
{
    for (uint32_t slot = 0; handle != NULL && slot < device->objects.used; slot++) {
        struct ls_icd_object *object = &device->objects.slots[slot];
        if (object->kind != LS_ICD_COMMAND_POOL)
            continue;
        for (uint32_t i = 0; i < object->u.command_pool.nbuffers; i++)
            if (object->u.command_pool.buffers[i] == handle)
                return object->u.command_pool.buffers[i];
    }
    return NULL;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateCommandPool(VkDevice handle, const VkCommandPoolCreateInfo *info,
                                                        const VkAllocationCallbacks *allocator, VkCommandPool *out)
{
    struct ls_icd_command_pool pool = {0};
    uint64_t made;
    VkResult result;
    (void)allocator;
    if (info->queueFamilyIndex != 0 || (info->flags & ~(VkCommandPoolCreateFlags)(
            VK_COMMAND_POOL_CREATE_TRANSIENT_BIT | VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT)))
        return LS_ICD_INVALID; /* one queue family; no protected pools */
    result = ls_icd_object_create(device_of(handle), LS_ICD_COMMAND_POOL, &pool, sizeof(pool), &made);
    if (result == VK_SUCCESS)
        *out = (VkCommandPool)(uintptr_t)made;
    return result;
}

/* Free one of the pool's command buffers (the device's lock held): now, or at its last answer. */
static void drop(struct ls_icd_command_buffer *cb)
{
    if (cb->pending) {
        cb->freed = 1;
        cb->pool = 0;
    } else {
        release(cb);
    }
}

/* A destroyed pool's command buffers freed, now or at their last answer (the lock held). */
static void free_pool(struct ls_icd_device *device, struct ls_icd_object *object)
{
    struct ls_icd_command_pool *found = &object->u.command_pool;
    (void)device;
    for (uint32_t i = 0; i < found->nbuffers; i++)
        drop(found->buffers[i]);
    free(found->buffers);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyCommandPool(VkDevice handle, VkCommandPool pool,
                                                     const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy_with(device_of(handle), (uint64_t)(uintptr_t)pool, LS_ICD_COMMAND_POOL, free_pool);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetCommandPool(VkDevice handle, VkCommandPool pool,
                                                       VkCommandPoolResetFlags flags)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_command_pool *found;
    VkResult result = VK_SUCCESS;
    (void)flags; /* RELEASE_RESOURCES: a reset gives everything back anyway */
    pthread_mutex_lock(&device->lock);
    found = pool_of(device, pool);
    for (uint32_t i = 0; found != NULL && i < found->nbuffers; i++)
        if (found->buffers[i]->pending)
            result = LS_ICD_INVALID; /* a command buffer of it is pending */
    if (found == NULL)
        result = LS_ICD_INVALID;
    for (uint32_t i = 0; result == VK_SUCCESS && i < found->nbuffers; i++)
        forget(found->buffers[i]);
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_TrimCommandPool(VkDevice handle, VkCommandPool pool, VkCommandPoolTrimFlags flags)
{
    (void)handle, (void)pool, (void)flags; /* nothing is kept past its use: nothing to trim */
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateCommandBuffers(VkDevice handle, const VkCommandBufferAllocateInfo *info,
                                                             VkCommandBuffer *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_command_pool *pool;
    VkResult result = VK_SUCCESS;
    uint32_t made = 0;
    if (info->level != VK_COMMAND_BUFFER_LEVEL_PRIMARY && info->level != VK_COMMAND_BUFFER_LEVEL_SECONDARY)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    pool = pool_of(device, info->commandPool);
    if (pool == NULL)
        result = LS_ICD_INVALID;
    else if (ls_icd_grow((void **)&pool->buffers, &pool->capacity, pool->nbuffers + info->commandBufferCount,
                  sizeof(*pool->buffers)) < 0)
        result = VK_ERROR_OUT_OF_HOST_MEMORY;
    for (; result == VK_SUCCESS && made < info->commandBufferCount; made++) {
        struct ls_icd_command_buffer *cb = calloc(1, sizeof(*cb));
        struct ls_icd_recording *rec = calloc(1, sizeof(*rec));
        if (cb == NULL || rec == NULL) {
            free(cb);
            free(rec);
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
            break;
        }
        set_loader_magic_value(cb);
        cb->device = device;
        cb->pool = (uint64_t)(uintptr_t)info->commandPool;
        cb->recording = rec;
        rec->level = info->level;
        pool->buffers[pool->nbuffers++] = cb;
        out[made] = (VkCommandBuffer)cb;
    }
    if (result != VK_SUCCESS) { /* none made, as the specification asks */
        for (uint32_t i = 0; i < made; i++) {
            release(pool->buffers[--pool->nbuffers]);
            out[i] = VK_NULL_HANDLE;
        }
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_FreeCommandBuffers(VkDevice handle, VkCommandPool pool, uint32_t count,
                                                     const VkCommandBuffer *buffers)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_command_pool *found;
    pthread_mutex_lock(&device->lock);
    found = pool_of(device, pool);
    for (uint32_t k = 0; found != NULL && k < count; k++) {
        for (uint32_t i = 0; i < found->nbuffers; i++) {
            if ((void *)found->buffers[i] != (void *)buffers[k])
                continue; /* only one of this pool's is followed */
            drop(found->buffers[i]);
            found->buffers[i] = found->buffers[--found->nbuffers];
            break;
        }
    }
    pthread_mutex_unlock(&device->lock);
}

/* ---------------------------------------------------------------- lifecycle */

/* An implicit or explicit reset of ``cb`` (the device's lock held): never of one pending; from any pool
 * (the design essay above says why the pool's flag is not asked for). */
static VkResult reset(struct ls_icd_command_buffer *cb)
{
    if (cb->pending)
        return LS_ICD_INVALID;
    forget(cb);
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BeginCommandBuffer(VkCommandBuffer handle, const VkCommandBufferBeginInfo *info)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&cb->device->lock);
    if (cb->state != LS_ICD_CB_INITIAL)
        result = reset(cb);
    if (result == VK_SUCCESS) {
        cb->state = LS_ICD_CB_RECORDING;
        cb->usage = info->flags;
    }
    pthread_mutex_unlock(&cb->device->lock);
    return result;
}

/* ``cb``'s descriptors loaded as lists, or lists of the same loaded before (cache.c), held (the
 * device's lock held); VK_SUCCESS or why not. */
static VkResult load(struct ls_icd_command_buffer *cb)
{
    struct ls_icd_recording *rec = cb->recording;
    uint32_t wanted = (rec->ncommands + LIST_COMMANDS - 1) / LIST_COMMANDS;
    VkResult result = VK_SUCCESS;
    cb->lists = wanted ? calloc(wanted, sizeof(*cb->lists)) : NULL;
    if (wanted && cb->lists == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; result == VK_SUCCESS && i < wanted; i++) {
        uint32_t first = i * LIST_COMMANDS, n = rec->ncommands - first < LIST_COMMANDS ? rec->ncommands - first
                                                                                       : LIST_COMMANDS;
        struct ls_icd_cached *list;
        result = ls_icd_cache_list(cb->device, rec->commands + first, n, &list);
        if (result == VK_SUCCESS && ls_icd_keep_held(cb, list) < 0)
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
        if (result == VK_SUCCESS)
            cb->lists[cb->nlists++] = (uint32_t)ls_icd_cached_id(list);
    }
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EndCommandBuffer(VkCommandBuffer handle)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    struct ls_icd_recording *rec = cb->recording;
    VkResult result;
    pthread_mutex_lock(&cb->device->lock);
    if (cb->state != LS_ICD_CB_RECORDING) {
        result = LS_ICD_INVALID;
    } else {
        result = rec->error;
        if (result == VK_SUCCESS && rec->level == VK_COMMAND_BUFFER_LEVEL_PRIMARY) {
            result = load(cb);
            if (result != VK_SUCCESS)
                ls_icd_fail(cb, result, "the arbiter refused its command lists");
            free(rec->commands); /* at the arbiter now (or refused) */
            rec->commands = NULL;
            rec->ncommands = rec->capacity = 0;
        }
        cb->state = result == VK_SUCCESS ? LS_ICD_CB_EXECUTABLE : LS_ICD_CB_INVALID;
        cb->ended_after = cb->device->frees;
    }
    pthread_mutex_unlock(&cb->device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetCommandBuffer(VkCommandBuffer handle, VkCommandBufferResetFlags flags)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    VkResult result;
    (void)flags;
    pthread_mutex_lock(&cb->device->lock);
    result = reset(cb);
    pthread_mutex_unlock(&cb->device->lock);
    return result;
}

/* A submission of ``cb`` was answered: its events set and reset, in order (the device's lock held). */
static void apply_events(struct ls_icd_command_buffer *cb)
{
    for (uint32_t i = 0; i < cb->recording->nevents; i++)
        ls_icd_event_set(cb->device, cb->recording->events[i].event, cb->recording->events[i].value);
}

VkResult ls_icd_command_buffer_take(struct ls_icd_command_buffer *cb, const uint32_t **lists, uint32_t *nlists)
{
    struct ls_icd_recording *rec = cb->recording;
    if (cb->state != LS_ICD_CB_EXECUTABLE || rec->error != VK_SUCCESS ||
        rec->level != VK_COMMAND_BUFFER_LEVEL_PRIMARY ||
        (cb->pending && !(cb->usage & VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT)))
        return LS_ICD_INVALID;
    cb->pending++;
    *lists = cb->lists;
    *nlists = cb->nlists;
    return VK_SUCCESS;
}

void ls_icd_command_buffer_done(struct ls_icd_command_buffer *cb)
{
    if (cb->pending == 0)
        return;
    cb->pending--;
    apply_events(cb);
    if (cb->freed && cb->pending == 0)
        release(cb);
}

