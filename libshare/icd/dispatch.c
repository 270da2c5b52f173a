/* Dispatches recorded: the bound pipeline and descriptor sets, push constants, and the bind groups.
 *
 * vkCmdBindPipeline keeps the compute pipeline (the graphics bind point, or a wrong handle, is the
 * recording's error); vkCmdBindDescriptorSets keeps each set's handle at its number (0..31) with its
 * dynamic offsets (as many as the set's dynamic descriptors, in binding order, each element of an
 * array one; the count given must be exactly theirs); vkCmdPushConstants keeps the bytes (within
 * LS_MAX_PUSH, 128) for every later dispatch. vkCmdPushDescriptorSetKHR and its template form write the
 * command buffer's set of push descriptors for that number (template.c) and bind it as the set there;
 * a push that cannot be applied is the recording's error (LS_ICD_INVALID), named on stderr.
 *
 * vkCmdDispatch is one LS_OP_DISPATCH (nothing for a group count of 0, as Vulkan runs nothing) of
 * the pipeline's program, with the pipeline's push_size bytes of the push constants, and, when the
 * program binds buffers, flag LS_DESC_GROUP naming a bind group made for it: the descriptors of
 * the bound sets are read at the dispatch (Vulkan forbids changing a bound set before the
 * submission completes, so a snapshot then is what the device would read), one entry an element,
 * in the pipeline's ``resources`` order, each resolved by descriptor.c's ls_icd_descriptor_resolve:
 * its buffer's arbiter buffer, absolute offset (plus its dynamic offset) and range (clipped to the
 * VkBuffer's end; VK_WHOLE_SIZE: to it), or, for a texel buffer, its view's arbiter id (view.c) with
 * offset and range 0. The group is
 * {"op":"bind_group","program_id":P,"buffers":[[id,offset,range],...]}, or the one made before
 * for the same program over the same entries by any recording of the device (cache.c), held until
 * the recording is reset or freed (commands.c).
 *
 * vkCmdDispatchBase is the same dispatch with flag LS_DESC_BASE and its first workgroup after the
 * group's id (ring.h; the arbiter makes every pipeline with VK_PIPELINE_CREATE_DISPATCH_BASE_BIT, so
 * the application's flag changes nothing): a base plus its count past the device's
 * maxComputeWorkGroupCount, or a base for a pipeline that binds no buffer (it has no group to carry
 * the base), fails the recording with LS_ICD_INVALID, the one error vkEndCommandBuffer may give for
 * it; a base of 0 is a plain dispatch. vkCmdDispatchIndirect is one LS_OP_DISPATCH_INDIRECT whose
 * counts are the VkBuffer's memory at its absolute offset (12 bytes inside the buffer, the
 * offset a multiple of 4), clamped by the engine. No pipeline bound, a set not bound, freed or
 * of another layout's shape, a descriptor never written, a range past its buffer, or a group
 * the arbiter refused (QuotaExceeded: VK_ERROR_OUT_OF_DEVICE_MEMORY) is the recording's first
 * error (commands.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "descriptor.h"

#define MOST_ENTRIES 32u /* LS_ENGINE_MAX_BINDINGS: a bind group's entries */

