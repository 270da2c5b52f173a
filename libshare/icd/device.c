/* VkDevice and its VkQueue: what vkCreateDevice checks, the device's session, the queue.
 *
 * The checks: one queue of family 0 (the only family, one queue), no device extension but those
 * physical.c offers the physical device, and no feature it does not report (VkPhysicalDeviceFeatures,
 * through pEnabledFeatures or a chained VkPhysicalDeviceFeatures2; features.c's structures, Vulkan
 * 1.1 and 1.2's among them, row by row); a chained structure that asks for a feature the driver
 * reports all off (physical.c's OFF: buffer device address, descriptor indexing, variable pointers,
 * multiview...) is VK_ERROR_FEATURE_NOT_PRESENT too.
 *
 * A device that passes says hello to the arbiter again: each VkDevice is a session of its own,
 * from vkCreateDevice to vkDestroyDevice, so that destroying it lets the arbiter free all of its
 * memory at once (its socket closes), its memory limit is counted per device as a Python
 * session's is, and an error that ends its session ends that device alone. `libshare-control ps`
 * shows it, beside the instance's session, while it lives. Its welcome's memory is the device's
 * limit (memory.c). The loader's trampolines call whatever the driver's tables hold unchecked,
 * so every core device-level command is in loader.c's table (refused.c holds those refused).
 * The session's ring is opened with the device and closed with it (queue.c: the data path, and the
 * waits for idle). vkDestroyDevice closes the session (the arbiter frees its buffers, programs,
 * lists and groups with it), then unmaps its memory and frees what its compute objects hold
 * (pipeline.c's, descriptor.c's, and commands.c's pools with their command buffers) and
 * reattach.c's ledger. After an arbiter's restart the session and ring are the new arbiter's
 * (reattach.c). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cache.h"
#include "descriptor.h"
#include "icd.h"
#include "physical.h"
#include "reattach.h"

/* 1 when ``asked`` (a run of ``count`` VkBool32) turns on one that ``offered`` leaves off. */
static int more_than(const VkBool32 *asked, const VkBool32 *offered, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (asked[i] && !offered[i])
            return 1;
    return 0;
}

/* 1 when any VkBool32 after the sType and pNext of ``next`` (a structure of ``size`` bytes) is on. */
static int any_on(const VkBaseInStructure *next, size_t size)
{
    const char *at = (const char *)next + sizeof(VkBaseInStructure);
    for (size_t i = 0; i + sizeof(VkBool32) <= size - sizeof(VkBaseInStructure); i += sizeof(VkBool32)) {
        VkBool32 value;
        memcpy(&value, at + i, sizeof(value));
        if (value)
            return 1;
    }
    return 0;
}

static VkResult check_features(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info)
{
    const size_t core = sizeof(VkPhysicalDeviceFeatures) / sizeof(VkBool32);
    size_t size;
    if (info->pEnabledFeatures &&
        more_than((const VkBool32 *)info->pEnabledFeatures, (const VkBool32 *)&physical->features, core))
        return VK_ERROR_FEATURE_NOT_PRESENT;
    for (const VkBaseInStructure *next = info->pNext; next != NULL; next = next->pNext) {
        switch (next->sType) {
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2:
            if (more_than((const VkBool32 *)&((const VkPhysicalDeviceFeatures2 *)next)->features,
                          (const VkBool32 *)&physical->features, core))
                return VK_ERROR_FEATURE_NOT_PRESENT;
            break;
        default: /* a structure of features.c's table, or one whose features the driver reports all off */
            if (ls_icd_fields_known(next->sType) && ls_icd_fields_check(physical, next) != VK_SUCCESS)
                return VK_ERROR_FEATURE_NOT_PRESENT;
            size = ls_icd_off_size(next->sType);
            if (size != 0 && any_on(next, size))
                return VK_ERROR_FEATURE_NOT_PRESENT;
            break;
        }
    }
    return VK_SUCCESS;
}

/* The bits of the extensions ``info`` enables, or VK_ERROR_EXTENSION_NOT_PRESENT for one not offered. */
static VkResult extensions_of(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info, uint32_t *bits)
{
    *bits = 0;
    for (uint32_t i = 0; i < info->enabledExtensionCount; i++) {
        uint32_t bit = info->ppEnabledExtensionNames[i]
                           ? ls_icd_extension_bit(physical, info->ppEnabledExtensionNames[i]) : 0;
        if (bit == 0)
            return VK_ERROR_EXTENSION_NOT_PRESENT;
        *bits |= bit;
    }
    return VK_SUCCESS;
}

/* The LS_ICD_EXT_* bits that Vulkan 1.2's features turn on without their extension: timeline
 * semaphores and the host's query reset, enabled through VkPhysicalDeviceVulkan12Features or their
 * own feature structures (check_features has checked that the driver reports them). */
static uint32_t features_as_extensions(const VkDeviceCreateInfo *info)
{
    uint32_t bits = 0;
    for (const VkBaseInStructure *next = info->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES) {
            const VkPhysicalDeviceVulkan12Features *v12 = (const VkPhysicalDeviceVulkan12Features *)next;
            bits |= (v12->timelineSemaphore ? LS_ICD_EXT_TIMELINE : 0) |
                    (v12->hostQueryReset ? LS_ICD_EXT_QUERY_RESET : 0);
        } else if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES) {
            bits |= ((const VkPhysicalDeviceTimelineSemaphoreFeatures *)next)->timelineSemaphore
                        ? LS_ICD_EXT_TIMELINE : 0;
        } else if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_HOST_QUERY_RESET_FEATURES) {
            bits |= ((const VkPhysicalDeviceHostQueryResetFeatures *)next)->hostQueryReset
                        ? LS_ICD_EXT_QUERY_RESET : 0;
        }
    }
    return bits;
}

