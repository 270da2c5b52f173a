/* VkPhysicalDevice: what the driver reports of the arbiter's device.
 *
 * Properties: the real device's (the arbiter sends them, device_info.py), named
 * "libshare: NAME", its Vulkan version at most LS_ICD_API_VERSION; chained to Properties2, the
 * Vulkan 1.1 structures: the device's UUID, its subgroup size and operations in the compute
 * stage, Maintenance3's bounds (an allocation at most the heap), no multiview, protected memory
 * or point clipping, and VK_KHR_timeline_semaphore's (no bound on a value's difference). Features: the VkDevice features the arbiter was created with among those
 * compute uses (FEATURES below), robustBufferAccess always; chained to Features2,
 * the Vulkan 1.1 structures (16-bit storage as the arbiter has it, the others off), timeline
 * semaphores on (synchronization2 as LS_ICD_OFFERS_SYNC2 says) and buffer device address, off. A structure of a later version or an extension not offered is left as
 * the application wrote it. One queue family: compute and transfer, and graphics in name only
 * (applications such as Taichi take a family with VK_QUEUE_GRAPHICS_BIT for their compute work;
 * graphics pipelines, render passes, framebuffers stay refused: VK_ERROR_FEATURE_NOT_PRESENT),
 * one queue, the arbiter's queue's timestamp bits. Memory: one device-local heap whose size is
 * the session's memory limit, with a device-local type (a libshare device buffer) and a
 * host-visible, coherent, cached type (a libshare shared buffer: a memfd mapped by both sides).
 * Formats: no format features yet (no images; buffer views are not offered yet). Device
 * extensions: EXTENSIONS below (semaphore.c, submit.c). vkCreateDevice is device.c's. */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>

#include "icd.h"
#include "physical.h"

static const struct ls_icd_physical *physical_of(VkPhysicalDevice pd)
{
    return (const struct ls_icd_physical *)pd;
}

/* The feature names of the arbiter (device_info.py) that the driver reports, and where each goes:
 * a VkBool32 of VkPhysicalDeviceFeatures or of VkPhysicalDevice16BitStorageFeatures, or a subgroup
 * operation. */
enum where { CORE, STORAGE16, SUBGROUP };

static const struct {
    const char *name;
    enum where where;
    size_t at; /* the offset of the VkBool32, or the subgroup operation's bit */
} FEATURES[] = {
    {"robustBufferAccess", CORE, offsetof(VkPhysicalDeviceFeatures, robustBufferAccess)},
    {"shaderFloat64", CORE, offsetof(VkPhysicalDeviceFeatures, shaderFloat64)},
    {"shaderInt64", CORE, offsetof(VkPhysicalDeviceFeatures, shaderInt64)},
    {"shaderInt16", CORE, offsetof(VkPhysicalDeviceFeatures, shaderInt16)},
    {"storageBuffer16BitAccess", STORAGE16, offsetof(VkPhysicalDevice16BitStorageFeatures, storageBuffer16BitAccess)},
    {"uniformAndStorageBuffer16BitAccess", STORAGE16,
     offsetof(VkPhysicalDevice16BitStorageFeatures, uniformAndStorageBuffer16BitAccess)},
    {"storagePushConstant16", STORAGE16, offsetof(VkPhysicalDevice16BitStorageFeatures, storagePushConstant16)},
    {"subgroupBasic", SUBGROUP, VK_SUBGROUP_FEATURE_BASIC_BIT},
    {"subgroupVote", SUBGROUP, VK_SUBGROUP_FEATURE_VOTE_BIT},
    {"subgroupArithmetic", SUBGROUP, VK_SUBGROUP_FEATURE_ARITHMETIC_BIT},
    {"subgroupBallot", SUBGROUP, VK_SUBGROUP_FEATURE_BALLOT_BIT},
    {"subgroupShuffle", SUBGROUP, VK_SUBGROUP_FEATURE_SHUFFLE_BIT},
    {"subgroupShuffleRelative", SUBGROUP, VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT},
    {"subgroupClustered", SUBGROUP, VK_SUBGROUP_FEATURE_CLUSTERED_BIT},
    {"subgroupQuad", SUBGROUP, VK_SUBGROUP_FEATURE_QUAD_BIT},
};

