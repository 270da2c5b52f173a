/* The vkCmd* other than dispatches: copies, fills, updates, barriers, events, secondary command buffers.
 *
 * Each appends descriptors to the recording (commands.c; libshare/ring/ring.h's struct ls_desc,
 * encoded by ls_encode_op as the C API's ls_list_* do) over the arbiter's ids: a VkBuffer is its
 * memory's arbiter buffer at an absolute offset, every range checked inside the VkBuffer here (the
 * arbiter checks it again inside its buffer, engine/validate.c). vkCmdCopyBuffer is one LS_OP_COPY a
 * region (outside either buffer: invalid; of 0 bytes: none, as lavapipe copies nothing, though
 * Vulkan forbids it); vkCmdFillBuffer one LS_OP_FILL (offset a multiple of 4; the size, or
 * VK_WHOLE_SIZE's to the buffer's end, rounded down to 4 as lavapipe does: nothing when that is 0);
 * vkCmdUpdateBuffer (up to 65536 bytes, multiples of 4; 0: none, as in lavapipe) LS_OP_UPDATE
 * pieces of at most LS_MAX_PUSH bytes. vkCmdPipelineBarrier(2) and vkCmdWaitEvents(2) are one
 * LS_OP_BARRIER (never two in a row): every barrier is the full one, and the engine ends every
 * command with one anyway, so a list's order is already a barrier's (engine/lists.c, "Barriers");
 * an event waited on was set by an
 * earlier submission or the host. vkCmdSetEvent(2) and vkCmdResetEvent(2) check the event and are
 * remembered, in order, and applied when a submission of the command buffer is answered
 * (ls_icd_command_buffer_done, commands.c). vkCmdExecuteCommands inlines each executable secondary
 * command buffer's descriptors and events at that point, and holds its bind groups too (cache.c), so
 * resetting or freeing the secondary leaves the primary whole. vkCmdWriteTimestamp2KHR is query.c's vkCmdWriteTimestamp (the stage
 * aside: a timestamp is written once every command before it has ended). Any failure is the recording's first error (ls_icd_fail). */
#include <string.h>

#include "commands.h"

#define MOST_UPDATE 65536u /* vkCmdUpdateBuffer's dataSize */

VkResult ls_icd_encode(struct ls_icd_command_buffer *cb, uint32_t opcode, uint32_t nbuffers, const uint32_t *buffers,
                       uint32_t noffsets, const uint64_t *offsets, const void *push, uint32_t push_size)
{
    struct ls_desc command;
    if (ls_encode_op((char *)&command, opcode, 0, 0, 0, 0, nbuffers, buffers, noffsets, offsets, push, push_size) < 0)
        return ls_icd_fail(cb, LS_ICD_INVALID, "a command the ring cannot encode");
    return ls_icd_record(cb, &command);
}

/* ---------------------------------------------------------------- transfers */

/* The arbiter's buffer and absolute offset of [offset, offset + size) of VkBuffer ``buffer``, checked inside
 * it (the device's lock held): 0, or -1 for a wrong or unbound buffer or a range past it. */
int ls_icd_buffer_range(struct ls_icd_device *device, uint64_t buffer, uint64_t offset, uint64_t size, uint32_t *id,
                        uint64_t *at)
{
    struct ls_icd_object *view = ls_icd_object_find(&device->objects, buffer, LS_ICD_BUFFER), *memory;
    if (view == NULL || view->u.buffer.memory == 0)
        return -1;
    memory = ls_icd_object_find(&device->objects, view->u.buffer.memory, LS_ICD_MEMORY);
    if (memory == NULL || offset > view->u.buffer.size || size > view->u.buffer.size - offset)
        return -1;
    *id = (uint32_t)memory->u.memory.buffer_id;
    *at = view->u.buffer.offset + offset;
    return 0;
}

