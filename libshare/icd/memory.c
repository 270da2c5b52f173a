/* VkDeviceMemory: libshare buffers of the device's session.
 *
 * vkAllocateMemory sends the arbiter the request a Python session sends (session.alloc):
 * {"op": "alloc", "size": N, "kind": "shared"} for the host-visible type (1), "device" for the
 * device-local one (0), but "shared" for it too on a device that runs on the CPU (lavapipe), whose
 * memory is the host's either way: shared memory outlives an arbiter (reattach.c), so a device
 * holding only such memory survives a restart. A shared buffer's reply carries its sealed memfd, which the driver maps
 * whole at once (MAP_SHARED: the arbiter's device reads and writes the same pages) and closes
 * (reattach.c's ledger keeps a duplicate, to hand the same pages to a new arbiter after a restart);
 * vkMapMemory hands out that mapping, zero copy (again while mapped: Vulkan forbids it, lavapipe
 * allows it, and the pages are the same), and the memory is coherent, so flushing and
 * invalidating only check their ranges. Everything in the reply is checked: "ok", a buffer id,
 * a size of whole pages at least the one asked and at most 2 GiB past it, one descriptor for a
 * shared buffer and none for a device one, a memfd at least that long.
 *
 * The heap is the session's memory limit (its welcome's "memory"): an allocation past what is
 * left of it is VK_ERROR_OUT_OF_DEVICE_MEMORY before the arbiter is asked, and the arbiter's own
 * refusal (QuotaExceeded: a group's or the arbiter's limit, shared with other sessions) is
 * VK_ERROR_OUT_OF_DEVICE_MEMORY too; any other refusal or a broken reply is
 * VK_ERROR_OUT_OF_DEVICE_MEMORY with one line on stderr (vkAllocateMemory has no other error
 * to give); an exchange that failed (no answer in time, a broken frame, the arbiter gone) shuts
 * the session's socket, so every later request fails at once rather than read a stale reply. vkFreeMemory sends "free" and unmaps; buffers still bound to that memory keep a
 * handle that no longer finds it (buffer.c). Invalid input (a wrong handle, a memory type that
 * does not exist, mapping memory that is not host-visible, a range past the
 * memory) is an error, never a crash: LS_ICD_INVALID, or VK_ERROR_MEMORY_MAP_FAILED for maps.
 * ls_icd_memory_shared makes the same shared buffer for the driver's own use (query.c's pools), outside
 * the heap's count. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cache.h"
#include "descriptor.h"
#include "icd.h"

#define PAGE 4096u
#define MOST_SLACK (2ull << 30) /* a reply's size past the one asked: whole pages, never this much */

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

/* The arbiter's buffer for ``memory`` (its size and type set): buffer id, rounded size, mapping. */
static VkResult alloc_buffer(struct ls_icd_device *device, struct ls_icd_memory *memory)
{
    char text[128];
    struct ls_icd_frame frame;
    cJSON *reply;
    struct stat status;
    int64_t id, size;
    int shared = memory->type == 1 || device->seen.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    VkResult result;
    snprintf(text, sizeof(text), "{\"op\":\"alloc\",\"size\":%llu,\"kind\":\"%s\"}",
             (unsigned long long)memory->size, shared ? "shared" : "device");
    result = ls_icd_ask(device, text, NULL, 0, &frame, 1, &reply, VK_ERROR_OUT_OF_DEVICE_MEMORY);
    if (result == VK_SUCCESS) {
        id = ls_icd_whole_field(reply, "buffer_id", 0, 2147483647.0);
        size = ls_icd_whole_field(reply, "size", (double)memory->size, (double)(memory->size + MOST_SLACK));
        if (id < 0 || size < 0 || size % PAGE != 0 || frame.nfds != (shared ? 1 : 0) ||
            (shared && (fstat(frame.fds[0], &status) < 0 || status.st_size < size))) {
            fprintf(stderr, "libshare Vulkan driver: the arbiter's alloc reply is malformed\n");
            result = VK_ERROR_OUT_OF_DEVICE_MEMORY;
        } else {
            memory->buffer_id = id;
            memory->rounded = (uint64_t)size;
        }
    }
    if (result == VK_SUCCESS && shared) {
        void *address = mmap(NULL, memory->rounded, PROT_READ | PROT_WRITE, MAP_SHARED, frame.fds[0], 0);
        if (address == MAP_FAILED) {
            memory->address = NULL;
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
        } else {
            memory->address = address;
        }
    }
    cJSON_Delete(reply);
    ls_icd_frame_free(&frame); /* the mapping needs no descriptor */
    if (result != VK_SUCCESS && memory->rounded != 0)
        ls_icd_memory_release(device, memory); /* the arbiter made one that cannot be used: given back */
    return result;
}