/* Report feature ``name`` of the arbiter's; 1 if the driver reports it, else 0. */
int ls_icd_feature_set(struct ls_icd_physical *physical, const char *name)
{
    const VkBool32 on = VK_TRUE;
    for (size_t i = 0; i < sizeof(FEATURES) / sizeof(FEATURES[0]); i++) {
        if (strcmp(name, FEATURES[i].name) != 0)
            continue;
        if (FEATURES[i].where == CORE)
            memcpy((char *)&physical->features + FEATURES[i].at, &on, sizeof(on));
        else if (FEATURES[i].where == STORAGE16)
            memcpy((char *)&physical->storage16 + FEATURES[i].at, &on, sizeof(on));
        else
            physical->subgroup_operations |= (VkSubgroupFeatureFlags)FEATURES[i].at;
        return 1;
    }
    return 0;
}

/* The chained output structures the driver answers with nothing: features off, properties of none.
 * Any other structure of a later version or of an extension not offered is left as it was. */
static const struct {
    VkStructureType type;
    size_t size;
} OFF[] = {
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MULTIVIEW_PROPERTIES, sizeof(VkPhysicalDeviceMultiviewProperties)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_POINT_CLIPPING_PROPERTIES, sizeof(VkPhysicalDevicePointClippingProperties)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROTECTED_MEMORY_PROPERTIES, sizeof(VkPhysicalDeviceProtectedMemoryProperties)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MULTIVIEW_FEATURES, sizeof(VkPhysicalDeviceMultiviewFeatures)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROTECTED_MEMORY_FEATURES, sizeof(VkPhysicalDeviceProtectedMemoryFeatures)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SAMPLER_YCBCR_CONVERSION_FEATURES,
     sizeof(VkPhysicalDeviceSamplerYcbcrConversionFeatures)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_DRAW_PARAMETERS_FEATURES,
     sizeof(VkPhysicalDeviceShaderDrawParametersFeatures)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VARIABLE_POINTERS_FEATURES, sizeof(VkPhysicalDeviceVariablePointersFeatures)},
    /* a raw device address would escape the arbiter's bounds */
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES,
     sizeof(VkPhysicalDeviceBufferDeviceAddressFeatures)},
};

/* The size of structure ``type`` if OFF lists it (the driver offers nothing of it), else 0. */
size_t ls_icd_off_size(VkStructureType type)
{
    for (size_t i = 0; i < sizeof(OFF) / sizeof(OFF[0]); i++)
        if (type == OFF[i].type)
            return OFF[i].size;
    return 0;
}

