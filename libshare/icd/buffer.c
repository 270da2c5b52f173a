/* VkBuffer: a (memory, offset, size) view of one VkDeviceMemory, checked by the driver.
 *
 * A buffer is made unbound (its size from 1 byte to the device's largest allocation; no sparse
 * binding, no shared queue families beyond the one); its requirements are its size rounded up to
 * the device's alignment (device.c), in either memory type. vkBindBufferMemory checks the
 * binding: a buffer bound once, memory that exists, an offset aligned, and the buffer's
 * requirements inside the memory from that offset; any other binding is LS_ICD_INVALID
 * (VK_ERROR_UNKNOWN), and vkBindBufferMemory2 stops at its first wrong binding. A buffer whose
 * memory was freed keeps a handle that no longer finds it: the command lists to come will refuse
 * it. */
#include <string.h>

#include "icd.h"

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static uint64_t required(const struct ls_icd_device *device, uint64_t size)
{
    return (size + device->alignment - 1) / device->alignment * device->alignment;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateBuffer(VkDevice handle, const VkBufferCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkBuffer *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_buffer made = {.size = info->size};
    uint64_t buffer;
    VkResult result;
    (void)allocator;
    if (info->size == 0 || info->size > device->seen.max_allocation || info->flags != 0)
        return LS_ICD_INVALID; /* (flags: sparse or protected, neither offered) */
    result = ls_icd_object_create(device, LS_ICD_BUFFER, &made, sizeof(made), &buffer);
    if (result == VK_SUCCESS)
        *out = (VkBuffer)(uintptr_t)buffer;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyBuffer(VkDevice handle, VkBuffer buffer, const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy(device_of(handle), (uint64_t)(uintptr_t)buffer, LS_ICD_BUFFER);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetBufferMemoryRequirements(VkDevice handle, VkBuffer buffer,
                                                              VkMemoryRequirements *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    memset(out, 0, sizeof(*out)); /* a wrong handle: no memory type fits it */
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)buffer, LS_ICD_BUFFER);
    if (object != NULL) {
        out->size = required(device, object->u.buffer.size);
        out->alignment = device->alignment;
        out->memoryTypeBits = 0x3; /* device-local and host-visible alike */
    }
    pthread_mutex_unlock(&device->lock);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetBufferMemoryRequirements2(VkDevice handle,
                                                               const VkBufferMemoryRequirementsInfo2 *info,
                                                               VkMemoryRequirements2 *out)
{
    ls_icd_GetBufferMemoryRequirements(handle, info->buffer, &out->memoryRequirements);
    for (VkBaseOutStructure *next = out->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_MEMORY_DEDICATED_REQUIREMENTS) {
            VkMemoryDedicatedRequirements *dedicated = (VkMemoryDedicatedRequirements *)next;
            dedicated->prefersDedicatedAllocation = VK_FALSE;
            dedicated->requiresDedicatedAllocation = VK_FALSE;
        }
    }
}

static VkResult bind(struct ls_icd_device *device, VkBuffer buffer, VkDeviceMemory memory, VkDeviceSize offset)
{
    struct ls_icd_object *bound = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)buffer, LS_ICD_BUFFER);
    struct ls_icd_object *into = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY);
    uint64_t size;
    if (bound == NULL || into == NULL || bound->u.buffer.memory != 0 || offset % device->alignment != 0 ||
        offset > into->u.memory.size)
        return LS_ICD_INVALID;
    size = required(device, bound->u.buffer.size);
    if (size > into->u.memory.size - offset)
        return LS_ICD_INVALID; /* past its memory */
    bound->u.buffer.memory = (uint64_t)(uintptr_t)memory;
    bound->u.buffer.offset = offset;
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BindBufferMemory(VkDevice handle, VkBuffer buffer, VkDeviceMemory memory,
                                                       VkDeviceSize offset)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result;
    pthread_mutex_lock(&device->lock);
    result = bind(device, buffer, memory, offset);
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_BindBufferMemory2(VkDevice handle, uint32_t count,
                                                        const VkBindBufferMemoryInfo *infos)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    for (uint32_t i = 0; i < count && result == VK_SUCCESS; i++)
        result = bind(device, infos[i].buffer, infos[i].memory, infos[i].memoryOffset);
    pthread_mutex_unlock(&device->lock);
    return result;
}
