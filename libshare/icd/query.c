/* VkQueryPool: timestamp queries, written by the arbiter's engine into a buffer the driver reads.
 *
 * A query pool is an object of the device's table holding an arbiter shared buffer of 16 bytes a
 * query (memory.c's ls_icd_memory_shared: the memfd mapped, as host-visible memory is): query k's
 * timestamp, a uint64 at 16 k, and its availability, a uint64 at 16 k + 8 (0 unavailable, 1
 * written). Only VK_QUERY_TYPE_TIMESTAMP is offered, on a queue with timestamps (the welcome's
 * timestampValidBits): any other type, or a queue without them, is VK_ERROR_FEATURE_NOT_PRESENT.
 * A new pool's bytes are the memfd's zeros: every query unavailable; vkResetQueryPool (Vulkan 1.2's
 * reset from the host) zeroes its queries' slots again.
 *
 * Recorded into a command buffer through ls_icd_record (commands.c), each over the pool's buffer
 * id as the engine's commands are (libshare/ring/ring.h):
 *   vkCmdResetQueryPool        one LS_OP_FILL of zeros over the queries' 16-byte slots;
 *   vkCmdWriteTimestamp        one LS_OP_TIMESTAMP into the query's slot: the engine writes the
 *                              device's timestamp once the commands before it have ended (any stage
 *                              asked is honoured by the bottom of the pipe, which is later) and a
 *                              1 beside it (engine/recordings.c, "Timestamps");
 *   vkCmdCopyQueryPoolResults  LS_OP_COPYs from the pool's buffer into the VkBuffer's range: 64-bit
 *                              results are each query's 8 bytes (16 with its availability, the
 *                              pool's own layout), 32-bit ones the low 4 bytes of each word (the
 *                              value, then the availability when asked). Each command of a list runs
 *                              after the one before has ended and its writes are seen, so WAIT_BIT
 *                              costs nothing; a query still unavailable when the copy runs (never
 *                              written since its reset) copies its 0 (where Vulkan would write
 *                              nothing, PARTIAL aside), and its availability, when asked, says 0;
 *   vkCmdBeginQuery, vkCmdEndQuery  the recording's error (VK_ERROR_FEATURE_NOT_PRESENT): no
 *                              occlusion or pipeline-statistics queries are offered.
 * A wrong pool, a query range past it, a destination range past its VkBuffer, a stride or offset
 * misaligned (8 for 64-bit results, 4 for 32-bit), or a stride of 0 for several queries makes the
 * recording invalid (ls_icd_fail: vkEndCommandBuffer answers LS_ICD_INVALID).
 *
 * vkGetQueryPoolResults reads the mapping: each query's availability first (an acquire load, pairing
 * with the engine's record_barrier after vkCmdCopyQueryPoolResults, whose second scope holds the
 * host's reads), then its value; 64-bit or the low 32 bits, WITH_AVAILABILITY, PARTIAL (an unavailable
 * query's value written as 0). Without WAIT_BIT an unavailable query's value is left alone and the
 * answer is VK_NOT_READY. With WAIT_BIT it waits until every query asked is available, on the queue's
 * completions (queue.c's ls_icd_path_wait, as vkQueueWaitIdle does: the device's lock released while it
 * sleeps, each answer filed looked at again); when nothing queued could make them available (a query
 * never written since its reset) it answers VK_NOT_READY rather than hang, and VK_ERROR_DEVICE_LOST
 * once the device is lost. */
#define _GNU_SOURCE
#include <string.h>

#include "commands.h"
#include "sync.h"

#define QUERY_BYTES 16u               /* a query's slot: the timestamp, then its availability */
#define MOST_QUERIES 65536u           /* queries a pool holds (1 MiB of slots) */

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_query_pool *pool_of(struct ls_icd_device *device, VkQueryPool pool)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)pool, LS_ICD_QUERY_POOL);
    return object ? &object->u.query_pool : NULL;
}