VkResult ls_icd_check_device(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info)
{
    uint32_t bits;
    if (extensions_of(physical, info, &bits) != VK_SUCCESS)
        return VK_ERROR_EXTENSION_NOT_PRESENT;
    if (info->queueCreateInfoCount != 1 || info->pQueueCreateInfos == NULL ||
        info->pQueueCreateInfos[0].queueFamilyIndex != 0 || info->pQueueCreateInfos[0].queueCount != 1)
        return VK_ERROR_INITIALIZATION_FAILED; /* one family, one queue */
    return check_features(physical, info);
}

/* The alignment of a buffer's memory: the largest of the device's offset alignments that are powers
 * of two up to 64 KiB (they came from the arbiter, and are bounded like everything it sends), and 16. */
static uint64_t buffer_alignment(const VkPhysicalDeviceLimits *limits)
{
    const uint64_t asked[] = {limits->minStorageBufferOffsetAlignment, limits->minUniformBufferOffsetAlignment,
                              limits->minTexelBufferOffsetAlignment, limits->nonCoherentAtomSize};
    uint64_t alignment = 16;
    for (size_t i = 0; i < sizeof(asked) / sizeof(asked[0]); i++)
        if (asked[i] > alignment && asked[i] <= 65536 && (asked[i] & (asked[i] - 1)) == 0)
            alignment = asked[i];
    return alignment;
}

static void release(struct ls_icd_device *device)
{
    ls_icd_host_free(device->has_allocator ? &device->allocator : NULL, device);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkDevice *out)
{
    struct ls_icd_device *device;
    char why[LS_ICD_WHY] = "";
    VkResult result = ls_icd_check_device((const struct ls_icd_physical *)pd, info);
    if (result != VK_SUCCESS)
        return result;
    device = ls_icd_host_alloc(allocator, sizeof(*device), VK_SYSTEM_ALLOCATION_SCOPE_DEVICE);
    if (device == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    set_loader_magic_value(device);
    set_loader_magic_value(&device->queue);
    device->queue.device = device;
    if (allocator) {
        device->allocator = *allocator;
        device->has_allocator = 1;
    }
    result = ls_icd_hello(&device->session, &device->seen, why, sizeof(why));
    if (result != VK_SUCCESS) {
        fprintf(stderr, "libshare Vulkan driver: no device: %s\n", why[0] ? why : "no session");
        release(device);
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    if (pthread_mutex_init(&device->lock, NULL) != 0) {
        ls_icd_session_close(&device->session);
        release(device);
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    device->alignment = buffer_alignment(&device->seen.properties.limits);
    extensions_of(&device->seen, info, &device->extensions);
    device->extensions |= features_as_extensions(info);
    result = ls_icd_path_open(device);
    if (result != VK_SUCCESS) {
        fprintf(stderr, "libshare Vulkan driver: no device: the arbiter's ring could not be opened\n");
        pthread_mutex_destroy(&device->lock);
        ls_icd_session_close(&device->session);
        release(device);
        return result;
    }
    *out = (VkDevice)device;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDevice(VkDevice handle, const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = (struct ls_icd_device *)handle;
    (void)allocator; /* the one it was made with is kept */
    if (device == NULL)
        return;
    pthread_mutex_lock(&device->lock);
    ls_icd_path_close(device); /* the ring unmapped, its lane and tickets gone, command buffers handed back */
    pthread_mutex_unlock(&device->lock);
    ls_icd_session_close(&device->session); /* the arbiter frees the session's buffers with it */
    ls_icd_ledger_free(device);             /* (reattach.c's copies, the memfds it kept) */
    ls_icd_cache_free(device);              /* (cache.c's groups and lists) */
    for (uint32_t i = 0; i < device->objects.used; i++) {
        struct ls_icd_object *object = &device->objects.slots[i];
        if (object->kind == LS_ICD_MEMORY && object->u.memory.address != NULL)
            munmap(object->u.memory.address, object->u.memory.rounded);
        ls_icd_pipeline_object_free(NULL, object); /* what the compute objects hold (NULL: the session is */
        ls_icd_descriptor_object_free(object);     /* closed, its programs freed with it) */
        ls_icd_command_pool_free(object);          /* (and its lists and groups) */
    }
    ls_icd_objects_free(&device->objects);
    pthread_mutex_destroy(&device->lock);
    release(device);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceQueue(VkDevice handle, uint32_t family, uint32_t index, VkQueue *out)
{
    struct ls_icd_device *device = (struct ls_icd_device *)handle;
    *out = family == 0 && index == 0 ? (VkQueue)&device->queue : VK_NULL_HANDLE; /* the only one */
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceQueue2(VkDevice handle, const VkDeviceQueueInfo2 *info, VkQueue *out)
{
    if (info->flags != 0) { /* no protected queue was made */
        *out = VK_NULL_HANDLE;
        return;
    }
    ls_icd_GetDeviceQueue(handle, info->queueFamilyIndex, info->queueIndex, out);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetDeviceGroupPeerMemoryFeatures(VkDevice device, uint32_t heap, uint32_t local,
                                                                   uint32_t remote, VkPeerMemoryFeatureFlags *out)
{
    (void)device, (void)heap, (void)local, (void)remote; /* one device: its own memory is all there is */
    *out = VK_PEER_MEMORY_FEATURE_COPY_SRC_BIT | VK_PEER_MEMORY_FEATURE_COPY_DST_BIT |
           VK_PEER_MEMORY_FEATURE_GENERIC_SRC_BIT | VK_PEER_MEMORY_FEATURE_GENERIC_DST_BIT;
}
