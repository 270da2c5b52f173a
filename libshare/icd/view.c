/* VkBufferView: a texel view of part of a buffer, made at the arbiter (serve/views.py).
 *
 * vkCreateBufferView checks the view before it asks: a buffer bound to live memory, no flags, a
 * format the welcome lists (hello.c: the texel formats the arbiter's device makes a view of, whose
 * buffer features physical.c reports), an offset inside the buffer and a multiple of the device's
 * minTexelBufferOffsetAlignment, and a range (VK_WHOLE_SIZE: the whole texels from the offset to the
 * buffer's end) of whole texels, inside the buffer, at most maxTexelBufferElements of them. Anything
 * else is LS_ICD_INVALID, since the specification gives the command no error for invalid use. It then
 * sends {"op":"view","buffer_id":B,"format":NAME,"offset":O,"size":S}, O the buffer's offset in its
 * memory plus the view's, and keeps the reply's view_id: the arbiter checks the same again, and a
 * refusal is LS_ICD_INVALID (QuotaExceeded: VK_ERROR_OUT_OF_DEVICE_MEMORY).
 *
 * A texel descriptor (descriptor.c) holds the view's handle, checked when written (ls_icd_view_wrong:
 * a live view whose format serves that kind of texel buffer), and a dispatch puts the view's id in
 * its bind group (dispatch.c: [view_id, 0, 0], as the arbiter's groups name a view). The arbiter
 * frees a buffer's views with it, so vkFreeMemory orphans the views of that memory first
 * (ls_icd_views_orphan): the bind groups and lists naming them are dropped (cache.c), the ledger
 * forgets them (reattach.c), and a dispatch through one later fails its recording. Finding them
 * walks the device's objects, so the device counts its live views (device->views) and a device
 * with none (most applications make no view, and some free memory at every step) skips the walk. vkDestroyBufferView
 * drops the same and frees the view at the arbiter. A view is filed in the ledger like a buffer, so a
 * device that moves to a new arbiter makes it again under its id, after its memory. */
#define _GNU_SOURCE
#include <stdio.h>

#include "cache.h"
#include "descriptor.h"
#include "icd.h"
#include "reattach.h"

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_object *find(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    return ls_icd_object_find(&device->objects, handle, kind);
}

/* The arbiter's view request for ``info`` into ``text`` (the lock held): its uses, or 0 when invalid. */
static uint32_t view_request(struct ls_icd_device *device, const VkBufferViewCreateInfo *info, char *text,
                             size_t room, int64_t *buffer_id)
{
    const VkPhysicalDeviceLimits *limits = &device->seen.properties.limits;
    const struct ls_icd_texel_format *texel = ls_icd_texel_format(&device->seen, info->format);
    struct ls_icd_object *buffer = find(device, (uint64_t)(uintptr_t)info->buffer, LS_ICD_BUFFER);
    struct ls_icd_object *memory = buffer ? find(device, buffer->u.buffer.memory, LS_ICD_MEMORY) : NULL;
    uint64_t alignment = limits->minTexelBufferOffsetAlignment, size, left, range;
    if (info->flags != 0 || texel == NULL || memory == NULL || memory->u.memory.buffer_id < 0)
        return 0;
    size = buffer->u.buffer.size;
    if (info->offset >= size || (alignment > 1 && info->offset % alignment != 0))
        return 0;
    left = size - info->offset;
    range = info->range == VK_WHOLE_SIZE ? left - left % texel->texel_bytes : info->range;
    if (range == 0 || range > left || range % texel->texel_bytes != 0 ||
        range / texel->texel_bytes > limits->maxTexelBufferElements)
        return 0;
    *buffer_id = memory->u.memory.buffer_id;
    snprintf(text, room, "{\"op\":\"view\",\"buffer_id\":%lld,\"format\":\"%s\",\"offset\":%llu,\"size\":%llu}",
             (long long)*buffer_id, texel->name, (unsigned long long)(buffer->u.buffer.offset + info->offset),
             (unsigned long long)range);
    return texel->uses;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateBufferView(VkDevice handle, const VkBufferViewCreateInfo *info,
                                                       const VkAllocationCallbacks *allocator, VkBufferView *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_view view = {.view_id = -1};
    struct ls_icd_frame frame;
    cJSON *reply = NULL;
    char text[256];
    uint64_t made = 0;
    VkResult result = LS_ICD_INVALID;
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    view.uses = view_request(device, info, text, sizeof(text), &view.buffer_id);
    if (view.uses) {
        result = ls_icd_ask(device, text, NULL, 0, &frame, 0, &reply, LS_ICD_INVALID);
        view.view_id = result == VK_SUCCESS ? ls_icd_whole_field(reply, "view_id", 1, 2147483647.0) : -1;
        if (result == VK_SUCCESS && view.view_id < 0)
            result = LS_ICD_INVALID; /* (a reply without a usable id: nothing to name it by) */
        cJSON_Delete(reply);
        ls_icd_frame_free(&frame);
    }
    if (result == VK_SUCCESS && (made = ls_icd_object_new(&device->objects, LS_ICD_VIEW)) == 0) {
        ls_icd_forget(device, "view_id", view.view_id);
        result = VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (made) {
        find(device, made, LS_ICD_VIEW)->u.view = view;
        device->views++;
        *out = (VkBufferView)(uintptr_t)made;
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyBufferView(VkDevice handle, VkBufferView view,
                                                    const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    object = find(device, (uint64_t)(uintptr_t)view, LS_ICD_VIEW);
    if (object != NULL) {
        if (object->u.view.view_id >= 0) {
            ls_icd_cache_drop_buffer(device, object->u.view.view_id); /* (one id space: groups name views so) */
            ls_icd_forget(device, "view_id", object->u.view.view_id);
            device->views--;
        }
        ls_icd_object_drop(&device->objects, (uint64_t)(uintptr_t)view);
    }
    pthread_mutex_unlock(&device->lock);
}

void ls_icd_views_orphan(struct ls_icd_device *device, int64_t buffer_id)
{
    for (uint32_t slot = 0; device->views > 0 && slot < device->objects.used; slot++) {
        struct ls_icd_object *object = &device->objects.slots[slot];
        if (object->kind != LS_ICD_VIEW || object->u.view.buffer_id != buffer_id || object->u.view.view_id < 0)
            continue;
        ls_icd_cache_drop_buffer(device, object->u.view.view_id);
        ls_icd_unkeep(device, object->u.view.view_id);
        object->u.view.view_id = -1;
        device->views--;
    }
}

const char *ls_icd_view_wrong(struct ls_icd_device *device, VkDescriptorType type, uint64_t handle)
{
    struct ls_icd_object *object = find(device, handle, LS_ICD_VIEW);
    uint32_t use = type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER ? LS_ICD_TEXEL_STORAGE : LS_ICD_TEXEL_UNIFORM;
    if (object == NULL)
        return "no such buffer view";
    if (object->u.view.view_id < 0)
        return "the buffer view's memory was freed";
    if (!(object->u.view.uses & use))
        return "the buffer view's format serves no texel buffer of that type";
    return NULL;
}

int64_t ls_icd_view_id(struct ls_icd_device *device, uint64_t handle)
{
    struct ls_icd_object *object = find(device, handle, LS_ICD_VIEW);
    return object != NULL ? object->u.view.view_id : -1;
}