/* Zero everything after sType and pNext of ``next`` if it is one of OFF. */
static void clear_if_off(VkBaseOutStructure *next)
{
    size_t size = ls_icd_off_size(next->sType);
    if (size != 0)
        memset((char *)next + sizeof(VkBaseOutStructure), 0, size - sizeof(VkBaseOutStructure));
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
        switch (next->sType) {
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES: {
            VkPhysicalDeviceIDProperties *ids = (VkPhysicalDeviceIDProperties *)next;
            memcpy(ids->deviceUUID, physical->uuid, VK_UUID_SIZE);
            memset(ids->driverUUID, 0, VK_UUID_SIZE);
            memset(ids->deviceLUID, 0, VK_LUID_SIZE);
            ids->deviceNodeMask = 0;
            ids->deviceLUIDValid = VK_FALSE;
            break;
        }
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES: {
            VkPhysicalDeviceSubgroupProperties *subgroup = (VkPhysicalDeviceSubgroupProperties *)next;
            subgroup->subgroupSize = physical->subgroup_size;
            subgroup->supportedStages = physical->subgroup_operations ? VK_SHADER_STAGE_COMPUTE_BIT : 0;
            subgroup->supportedOperations = physical->subgroup_operations;
            subgroup->quadOperationsInAllStages = VK_FALSE;
            break;
        }
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES: {
            VkPhysicalDeviceMaintenance3Properties *bounds = (VkPhysicalDeviceMaintenance3Properties *)next;
            bounds->maxPerSetDescriptors = physical->max_per_set_descriptors;
            bounds->maxMemoryAllocationSize = physical->max_allocation; /* at most the heap */
            break;
        }
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_PROPERTIES:
            ((VkPhysicalDeviceTimelineSemaphoreProperties *)next)->maxTimelineSemaphoreValueDifference = UINT64_MAX;
            break;
        default:
            clear_if_off(next);
            break;
        }
    }
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures(VkPhysicalDevice pd, VkPhysicalDeviceFeatures *out)
{
    *out = physical_of(pd)->features;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures2(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *out)
{
    const struct ls_icd_physical *physical = physical_of(pd);
    out->features = physical->features;
    for (VkBaseOutStructure *next = out->pNext; next != NULL; next = next->pNext) {
        switch (next->sType) {
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES: {
            VkPhysicalDevice16BitStorageFeatures *storage = (VkPhysicalDevice16BitStorageFeatures *)next;
            storage->storageBuffer16BitAccess = physical->storage16.storageBuffer16BitAccess;
            storage->uniformAndStorageBuffer16BitAccess = physical->storage16.uniformAndStorageBuffer16BitAccess;
            storage->storagePushConstant16 = physical->storage16.storagePushConstant16;
            storage->storageInputOutput16 = VK_FALSE; /* no graphics */
            break;
        }
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES:
            ((VkPhysicalDeviceTimelineSemaphoreFeatures *)next)->timelineSemaphore = VK_TRUE;
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SYNCHRONIZATION_2_FEATURES:
            ((VkPhysicalDeviceSynchronization2Features *)next)->synchronization2 = LS_ICD_OFFERS_SYNC2 ? VK_TRUE
                                                                                                     : VK_FALSE;
            break;
        default:
            clear_if_off(next);
            break;
        }
    }
}

static VkQueueFamilyProperties the_family(const struct ls_icd_physical *physical)
{
    VkQueueFamilyProperties family = {
        .queueFlags = VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT,
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

/* The device extensions offered, with their ls_icd_device.extensions bit. */
static const struct {
    VkExtensionProperties properties;
    uint32_t bit;
} EXTENSIONS[] = {
    {{VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME, VK_KHR_TIMELINE_SEMAPHORE_SPEC_VERSION}, LS_ICD_EXT_TIMELINE},
#if LS_ICD_OFFERS_SYNC2
    {{VK_KHR_SYNCHRONIZATION_2_EXTENSION_NAME, VK_KHR_SYNCHRONIZATION_2_SPEC_VERSION}, LS_ICD_EXT_SYNC2},
#endif
};

#define NEXTENSIONS ((uint32_t)(sizeof(EXTENSIONS) / sizeof(EXTENSIONS[0])))

uint32_t ls_icd_extension_bit(const char *name)
{
    for (uint32_t i = 0; i < NEXTENSIONS; i++)
        if (strcmp(name, EXTENSIONS[i].properties.extensionName) == 0)
            return EXTENSIONS[i].bit;
    return 0;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateDeviceExtensionProperties(VkPhysicalDevice pd, const char *layer,
                                                                        uint32_t *count, VkExtensionProperties *out)
{
    uint32_t written;
    (void)pd;
    if (layer != NULL)
        return VK_ERROR_LAYER_NOT_PRESENT;
    if (out == NULL) {
        *count = NEXTENSIONS;
        return VK_SUCCESS;
    }
    written = *count < NEXTENSIONS ? *count : NEXTENSIONS;
    for (uint32_t i = 0; i < written; i++)
        out[i] = EXTENSIONS[i].properties;
    *count = written;
    return written < NEXTENSIONS ? VK_INCOMPLETE : VK_SUCCESS;
}