/* The dynamic descriptors of a set of ``layout``. */
static uint32_t dynamic_count(const struct ls_icd_set_layout *layout)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < layout->nbindings; i++)
        if (ls_icd_descriptor_dynamic(layout->bindings[i].type))
            n += layout->bindings[i].count;
    return n;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBindPipeline(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                  VkPipeline pipeline)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    pthread_mutex_lock(&cb->device->lock);
    if (point != VK_PIPELINE_BIND_POINT_COMPUTE ||
        ls_icd_object_find(&cb->device->objects, (uint64_t)(uintptr_t)pipeline, LS_ICD_PIPELINE) == NULL)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdBindPipeline: not a compute pipeline");
    else
        cb->recording->pipeline = (uint64_t)(uintptr_t)pipeline;
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdBindDescriptorSets(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                        VkPipelineLayout layout, uint32_t first, uint32_t count,
                                                        const VkDescriptorSet *sets, uint32_t ndynamic,
                                                        const uint32_t *dynamic)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    struct ls_icd_recording *rec = cb->recording;
    uint32_t used = 0;
    (void)layout; /* a set's own layout copy says what it holds */
    pthread_mutex_lock(&cb->device->lock);
    if (point != VK_PIPELINE_BIND_POINT_COMPUTE || first > LS_ICD_MOST_SETS || count > LS_ICD_MOST_SETS - first) {
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdBindDescriptorSets: not the compute bind point, or past set 31");
        count = 0;
    }
    for (uint32_t k = 0; k < count; k++) {
        struct ls_icd_object *set = ls_icd_object_find(&cb->device->objects, (uint64_t)(uintptr_t)sets[k],
                                                       LS_ICD_DESCRIPTOR_SET);
        uint32_t n = set ? dynamic_count(&set->u.set.layout) : 0;
        if (set == NULL || n > LS_ICD_MOST_DYNAMIC || n > ndynamic - used) {
            ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdBindDescriptorSets: a wrong set, or too few dynamic offsets");
            break;
        }
        rec->sets[first + k] = (uint64_t)(uintptr_t)sets[k];
        if (n > 0)
            memcpy(rec->dynamic[first + k], dynamic + used, n * sizeof(*dynamic));
        used += n;
    }
    if (used != ndynamic)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdBindDescriptorSets: more dynamic offsets than the sets' descriptors");
    pthread_mutex_unlock(&cb->device->lock);
}

/* Bind command buffer cb's set of push descriptors ``set`` once ``why`` (the push's outcome) is NULL, else
 * fail the recording with it (the device's lock held). */
static void bind_pushed(struct ls_icd_command_buffer *cb, VkPipelineBindPoint point, uint32_t set, const char *why)
{
    if (why == NULL && point != VK_PIPELINE_BIND_POINT_COMPUTE)
        why = "not the compute bind point";
    if (why != NULL) {
        fprintf(stderr, "libshare Vulkan driver: a push of descriptors refused: %s\n", why);
        ls_icd_fail(cb, LS_ICD_INVALID, "a push of descriptors refused");
        return;
    }
    cb->recording->sets[set] = cb->recording->pushed[set];
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushDescriptorSetKHR(VkCommandBuffer handle, VkPipelineBindPoint point,
                                                          VkPipelineLayout layout, uint32_t set, uint32_t nwrites,
                                                          const VkWriteDescriptorSet *writes)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    pthread_mutex_lock(&cb->device->lock);
    bind_pushed(cb, point, set,
                set >= LS_ICD_MOST_SETS ? "past set 31"
                                        : ls_icd_push_writes(cb->device, &cb->recording->pushed[set],
                                                             (uint64_t)(uintptr_t)layout, set, nwrites, writes));
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushDescriptorSetWithTemplateKHR(VkCommandBuffer handle,
                                                                      VkDescriptorUpdateTemplate template,
                                                                      VkPipelineLayout layout, uint32_t set,
                                                                      const void *data)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    pthread_mutex_lock(&cb->device->lock);
    bind_pushed(cb, VK_PIPELINE_BIND_POINT_COMPUTE, set,
                set >= LS_ICD_MOST_SETS ? "past set 31"
                                        : ls_icd_push_template(cb->device, &cb->recording->pushed[set],
                                                               (uint64_t)(uintptr_t)template,
                                                               (uint64_t)(uintptr_t)layout, set, data));
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdPushConstants(VkCommandBuffer handle, VkPipelineLayout layout,
                                                   VkShaderStageFlags stages, uint32_t offset, uint32_t size,
                                                   const void *values)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    (void)layout, (void)stages;
    if (offset > LS_MAX_PUSH || size > LS_MAX_PUSH - offset || size == 0 || offset % 4 || size % 4 || !values)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdPushConstants: a range past 128 bytes, or not of words");
    else
        memcpy(cb->recording->push + offset, values, size);
}