VkResult ls_icd_memory_shared(struct ls_icd_device *device, uint64_t size, struct ls_icd_memory *memory)
{
    *memory = (struct ls_icd_memory){.size = size, .type = 1};
    return alloc_buffer(device, memory);
}

/* Give the arbiter's buffer back and unmap it (the device's lock held). */
void ls_icd_memory_release(struct ls_icd_device *device, struct ls_icd_memory *memory)
{
    ls_icd_views_orphan(device, memory->buffer_id); /* its views, and the groups naming them or it, first */
    ls_icd_cache_drop_buffer(device, memory->buffer_id);
    ls_icd_forget(device, "buffer_id", memory->buffer_id);
    if (memory->address != NULL)
        munmap(memory->address, memory->rounded);
    memory->address = NULL;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateMemory(VkDevice handle, const VkMemoryAllocateInfo *info,
                                                     const VkAllocationCallbacks *allocator, VkDeviceMemory *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_memory memory = {.size = info->allocationSize, .type = info->memoryTypeIndex};
    struct ls_icd_object *object;
    uint64_t made;
    VkResult result;
    (void)allocator;
    if (info->memoryTypeIndex > 1 || info->allocationSize == 0)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    if (info->allocationSize > device->seen.max_allocation ||
        info->allocationSize > device->seen.memory - device->held) {
        pthread_mutex_unlock(&device->lock);
        return VK_ERROR_OUT_OF_DEVICE_MEMORY; /* past the heap: the session's limit */
    }
    made = ls_icd_object_new(&device->objects, LS_ICD_MEMORY);
    result = made ? alloc_buffer(device, &memory) : VK_ERROR_OUT_OF_HOST_MEMORY;
    if (result == VK_SUCCESS) {
        object = ls_icd_object_find(&device->objects, made, LS_ICD_MEMORY);
        object->u.memory = memory;
        device->held += memory.rounded < device->seen.memory - device->held ? memory.rounded
                                                                             : device->seen.memory - device->held;
        *out = (VkDeviceMemory)(uintptr_t)made;
    } else if (made) {
        ls_icd_object_drop(&device->objects, made);
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_FreeMemory(VkDevice handle, VkDeviceMemory memory,
                                             const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    (void)allocator;
    if (memory == VK_NULL_HANDLE)
        return;
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY);
    if (object != NULL) { /* (a wrong handle: nothing to free) */
        uint64_t rounded = object->u.memory.rounded;
        ls_icd_memory_release(device, &object->u.memory);
        device->held -= rounded < device->held ? rounded : device->held;
        ls_icd_object_drop(&device->objects, (uint64_t)(uintptr_t)memory);
    }
    pthread_mutex_unlock(&device->lock);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_MapMemory(VkDevice handle, VkDeviceMemory memory, VkDeviceSize offset,
                                                VkDeviceSize size, VkMemoryMapFlags flags, void **out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    VkResult result = VK_ERROR_MEMORY_MAP_FAILED;
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY);
    if (object != NULL && flags == 0 && object->u.memory.type == 1 && object->u.memory.address != NULL &&
        offset < object->u.memory.size &&
        (size == VK_WHOLE_SIZE || (size != 0 && size <= object->u.memory.size - offset))) {
        object->u.memory.mapped = 1;
        *out = object->u.memory.address + offset;
        result = VK_SUCCESS;
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_UnmapMemory(VkDevice handle, VkDeviceMemory memory)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY);
    if (object != NULL)
        object->u.memory.mapped = 0; /* the pages stay: the arbiter's device uses them */
    pthread_mutex_unlock(&device->lock);
}

/* vkFlushMappedMemoryRanges and vkInvalidateMappedMemoryRanges: the memory is coherent, so only the
 * ranges are checked (mapped memory, within it). */
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_FlushMappedMemoryRanges(VkDevice handle, uint32_t count,
                                                              const VkMappedMemoryRange *ranges)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    for (uint32_t i = 0; i < count && result == VK_SUCCESS; i++) {
        struct ls_icd_object *object =
            ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)ranges[i].memory, LS_ICD_MEMORY);
        if (object == NULL || !object->u.memory.mapped || ranges[i].offset >= object->u.memory.rounded ||
            (ranges[i].size != VK_WHOLE_SIZE && ranges[i].size > object->u.memory.rounded - ranges[i].offset))
            result = LS_ICD_INVALID;
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceMemoryCommitment(VkDevice handle, VkDeviceMemory memory,
                                                            VkDeviceSize *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY);
    *out = object != NULL ? object->u.memory.rounded : 0;
    pthread_mutex_unlock(&device->lock);
}