/* The size of VkBuffer ``buffer`` (the device's lock held), 0 when it is wrong. */
uint64_t ls_icd_buffer_size(struct ls_icd_device *device, uint64_t buffer)
{
    struct ls_icd_object *view = ls_icd_object_find(&device->objects, buffer, LS_ICD_BUFFER);
    return view ? view->u.buffer.size : 0;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdCopyBuffer(VkCommandBuffer handle, VkBuffer src, VkBuffer dst, uint32_t count,
                                                const VkBufferCopy *regions)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    pthread_mutex_lock(&cb->device->lock);
    for (uint32_t i = 0; i < count; i++) {
        uint32_t ids[2];
        uint64_t offsets[3] = {0, 0, regions[i].size};
        if (regions[i].size == 0)
            continue; /* nothing to copy: Vulkan forbids the region, lavapipe copies nothing */
        if (ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)src, regions[i].srcOffset, regions[i].size, &ids[0],
                                &offsets[0]) < 0 ||
            ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)dst, regions[i].dstOffset, regions[i].size, &ids[1],
                                &offsets[1]) < 0) {
            ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdCopyBuffer: a wrong buffer, or a region outside one");
            break;
        }
        if (ls_icd_encode(cb, LS_OP_COPY, 2, ids, 3, offsets, NULL, 0) != VK_SUCCESS)
            break;
    }
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdFillBuffer(VkCommandBuffer handle, VkBuffer dst, VkDeviceSize offset,
                                                VkDeviceSize size, uint32_t data)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    uint64_t whole, offsets[2];
    uint32_t id;
    pthread_mutex_lock(&cb->device->lock);
    whole = ls_icd_buffer_size(cb->device, (uint64_t)(uintptr_t)dst);
    if (size == VK_WHOLE_SIZE && offset <= whole)
        size = whole - offset;
    size &= ~(uint64_t)3; /* whole words, as lavapipe rounds a size Vulkan forbids */
    if (offset % 4 != 0 ||
        ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)dst, offset, size, &id, &offsets[0]) < 0)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdFillBuffer: a wrong buffer, a range outside it, or an offset not of words");
    else if (size != 0) {
        offsets[1] = size;
        ls_icd_encode(cb, LS_OP_FILL, 1, &id, 2, offsets, &data, sizeof(data));
    }
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdUpdateBuffer(VkCommandBuffer handle, VkBuffer dst, VkDeviceSize offset,
                                                  VkDeviceSize size, const void *data)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    uint64_t at = 0;
    uint32_t id = 0;
    pthread_mutex_lock(&cb->device->lock);
    /* 0 bytes: no piece below, as lavapipe writes nothing (Vulkan forbids it) */
    if (size != 0 && (size > MOST_UPDATE || size % 4 != 0 || offset % 4 != 0 || data == NULL ||
                      ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)dst, offset, size, &id, &at) < 0))
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdUpdateBuffer: a wrong buffer, a range outside it, or past 65536 bytes");
    for (uint64_t done = 0; cb->recording->error == VK_SUCCESS && done < size; done += LS_MAX_PUSH) {
        uint64_t piece_at = at + done;
        uint32_t piece = size - done < LS_MAX_PUSH ? (uint32_t)(size - done) : LS_MAX_PUSH;
        ls_icd_encode(cb, LS_OP_UPDATE, 1, &id, 1, &piece_at, (const uint8_t *)data + done, piece);
    }
    pthread_mutex_unlock(&cb->device->lock);
}