/* Element ``element`` of ``binding`` of bound set ``number`` as a bind group's entry (the device's lock
 * held): 0, or -1 (the recording's error set). */
static int entry_of(struct ls_icd_command_buffer *cb, uint32_t number, uint32_t binding, uint32_t element,
                    uint64_t entry[3])
{
    struct ls_icd_recording *rec = cb->recording;
    struct ls_icd_object *set = number < LS_ICD_MOST_SETS
        ? ls_icd_object_find(&cb->device->objects, rec->sets[number], LS_ICD_DESCRIPTOR_SET) : NULL;
    const struct ls_icd_set_layout *layout;
    const struct ls_icd_descriptor *descriptor = NULL;
    uint32_t dynamic = 0, id;
    if (set == NULL) {
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch: its pipeline's descriptor set is not bound (or was freed)");
        return -1;
    }
    layout = &set->u.set.layout;
    for (uint32_t i = 0; i < layout->nbindings && descriptor == NULL; i++) {
        const struct ls_icd_layout_binding *b = &layout->bindings[i];
        if (b->binding == binding && element < b->count)
            descriptor = &set->u.set.entries[b->first + element];
        else if (ls_icd_descriptor_dynamic(b->type))
            dynamic += b->count;
    }
    if (descriptor == NULL || descriptor->buffer == 0) {
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch: a descriptor its pipeline reads is missing or never written");
        return -1;
    }
    if (descriptor->type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER ||
        descriptor->type == VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER) {  /* a view: [view_id, 0, 0] */
        int64_t view = ls_icd_view_id(cb->device, descriptor->buffer);
        if (view < 0)
            ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch: a texel buffer's view was destroyed, or its memory freed");
        entry[0] = (uint64_t)view, entry[1] = entry[2] = 0;
        return view < 0 ? -1 : 0;
    }
    if (ls_icd_descriptor_resolve(cb->device, descriptor,
                                  ls_icd_descriptor_dynamic(descriptor->type) ? rec->dynamic[number][dynamic + element] : 0, &id,
                                  &entry[1], &entry[2]) != VK_SUCCESS || entry[2] == 0) {
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch: a descriptor's buffer is gone, or its offset past its end");
        return -1;
    }
    entry[0] = id;
    return 0;
}

/* The bind group of ``pipeline`` over what the bound sets hold now (the device's lock held): one made
 * before over the same (cache.c), or made now, held by the recording; 0, or -1 (the recording's error set). */
static int group_of(struct ls_icd_command_buffer *cb, const struct ls_icd_pipeline *pipeline, uint32_t *group)
{
    uint64_t entries[3 * MOST_ENTRIES];
    uint32_t n = 0;
    struct ls_icd_cached *cached;
    VkResult result;
    if (pipeline->nbuffers > MOST_ENTRIES) {
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch: its pipeline binds more than 32 buffers");
        return -1;
    }
    for (uint32_t r = 0; r < pipeline->nresources; r++)
        for (uint32_t e = 0; e < pipeline->resources[r].count && n < MOST_ENTRIES; e++, n++)
            if (entry_of(cb, pipeline->resources[r].set, pipeline->resources[r].binding, e, &entries[3 * n]) < 0)
                return -1;
    result = ls_icd_cache_group(cb->device, pipeline->program_id, entries, n, &cached);
    if (result != VK_SUCCESS) {
        ls_icd_fail(cb, result, "the arbiter refused a dispatch's bind group");
        return -1;
    }
    if (ls_icd_keep_held(cb, cached) < 0)
        return -1;
    *group = (uint32_t)ls_icd_cached_id(cached);
    return 0;
}