/* Whether queries [first, first + count) are all inside pool (count may be 0). */
static int inside(const struct ls_icd_query_pool *pool, uint32_t first, uint32_t count)
{
    return pool != NULL && first <= pool->count && count <= pool->count - first;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateQueryPool(VkDevice handle, const VkQueryPoolCreateInfo *info,
                                                      const VkAllocationCallbacks *allocator, VkQueryPool *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_query_pool pool = {.count = info->queryCount};
    uint64_t made;
    VkResult result;
    (void)allocator;
    if (info->queryType != VK_QUERY_TYPE_TIMESTAMP || device->seen.timestamp_valid_bits == 0)
        return VK_ERROR_FEATURE_NOT_PRESENT;
    if (info->queryCount == 0 || info->queryCount > MOST_QUERIES || info->flags != 0)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    made = ls_icd_object_new(&device->objects, LS_ICD_QUERY_POOL);
    result = made ? ls_icd_memory_shared(device, (uint64_t)pool.count * QUERY_BYTES, &pool.memory)
                  : VK_ERROR_OUT_OF_HOST_MEMORY;
    if (result == VK_SUCCESS) {
        ls_icd_object_find(&device->objects, made, LS_ICD_QUERY_POOL)->u.query_pool = pool;
        *out = (VkQueryPool)(uintptr_t)made;
    } else if (made) {
        ls_icd_object_drop(&device->objects, made);
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* A pool's shared buffer given back (the lock held). */
static void release_pool(struct ls_icd_device *device, struct ls_icd_object *object)
{
    ls_icd_memory_release(device, &object->u.query_pool.memory);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyQueryPool(VkDevice handle, VkQueryPool pool,
                                                   const VkAllocationCallbacks *allocator)
{
    (void)allocator; /* (a wrong handle: nothing to destroy) */
    ls_icd_object_destroy_with(device_of(handle), (uint64_t)(uintptr_t)pool, LS_ICD_QUERY_POOL, release_pool);
}

/* ---------------------------------------------------------------- results on the host */

struct wanted {
    uint64_t pool;
    uint32_t first, count;
};

/* Whether every query ``arg`` (a struct wanted) names is available (the device's lock held): VK_SUCCESS,
 * VK_NOT_READY, or LS_ICD_INVALID once the pool is gone. */
static VkResult available(struct ls_icd_device *device, const void *arg)
{
    const struct wanted *w = arg;
    struct ls_icd_query_pool *pool = pool_of(device, (VkQueryPool)(uintptr_t)w->pool);
    if (!inside(pool, w->first, w->count))
        return LS_ICD_INVALID;
    const uint64_t *words = (const uint64_t *)pool->memory.address;
    for (uint32_t k = w->first; k < w->first + w->count; k++)
        if (ls_load_acquire(&words[2 * k + 1]) != 1) /* pairs with the engine's record_barrier (host read) */
            return VK_NOT_READY;
    return VK_SUCCESS;
}

/* WAIT_BIT's wait (the device's lock held, released while it sleeps on the queue's completions: queue.c's
 * ls_icd_path_wait): VK_SUCCESS, VK_NOT_READY when nothing queued could make them available,
 * VK_ERROR_DEVICE_LOST, or LS_ICD_INVALID. */
static VkResult wait_available(struct ls_icd_device *device, const struct wanted *w)
{
    VkResult result = ls_icd_path_wait(device, UINT64_MAX, available, w);
    return result == VK_TIMEOUT ? VK_NOT_READY : result;
}

/* Write ``value`` as a 32- or 64-bit result at ``at``. */
static void put(uint8_t *at, uint64_t value, int wide)
{
    uint32_t low = (uint32_t)value;
    if (wide)
        memcpy(at, &value, sizeof(value));
    else
        memcpy(at, &low, sizeof(low));
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetQueryPoolResults(VkDevice handle, VkQueryPool pool, uint32_t first,
                                                          uint32_t count, size_t size, void *data,
                                                          VkDeviceSize stride, VkQueryResultFlags flags)
{
    struct ls_icd_device *device = device_of(handle);
    struct wanted w = {(uint64_t)(uintptr_t)pool, first, count};
    int wide = (flags & VK_QUERY_RESULT_64_BIT) != 0, with = (flags & VK_QUERY_RESULT_WITH_AVAILABILITY_BIT) != 0;
    uint64_t one = (wide ? 8u : 4u) * (with ? 2u : 1u);
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    struct ls_icd_query_pool *found = pool_of(device, pool);
    if (!inside(found, first, count) || data == NULL || stride % (wide ? 8 : 4) != 0 ||
        (count > 1 && stride < one) || (count > 0 && (count - 1) * stride + one > size) ||
        (flags & ~(VkQueryResultFlags)(VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT |
                                        VK_QUERY_RESULT_WITH_AVAILABILITY_BIT | VK_QUERY_RESULT_PARTIAL_BIT))) {
        pthread_mutex_unlock(&device->lock);
        return LS_ICD_INVALID;
    }
    if (flags & VK_QUERY_RESULT_WAIT_BIT)
        result = wait_available(device, &w);
    found = pool_of(device, pool);      /* (the lock was let go while waiting) */
    if (result == VK_ERROR_DEVICE_LOST || result == LS_ICD_INVALID || !inside(found, first, count)) {
        pthread_mutex_unlock(&device->lock);
        return result == VK_ERROR_DEVICE_LOST ? result : LS_ICD_INVALID;
    }
    result = VK_SUCCESS;
    const uint64_t *words = (const uint64_t *)found->memory.address;
    for (uint32_t k = 0; k < count; k++) {
        uint8_t *at = (uint8_t *)data + k * stride;
        uint64_t ready = ls_load_acquire(&words[2 * (first + k) + 1]); /* pairs with the engine's record_barrier */
        if (ready == 1)
            put(at, words[2 * (first + k)], wide);
        else if (flags & VK_QUERY_RESULT_PARTIAL_BIT)
            put(at, 0, wide);
        else
            result = VK_NOT_READY;
        if (with)
            put(at + (wide ? 8 : 4), ready == 1, wide);
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* vkResetQueryPool (Vulkan 1.2, VK_EXT_host_query_reset): the queries' slots zeroed on the host (a
 * wrong pool, or queries outside it: nothing; the command returns nothing). */
VKAPI_ATTR void VKAPI_CALL ls_icd_ResetQueryPool(VkDevice handle, VkQueryPool pool, uint32_t first, uint32_t count)
{
    struct ls_icd_device *device = (struct ls_icd_device *)handle;
    struct ls_icd_query_pool *found;
    pthread_mutex_lock(&device->lock);
    found = pool_of(device, pool);
    if (inside(found, first, count) && found->memory.address != NULL)
        memset((char *)found->memory.address + (size_t)first * QUERY_BYTES, 0, (size_t)count * QUERY_BYTES);
    pthread_mutex_unlock(&device->lock);
}

/* ---------------------------------------------------------------- recorded */

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetQueryPool(VkCommandBuffer handle, VkQueryPool pool, uint32_t first,
                                                    uint32_t count)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    uint32_t zero = 0;
    pthread_mutex_lock(&cb->device->lock);
    struct ls_icd_query_pool *found = pool_of(cb->device, pool);
    if (!inside(found, first, count) || count == 0) {
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdResetQueryPool: a wrong pool, or queries outside it");
    } else {
        uint32_t id = (uint32_t)found->memory.buffer_id;
        uint64_t offsets[2] = {(uint64_t)first * QUERY_BYTES, (uint64_t)count * QUERY_BYTES};
        ls_icd_encode(cb, LS_OP_FILL, 1, &id, 2, offsets, &zero, sizeof(zero));
    }
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWriteTimestamp(VkCommandBuffer handle, VkPipelineStageFlagBits stage,
                                                    VkQueryPool pool, uint32_t query)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    (void)stage; /* written once every command before it has ended: no stage is earlier than that */
    pthread_mutex_lock(&cb->device->lock);
    struct ls_icd_query_pool *found = pool_of(cb->device, pool);
    if (!inside(found, query, 1)) {
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdWriteTimestamp: a wrong pool, or a query outside it");
    } else {
        uint32_t id = (uint32_t)found->memory.buffer_id;
        uint64_t at = (uint64_t)query * QUERY_BYTES;
        ls_icd_encode(cb, LS_OP_TIMESTAMP, 1, &id, 1, &at, NULL, 0);
    }
    pthread_mutex_unlock(&cb->device->lock);
}

/* Copy ``size`` bytes at ``from`` of pool buffer ``id`` to ``to`` of arbiter buffer ``dst`` (an LS_OP_COPY). */
static VkResult copy(struct ls_icd_command_buffer *cb, uint32_t id, uint64_t from, uint32_t dst, uint64_t to,
                     uint64_t size)
{
    uint32_t ids[2] = {id, dst};
    uint64_t offsets[3] = {from, to, size};
    return ls_icd_encode(cb, LS_OP_COPY, 2, ids, 3, offsets, NULL, 0);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdCopyQueryPoolResults(VkCommandBuffer handle, VkQueryPool pool, uint32_t first,
                                                          uint32_t count, VkBuffer buffer, VkDeviceSize offset,
                                                          VkDeviceSize stride, VkQueryResultFlags flags)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    int wide = (flags & VK_QUERY_RESULT_64_BIT) != 0, with = (flags & VK_QUERY_RESULT_WITH_AVAILABILITY_BIT) != 0;
    uint64_t word = wide ? 8 : 4, one = word * (with ? 2 : 1), extent, at;
    uint32_t dst;
    pthread_mutex_lock(&cb->device->lock);
    struct ls_icd_query_pool *found = pool_of(cb->device, pool);
    extent = count > 0 && stride <= (UINT64_MAX - one) / count ? (uint64_t)(count - 1) * stride + one : 0;
    if (!inside(found, first, count) || count == 0 || offset % word != 0 || stride % word != 0 ||
        (count > 1 && stride < one) || extent == 0 ||
        ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)buffer, offset, extent, &dst, &at) < 0) {
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdCopyQueryPoolResults: a wrong pool or buffer, queries outside the "
                    "pool, a range outside the buffer, or a misaligned offset or stride");
        pthread_mutex_unlock(&cb->device->lock);
        return;
    }
    uint32_t id = (uint32_t)found->memory.buffer_id;
    VkResult result = VK_SUCCESS;
    for (uint32_t k = 0; k < count && result == VK_SUCCESS; k++) {
        uint64_t from = (uint64_t)(first + k) * QUERY_BYTES, to = at + k * stride;
        if (wide) {                     /* the pool's own layout: the stamp, then its availability */
            result = copy(cb, id, from, dst, to, one);
        } else {                        /* the low 4 bytes of each word (little-endian) */
            result = copy(cb, id, from, dst, to, 4);
            if (with && result == VK_SUCCESS)
                result = copy(cb, id, from + 8, dst, to + 4, 4);
        }
    }
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBeginQuery(VkCommandBuffer handle, VkQueryPool pool, uint32_t query,
                                                VkQueryControlFlags flags)
{
    (void)pool, (void)query, (void)flags;
    ls_icd_fail(ls_icd_command_buffer_of(handle), VK_ERROR_FEATURE_NOT_PRESENT,
                "vkCmdBeginQuery: no occlusion or pipeline-statistics queries are offered");
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdEndQuery(VkCommandBuffer handle, VkQueryPool pool, uint32_t query)
{
    (void)pool, (void)query;
    ls_icd_fail(ls_icd_command_buffer_of(handle), VK_ERROR_FEATURE_NOT_PRESENT,
                "vkCmdEndQuery: no occlusion or pipeline-statistics queries are offered");
}