VkResult ls_icd_record_barrier(struct ls_icd_command_buffer *cb)
{
    struct ls_icd_recording *rec = cb->recording;
    if (rec->ncommands > 0 && rec->commands[rec->ncommands - 1].opcode == LS_OP_BARRIER)
        return VK_SUCCESS; /* one is enough */
    return ls_icd_encode(cb, LS_OP_BARRIER, 0, NULL, 0, NULL, NULL, 0);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPipelineBarrier(VkCommandBuffer handle, VkPipelineStageFlags src,
                                                     VkPipelineStageFlags dst, VkDependencyFlags flags,
                                                     uint32_t nmemory, const VkMemoryBarrier *memory,
                                                     uint32_t nbuffer, const VkBufferMemoryBarrier *buffer,
                                                     uint32_t nimage, const VkImageMemoryBarrier *image)
{
    (void)src, (void)dst, (void)flags, (void)nmemory, (void)memory, (void)nbuffer, (void)buffer, (void)nimage,
        (void)image; /* every barrier is the full one */
    ls_icd_record_barrier(ls_icd_command_buffer_of(handle));
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPipelineBarrier2(VkCommandBuffer handle, const VkDependencyInfo *info)
{
    (void)info;
    ls_icd_record_barrier(ls_icd_command_buffer_of(handle));
}

/* ---------------------------------------------------------------- events and secondaries */

static void event_op(struct ls_icd_command_buffer *cb, VkEvent event, int value)
{
    struct ls_icd_recording *rec = cb->recording;
    pthread_mutex_lock(&cb->device->lock);
    if (cb->state != LS_ICD_CB_RECORDING || rec->error != VK_SUCCESS)
        ;
    else if (ls_icd_object_find(&cb->device->objects, (uint64_t)(uintptr_t)event, LS_ICD_EVENT) == NULL)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdSetEvent or vkCmdResetEvent: a wrong event");
    else if (ls_icd_grow((void **)&rec->events, &rec->event_capacity, rec->nevents + 1, sizeof(*rec->events)) < 0)
        ls_icd_fail(cb, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
    else
        rec->events[rec->nevents++] = (struct ls_icd_event_op){(uint64_t)(uintptr_t)event, value};
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdSetEvent(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags stages)
{
    (void)stages;
    event_op(ls_icd_command_buffer_of(handle), event, 1);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetEvent(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags stages)
{
    (void)stages;
    event_op(ls_icd_command_buffer_of(handle), event, 0);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdSetEvent2(VkCommandBuffer handle, VkEvent event, const VkDependencyInfo *info)
{
    (void)info;
    event_op(ls_icd_command_buffer_of(handle), event, 1);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdResetEvent2(VkCommandBuffer handle, VkEvent event, VkPipelineStageFlags2 stages)
{
    (void)stages;
    event_op(ls_icd_command_buffer_of(handle), event, 0);
}

/* A wait on events: the events were set by earlier submissions or the host, and this submission's
 * commands run in order; what is left is the barrier. */
VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWaitEvents(VkCommandBuffer handle, uint32_t count, const VkEvent *events,
                                                VkPipelineStageFlags src, VkPipelineStageFlags dst, uint32_t nmemory,
                                                const VkMemoryBarrier *memory, uint32_t nbuffer,
                                                const VkBufferMemoryBarrier *buffer, uint32_t nimage,
                                                const VkImageMemoryBarrier *image)
{
    (void)count, (void)events, (void)src, (void)dst, (void)nmemory, (void)memory, (void)nbuffer, (void)buffer,
        (void)nimage, (void)image;
    ls_icd_record_barrier(ls_icd_command_buffer_of(handle));
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWaitEvents2(VkCommandBuffer handle, uint32_t count, const VkEvent *events,
                                                 const VkDependencyInfo *infos)
{
    (void)count, (void)events, (void)infos;
    ls_icd_record_barrier(ls_icd_command_buffer_of(handle));
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdWriteTimestamp2(VkCommandBuffer handle, VkPipelineStageFlags2 stage,
                                                     VkQueryPool pool, uint32_t query)
{
    (void)stage;
    ls_icd_CmdWriteTimestamp(handle, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, query);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdExecuteCommands(VkCommandBuffer handle, uint32_t count,
                                                     const VkCommandBuffer *secondaries)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle), *inner;
    struct ls_icd_recording *rec = cb->recording;
    pthread_mutex_lock(&cb->device->lock);
    for (uint32_t k = 0; k < count && rec->error == VK_SUCCESS; k++) {
        inner = ls_icd_command_buffer_find(cb->device, secondaries[k]);
        if (inner == NULL || inner == cb || inner->state != LS_ICD_CB_EXECUTABLE ||
            inner->recording->level != VK_COMMAND_BUFFER_LEVEL_SECONDARY) {
            ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdExecuteCommands: not an executable secondary command buffer");
            break;
        }
        for (uint32_t i = 0; i < inner->recording->ncommands && rec->error == VK_SUCCESS; i++)
            ls_icd_record(cb, &inner->recording->commands[i]);
        for (uint32_t i = 0; i < inner->recording->nheld && rec->error == VK_SUCCESS; i++) {
            ls_icd_cache_hold(inner->recording->held[i]); /* its groups: the primary's too */
            ls_icd_keep_held(cb, inner->recording->held[i]);
        }
        for (uint32_t i = 0; i < inner->recording->nevents && rec->error == VK_SUCCESS; i++) {
            if (ls_icd_grow((void **)&rec->events, &rec->event_capacity, rec->nevents + 1, sizeof(*rec->events)) < 0)
                ls_icd_fail(cb, VK_ERROR_OUT_OF_HOST_MEMORY, "out of memory");
            else
                rec->events[rec->nevents++] = inner->recording->events[i];
        }
    }
    pthread_mutex_unlock(&cb->device->lock);
}
