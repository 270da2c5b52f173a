/* VkPhysicalDevice: what the driver reports of the arbiter's device.
 *
 * Properties: the real device's (the arbiter sends them, device_info.py), named
 * "libshare: NAME", its Vulkan version at most LS_ICD_API_VERSION. Features: the VkDevice
 * features the arbiter was created with among those of VkPhysicalDeviceFeatures that compute
 * uses (FEATURES below), robustBufferAccess always; structures chained to Features2 and
 * Properties2 are left as the application wrote them, except those named below (buffer device
 * address is reported off, the ID properties filled). One queue family: compute and transfer,
 * one queue, the arbiter's queue's timestamp bits. Memory: one device-local heap whose size is
 * the session's memory limit, with a device-local type (a libshare device buffer) and a
 * host-visible, coherent, cached type (a libshare shared buffer: a memfd mapped by both sides).
 * Formats: no format features yet (no images; buffer views are not offered yet), and no
 * device extensions. vkCreateDevice answers VK_ERROR_INITIALIZATION_FAILED until the device
 * layer is built (docs/icd.md). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "icd.h"

static const struct ls_icd_physical *physical_of(VkPhysicalDevice pd)
{
    return (const struct ls_icd_physical *)pd;
}

static const struct {
    const char *name;
    size_t offset;
} FEATURES[] = {
    {"robustBufferAccess", offsetof(VkPhysicalDeviceFeatures, robustBufferAccess)},
    {"shaderFloat64", offsetof(VkPhysicalDeviceFeatures, shaderFloat64)},
    {"shaderInt64", offsetof(VkPhysicalDeviceFeatures, shaderInt64)},
    {"shaderInt16", offsetof(VkPhysicalDeviceFeatures, shaderInt16)},
};

/* Turn on feature ``name`` of VkPhysicalDeviceFeatures; 1 if it is one of FEATURES, else 0. */
int ls_icd_feature_set(VkPhysicalDeviceFeatures *features, const char *name)
{
    for (size_t i = 0; i < sizeof(FEATURES) / sizeof(FEATURES[0]); i++) {
        if (strcmp(name, FEATURES[i].name) == 0) {
            VkBool32 on = VK_TRUE;
            memcpy((char *)features + FEATURES[i].offset, &on, sizeof(on));
            return 1;
        }
    }
    return 0;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties(VkPhysicalDevice pd, VkPhysicalDeviceProperties *out)
{
    *out = physical_of(pd)->properties;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties2(VkPhysicalDevice pd, VkPhysicalDeviceProperties2 *out)
{
    const struct ls_icd_physical *physical = physical_of(pd);
    out->properties = physical->properties;
    for (VkBaseOutStructure *next = out->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES) {
            VkPhysicalDeviceIDProperties *ids = (VkPhysicalDeviceIDProperties *)next;
            memcpy(ids->deviceUUID, physical->uuid, VK_UUID_SIZE);
            memset(ids->driverUUID, 0, VK_UUID_SIZE);
            memset(ids->deviceLUID, 0, VK_LUID_SIZE);
            ids->deviceNodeMask = 0;
            ids->deviceLUIDValid = VK_FALSE;
        }
    }
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures(VkPhysicalDevice pd, VkPhysicalDeviceFeatures *out)
{
    *out = physical_of(pd)->features;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures2(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *out)
{
    out->features = physical_of(pd)->features;
    for (VkBaseOutStructure *next = out->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES) {
            VkPhysicalDeviceBufferDeviceAddressFeatures *address = (VkPhysicalDeviceBufferDeviceAddressFeatures *)next;
            address->bufferDeviceAddress = VK_FALSE; /* a raw address would escape the arbiter's bounds */
            address->bufferDeviceAddressCaptureReplay = VK_FALSE;
            address->bufferDeviceAddressMultiDevice = VK_FALSE;
        }
    }
}

static VkQueueFamilyProperties the_family(const struct ls_icd_physical *physical)
{
    VkQueueFamilyProperties family = {
        .queueFlags = VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT,
        .queueCount = 1,
        .timestampValidBits = physical->timestamp_valid_bits,
        .minImageTransferGranularity = {1, 1, 1},
    };
    return family;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties(VkPhysicalDevice pd, uint32_t *count,
                                                                         VkQueueFamilyProperties *out)
{
    if (out != NULL && *count >= 1)
        out[0] = the_family(physical_of(pd));
    if (out == NULL || *count >= 1)
        *count = 1;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties2(VkPhysicalDevice pd, uint32_t *count,
                                                                          VkQueueFamilyProperties2 *out)
{
    if (out != NULL && *count >= 1)
        out[0].queueFamilyProperties = the_family(physical_of(pd));
    if (out == NULL || *count >= 1)
        *count = 1;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties(VkPhysicalDevice pd,
                                                                    VkPhysicalDeviceMemoryProperties *out)
{
    memset(out, 0, sizeof(*out));
    out->memoryHeapCount = 1;
    out->memoryHeaps[0].size = physical_of(pd)->memory;
    out->memoryHeaps[0].flags = VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
    out->memoryTypeCount = 2;
    out->memoryTypes[0].propertyFlags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT; /* a libshare device buffer */
    out->memoryTypes[1].propertyFlags = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                        VK_MEMORY_PROPERTY_HOST_CACHED_BIT; /* a libshare shared buffer */
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice pd,
                                                                     VkPhysicalDeviceMemoryProperties2 *out)
{
    ls_icd_GetPhysicalDeviceMemoryProperties(pd, &out->memoryProperties);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties(VkPhysicalDevice pd, VkFormat format,
                                                                    VkFormatProperties *out)
{
    (void)pd;
    (void)format;
    memset(out, 0, sizeof(*out));
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties2(VkPhysicalDevice pd, VkFormat format,
                                                                     VkFormatProperties2 *out)
{
    ls_icd_GetPhysicalDeviceFormatProperties(pd, format, &out->formatProperties);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkImageTiling tiling, VkImageUsageFlags usage,
    VkImageCreateFlags flags, VkImageFormatProperties *out)
{
    (void)pd, (void)format, (void)type, (void)tiling, (void)usage, (void)flags;
    memset(out, 0, sizeof(*out));
    return VK_ERROR_FORMAT_NOT_SUPPORTED; /* no images */
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceImageFormatInfo2 *info, VkImageFormatProperties2 *out)
{
    (void)pd, (void)info;
    memset(&out->imageFormatProperties, 0, sizeof(out->imageFormatProperties));
    return VK_ERROR_FORMAT_NOT_SUPPORTED;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkSampleCountFlagBits samples, VkImageUsageFlags usage,
    VkImageTiling tiling, uint32_t *count, VkSparseImageFormatProperties *out)
{
    (void)pd, (void)format, (void)type, (void)samples, (void)usage, (void)tiling, (void)out;
    *count = 0; /* no sparse memory */
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceSparseImageFormatInfo2 *info, uint32_t *count,
    VkSparseImageFormatProperties2 *out)
{
    (void)pd, (void)info, (void)out;
    *count = 0;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalBufferProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalBufferInfo *info, VkExternalBufferProperties *out)
{
    (void)pd, (void)info;
    memset(&out->externalMemoryProperties, 0, sizeof(out->externalMemoryProperties)); /* none exported */
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalFenceProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalFenceInfo *info, VkExternalFenceProperties *out)
{
    (void)pd, (void)info;
    out->exportFromImportedHandleTypes = out->compatibleHandleTypes = 0;
    out->externalFenceFeatures = 0;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalSemaphoreProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalSemaphoreInfo *info, VkExternalSemaphoreProperties *out)
{
    (void)pd, (void)info;
    out->exportFromImportedHandleTypes = out->compatibleHandleTypes = 0;
    out->externalSemaphoreFeatures = 0;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateDeviceExtensionProperties(VkPhysicalDevice pd, const char *layer,
                                                                        uint32_t *count, VkExtensionProperties *out)
{
    (void)pd, (void)out;
    if (layer != NULL)
        return VK_ERROR_LAYER_NOT_PRESENT;
    *count = 0;
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkDevice *out)
{
    (void)pd, (void)info, (void)allocator, (void)out;
    fprintf(stderr, "libshare Vulkan driver: devices are not implemented yet (docs/icd.md)\n");
    return VK_ERROR_INITIALIZATION_FAILED;
}