/* One dispatch of the bound pipeline (the device's lock held): LS_OP_DISPATCH with groups (x, y, z) from
 * workgroup ``base`` (NULL: 0), or LS_OP_DISPATCH_INDIRECT with (buffer, offset low, offset high). */
static void dispatch(struct ls_icd_command_buffer *cb, uint32_t opcode, uint32_t x, uint32_t y, uint32_t z,
                     const uint32_t *base)
{
    struct ls_icd_object *object = ls_icd_object_find(&cb->device->objects, cb->recording->pipeline, LS_ICD_PIPELINE);
    const struct ls_icd_pipeline *pipeline;
    uint32_t named[4] = {0}, nbuffers = 0; /* the group's id, then the base (ring.h's LS_DESC_BASE) */
    struct ls_desc command;
    if (cb->recording->error != VK_SUCCESS)
        return;
    if (object == NULL) {
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch with no compute pipeline bound (or one destroyed)");
        return;
    }
    pipeline = &object->u.pipeline;
    if (base != NULL && pipeline->nbuffers == 0) {
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdDispatchBase: a base for a pipeline that binds no buffer");
        return;
    }
    if (pipeline->nbuffers > 0) {
        if (group_of(cb, pipeline, &named[0]) < 0)
            return;
        opcode |= (base != NULL ? LS_DESC_GROUP | LS_DESC_BASE : LS_DESC_GROUP) << 16;
        nbuffers = base != NULL ? 4 : 1;
        if (base != NULL)
            memcpy(&named[1], base, 3 * sizeof(*base));
    }
    if (ls_encode_op((char *)&command, opcode, (uint32_t)pipeline->program_id, x, y, z, nbuffers, named, 0, NULL,
                     cb->recording->push, pipeline->push_size) < 0)
        ls_icd_fail(cb, LS_ICD_INVALID, "a dispatch the ring cannot encode");
    else
        ls_icd_record(cb, &command);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatch(VkCommandBuffer handle, uint32_t x, uint32_t y, uint32_t z)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    if (x == 0 || y == 0 || z == 0)
        return; /* Vulkan runs nothing */
    pthread_mutex_lock(&cb->device->lock);
    dispatch(cb, LS_OP_DISPATCH, x, y, z, NULL);
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatchBase(VkCommandBuffer handle, uint32_t base_x, uint32_t base_y,
                                                  uint32_t base_z, uint32_t x, uint32_t y, uint32_t z)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    const uint32_t base[3] = {base_x, base_y, base_z}, count[3] = {x, y, z};
    const uint32_t *most = cb->device->seen.properties.limits.maxComputeWorkGroupCount;
    if (x == 0 || y == 0 || z == 0)
        return; /* Vulkan runs nothing */
    for (int k = 0; k < 3; k++)
        if ((uint64_t)base[k] + count[k] > most[k]) {
            ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdDispatchBase: a base plus its count past the device's limit");
            return;
        }
    pthread_mutex_lock(&cb->device->lock);
    dispatch(cb, LS_OP_DISPATCH, x, y, z, base_x || base_y || base_z ? base : NULL);
    pthread_mutex_unlock(&cb->device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_CmdDispatchIndirect(VkCommandBuffer handle, VkBuffer buffer, VkDeviceSize offset)
{
    struct ls_icd_command_buffer *cb = ls_icd_command_buffer_of(handle);
    uint32_t id;
    uint64_t at;
    pthread_mutex_lock(&cb->device->lock);
    if (offset % 4 || ls_icd_buffer_range(cb->device, (uint64_t)(uintptr_t)buffer, offset, 12, &id, &at) < 0)
        ls_icd_fail(cb, LS_ICD_INVALID, "vkCmdDispatchIndirect: a wrong buffer, or its counts outside it");
    else
        dispatch(cb, LS_OP_DISPATCH_INDIRECT, id, (uint32_t)at, (uint32_t)(at >> 32), NULL);
    pthread_mutex_unlock(&cb->device->lock);
}
