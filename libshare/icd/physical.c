/* VkPhysicalDevice: what the driver reports of the arbiter's device.
 *
 * Properties: the real device's (the arbiter sends them, device_info.py), named
 * "libshare: NAME", its Vulkan version at most LS_ICD_API_VERSION (1.2); chained to Properties2,
 * the Vulkan 1.1 and 1.2 structures: the device's UUID, its subgroup size and operations in the
 * compute stage, Maintenance3's bounds (an allocation at most the heap), no multiview, protected
 * memory or point clipping, timeline semaphores without a bound on a value's difference, the
 * driver's identity (driverName "libshare", driverID and conformance version the arbiter's driver's:
 * the shaders run on it), the float controls the arbiter's device has (independences NONE), no
 * descriptor indexing (its update-after-bind limits the device's plain ones: they count every set
 * layout), depth resolve or sampler reduction. Features: the VkDevice features the
 * arbiter was created with among those compute uses (FEATURES below), robustBufferAccess always;
 * chained to Features2, features.c's structures (Vulkan 1.1 and 1.2's and the extensions they
 * absorbed: 8/16-bit storage, Float16/Int8, 64-bit atomics, the memory model, subgroup extended
 * types as the arbiter has them; timeline semaphores, synchronization2 and the host's query reset
 * always) and OFF's, all off (buffer device address, descriptor indexing, the layout relaxations,
 * graphics). A structure of another version or an extension not offered is left as the
 * application wrote it. One queue family: compute and transfer, and graphics in name only
 * (applications such as Taichi take a family with VK_QUEUE_GRAPHICS_BIT for their compute work;
 * graphics pipelines, render passes, framebuffers stay refused: VK_ERROR_FEATURE_NOT_PRESENT),
 * one queue, the arbiter's queue's timestamp bits. Memory: one device-local heap whose size is
 * the session's memory limit, with a device-local type (a libshare device buffer) and a
 * host-visible, coherent, cached type (a libshare shared buffer: a memfd mapped by both sides).
 * Formats: no image features (no images); the texel formats of the welcome (the arbiter's device
 * makes a buffer view of) report their storage and uniform texel buffer features, nothing else. Device
 * extensions: EXTENSIONS below, each offered when the arbiter's device has the feature it brings;
 * always: push descriptors and update templates (the driver makes them of descriptor sets),
 * non-semantic instructions (the arbiter takes them out where its device cannot take them), and
 * the extensions Vulkan 1.1 and 1.2 absorbed whose commands the driver has, by their names.
 * vkCreateDevice is device.c's. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "icd.h"
#include "physical.h"

static const struct ls_icd_physical *physical_of(VkPhysicalDevice pd)
{
    return (const struct ls_icd_physical *)pd;
}

/* The feature names of the arbiter (device_info.py) that the driver reports in
 * VkPhysicalDeviceFeatures or as subgroup operations, and where each goes: a VkBool32 of
 * VkPhysicalDeviceFeatures, or a subgroup operation (those of the chained structures: features.c). */
enum where { CORE, SUBGROUP };

static const struct {
    const char *name;
    enum where where;
    size_t at; /* the offset of the VkBool32, or the subgroup operation's bit */
} FEATURES[] = {
    {"robustBufferAccess", CORE, offsetof(VkPhysicalDeviceFeatures, robustBufferAccess)},
    {"shaderFloat64", CORE, offsetof(VkPhysicalDeviceFeatures, shaderFloat64)},
    {"shaderInt64", CORE, offsetof(VkPhysicalDeviceFeatures, shaderInt64)},
    {"shaderInt16", CORE, offsetof(VkPhysicalDeviceFeatures, shaderInt16)},
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
        else
            physical->subgroup_operations |= (VkSubgroupFeatureFlags)FEATURES[i].at;
        return 1;
    }
    return ls_icd_fields_set(physical, name);
}

/* The chained output structures the driver answers with nothing: features off, properties of none;
 * each with where its members end (LS_ICD_END). Any other structure of a later version or of an
 * extension not offered is left as it was. */
static const struct {
    VkStructureType type;
    size_t size;
} OFF[] = {
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MULTIVIEW_PROPERTIES,
     LS_ICD_END(VkPhysicalDeviceMultiviewProperties, maxMultiviewInstanceIndex)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_POINT_CLIPPING_PROPERTIES,
     LS_ICD_END(VkPhysicalDevicePointClippingProperties, pointClippingBehavior)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROTECTED_MEMORY_PROPERTIES,
     LS_ICD_END(VkPhysicalDeviceProtectedMemoryProperties, protectedNoFault)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MULTIVIEW_FEATURES,
     LS_ICD_END(VkPhysicalDeviceMultiviewFeatures, multiviewTessellationShader)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROTECTED_MEMORY_FEATURES,
     LS_ICD_END(VkPhysicalDeviceProtectedMemoryFeatures, protectedMemory)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SAMPLER_YCBCR_CONVERSION_FEATURES,
     LS_ICD_END(VkPhysicalDeviceSamplerYcbcrConversionFeatures, samplerYcbcrConversion)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_DRAW_PARAMETERS_FEATURES,
     LS_ICD_END(VkPhysicalDeviceShaderDrawParametersFeatures, shaderDrawParameters)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VARIABLE_POINTERS_FEATURES,
     LS_ICD_END(VkPhysicalDeviceVariablePointersFeatures, variablePointers)},
    /* a raw device address would escape the arbiter's bounds */
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_BUFFER_DEVICE_ADDRESS_FEATURES,
     LS_ICD_END(VkPhysicalDeviceBufferDeviceAddressFeatures, bufferDeviceAddressMultiDevice)},
    /* no integer dot product is said to be accelerated: the arbiter's device's are not passed on */
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES,
     LS_ICD_END(VkPhysicalDeviceShaderIntegerDotProductProperties,
                integerDotProductAccumulatingSaturating64BitMixedSignednessAccelerated)},
    /* descriptor.c's sets hold buffers bound whole */
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DESCRIPTOR_INDEXING_FEATURES,
     LS_ICD_END(VkPhysicalDeviceDescriptorIndexingFeatures, runtimeDescriptorArray)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_IMAGELESS_FRAMEBUFFER_FEATURES,
     LS_ICD_END(VkPhysicalDeviceImagelessFramebufferFeatures, imagelessFramebuffer)},
    {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SEPARATE_DEPTH_STENCIL_LAYOUTS_FEATURES,
     LS_ICD_END(VkPhysicalDeviceSeparateDepthStencilLayoutsFeatures, separateDepthStencilLayouts)},
};

/* Where structure ``type``'s members end if OFF lists it (the driver offers nothing of it), else 0. */
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

/* Who the driver is: libshare, whose devices run every command on the arbiter's driver: that driver's
 * id (so that an application's workarounds for it apply) and the conformance version it passed
 * (wgpu hides an adapter that reports none). libshare's own driver has not run the conformance
 * tests: docs/icd.md, "Who the driver says it is". */
static void identity(const struct ls_icd_physical *physical, VkDriverId *id, char *name, char *info,
                     VkConformanceVersion *conformance)
{
    *id = (VkDriverId)physical->driver_id;
    snprintf(name, VK_MAX_DRIVER_NAME_SIZE, "libshare");
    snprintf(info, VK_MAX_DRIVER_INFO_SIZE, "%s", physical->properties.deviceName);
    *conformance = physical->conformance;
}

/* Vulkan 1.1's properties, as the structures they aggregate say them. */
static void vulkan11_properties(const struct ls_icd_physical *physical, VkPhysicalDeviceVulkan11Properties *out)
{
    memset((char *)out + sizeof(VkBaseOutStructure), 0, sizeof(*out) - sizeof(VkBaseOutStructure));
    memcpy(out->deviceUUID, physical->uuid, VK_UUID_SIZE);
    out->subgroupSize = physical->subgroup_size;
    out->subgroupSupportedStages = physical->subgroup_operations ? VK_SHADER_STAGE_COMPUTE_BIT : 0;
    out->subgroupSupportedOperations = physical->subgroup_operations;
    out->pointClippingBehavior = VK_POINT_CLIPPING_BEHAVIOR_ALL_CLIP_PLANES;
    out->maxPerSetDescriptors = physical->max_per_set_descriptors;
    out->maxMemoryAllocationSize = physical->max_allocation; /* at most the heap */
}

/* Descriptor indexing's properties. Nothing of it is offered (no non-uniform indexing, and set layouts
 * refuse update after bind), but its update-after-bind limits count the descriptors of every set layout,
 * with that flag or without, so they are the device's per-stage and per-set limits: at 0, every
 * pipeline layout with a buffer was past them (the validation layer said so of wgpu's and vkdispatch's). */
static void indexing_properties(const struct ls_icd_physical *physical,
                                VkPhysicalDeviceDescriptorIndexingProperties *out)
{
    const VkPhysicalDeviceLimits *limits = &physical->properties.limits;
    memset((char *)out + sizeof(VkBaseOutStructure), 0, sizeof(*out) - sizeof(VkBaseOutStructure));
    out->maxPerStageDescriptorUpdateAfterBindSamplers = limits->maxPerStageDescriptorSamplers;
    out->maxPerStageDescriptorUpdateAfterBindUniformBuffers = limits->maxPerStageDescriptorUniformBuffers;
    out->maxPerStageDescriptorUpdateAfterBindStorageBuffers = limits->maxPerStageDescriptorStorageBuffers;
    out->maxPerStageDescriptorUpdateAfterBindSampledImages = limits->maxPerStageDescriptorSampledImages;
    out->maxPerStageDescriptorUpdateAfterBindStorageImages = limits->maxPerStageDescriptorStorageImages;
    out->maxPerStageDescriptorUpdateAfterBindInputAttachments = limits->maxPerStageDescriptorInputAttachments;
    out->maxPerStageUpdateAfterBindResources = limits->maxPerStageResources;
    out->maxDescriptorSetUpdateAfterBindSamplers = limits->maxDescriptorSetSamplers;
    out->maxDescriptorSetUpdateAfterBindUniformBuffers = limits->maxDescriptorSetUniformBuffers;
    out->maxDescriptorSetUpdateAfterBindUniformBuffersDynamic = limits->maxDescriptorSetUniformBuffersDynamic;
    out->maxDescriptorSetUpdateAfterBindStorageBuffers = limits->maxDescriptorSetStorageBuffers;
    out->maxDescriptorSetUpdateAfterBindStorageBuffersDynamic = limits->maxDescriptorSetStorageBuffersDynamic;
    out->maxDescriptorSetUpdateAfterBindSampledImages = limits->maxDescriptorSetSampledImages;
    out->maxDescriptorSetUpdateAfterBindStorageImages = limits->maxDescriptorSetStorageImages;
    out->maxDescriptorSetUpdateAfterBindInputAttachments = limits->maxDescriptorSetInputAttachments;
}

/* Where descriptor indexing's members lie, from maxUpdateAfterBindDescriptorsInAllPools to the last: in the
 * same order in VkPhysicalDeviceVulkan12Properties, which aggregates them. */
#define INDEXING_FIRST(type) offsetof(type, maxUpdateAfterBindDescriptorsInAllPools)
#define INDEXING_SIZE(type) (LS_ICD_END(type, maxDescriptorSetUpdateAfterBindInputAttachments) - INDEXING_FIRST(type))
_Static_assert(INDEXING_SIZE(VkPhysicalDeviceVulkan12Properties) ==
                   INDEXING_SIZE(VkPhysicalDeviceDescriptorIndexingProperties),
               "descriptor indexing's members are laid out alike in both structures");

/* Vulkan 1.2's properties: who the driver is, the float controls the arbiter's device has (the
 * independences conservative), timeline semaphores without bound, descriptor indexing's as
 * indexing_properties says; no depth resolve or sampler reduction (their limits 0). */
static void vulkan12_properties(const struct ls_icd_physical *physical, VkPhysicalDeviceVulkan12Properties *out)
{
    VkPhysicalDeviceDescriptorIndexingProperties indexing;
    memset((char *)out + sizeof(VkBaseOutStructure), 0, sizeof(*out) - sizeof(VkBaseOutStructure));
    indexing_properties(physical, &indexing);
    memcpy((char *)out + INDEXING_FIRST(VkPhysicalDeviceVulkan12Properties),
           (const char *)&indexing + INDEXING_FIRST(VkPhysicalDeviceDescriptorIndexingProperties),
           INDEXING_SIZE(VkPhysicalDeviceDescriptorIndexingProperties));
    identity(physical, &out->driverID, out->driverName, out->driverInfo, &out->conformanceVersion);
    out->denormBehaviorIndependence = VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
    out->roundingModeIndependence = VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
    out->maxTimelineSemaphoreValueDifference = UINT64_MAX;
    ls_icd_fields_report(physical, (VkBaseOutStructure *)out); /* the float controls (features.c) */
}

/* Subgroup size control's properties, where it is offered: the device's one subgroup size (hello.c). */
static void size_control(const struct ls_icd_physical *physical, VkPhysicalDeviceSubgroupSizeControlProperties *out)
{
    out->minSubgroupSize = out->maxSubgroupSize = physical->subgroup_size;
    out->maxComputeWorkgroupSubgroups = physical->workgroup_subgroups;
    out->requiredSubgroupSizeStages = VK_SHADER_STAGE_COMPUTE_BIT;
}

VkResult ls_icd_stage_subgroups(const struct ls_icd_physical *physical, const VkPipelineShaderStageCreateInfo *stage,
                                const uint32_t local_size[3])
{
    const VkPipelineShaderStageCreateFlags varying = VK_PIPELINE_SHADER_STAGE_CREATE_ALLOW_VARYING_SUBGROUP_SIZE_BIT,
                                           full = VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
    int controlled = ls_icd_fields_reported(physical, "subgroupSizeControl");
    if ((stage->flags & ~(varying | full)) != 0 || ((stage->flags & varying) && !controlled) ||
        ((stage->flags & full) && (!ls_icd_fields_reported(physical, "computeFullSubgroups") ||
                                   local_size[0] % physical->subgroup_size != 0)))
        return LS_ICD_INVALID;
    for (const VkBaseInStructure *next = stage->pNext; next != NULL; next = next->pNext)
        if (next->sType == VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO &&
            (!controlled || (stage->flags & varying) ||
             ((const VkPipelineShaderStageRequiredSubgroupSizeCreateInfo *)next)->requiredSubgroupSize !=
                 physical->subgroup_size))
            return LS_ICD_INVALID;
    return VK_SUCCESS;
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
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DESCRIPTOR_INDEXING_PROPERTIES:
            indexing_properties(physical, (VkPhysicalDeviceDescriptorIndexingProperties *)next);
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES:
            if (ls_icd_fields_reported(physical, "subgroupSizeControl"))
                size_control(physical, (VkPhysicalDeviceSubgroupSizeControlProperties *)next);
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_PROPERTIES_EXT:
            if (ls_icd_fields_reported(physical, "robustBufferAccess2")) { /* the coarsest the limits allow */
                ((VkPhysicalDeviceRobustness2PropertiesEXT *)next)->robustStorageBufferAccessSizeAlignment = 4;
                ((VkPhysicalDeviceRobustness2PropertiesEXT *)next)->robustUniformBufferAccessSizeAlignment = 256;
            }
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR:
            ((VkPhysicalDevicePushDescriptorPropertiesKHR *)next)->maxPushDescriptors = LS_ICD_MOST_PUSHED;
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES:
            vulkan11_properties(physical, (VkPhysicalDeviceVulkan11Properties *)next);
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES:
            vulkan12_properties(physical, (VkPhysicalDeviceVulkan12Properties *)next);
            break;
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES: {
            VkPhysicalDeviceDriverProperties *driver = (VkPhysicalDeviceDriverProperties *)next;
            identity(physical, &driver->driverID, driver->driverName, driver->driverInfo,
                     &driver->conformanceVersion);
            break;
        }
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES: {
            VkPhysicalDeviceFloatControlsProperties *controls = (VkPhysicalDeviceFloatControlsProperties *)next;
            memset((char *)controls + sizeof(VkBaseOutStructure), 0, sizeof(*controls) - sizeof(VkBaseOutStructure));
            controls->denormBehaviorIndependence = VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
            controls->roundingModeIndependence = VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
            ls_icd_fields_report(physical, next);
            break;
        }
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
        if (ls_icd_fields_known(next->sType))
            ls_icd_fields_report(physical, next); /* (features.c) */
        else
            clear_if_off(next);
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

const struct ls_icd_texel_format *ls_icd_texel_format(const struct ls_icd_physical *physical, VkFormat format)
{
    for (uint32_t i = 0; i < physical->ntexels; i++)
        if (physical->texels[i].vk_format == (uint32_t)format)
            return &physical->texels[i];
    return NULL;
}

/* A format's buffer features: the texel buffers the arbiter's device makes of it (no images: no other feature). */
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties(VkPhysicalDevice pd, VkFormat format,
                                                                    VkFormatProperties *out)
{
    const struct ls_icd_texel_format *texel = ls_icd_texel_format(physical_of(pd), format);
    memset(out, 0, sizeof(*out));
    if (texel != NULL)
        out->bufferFeatures = (texel->uses & LS_ICD_TEXEL_STORAGE ? VK_FORMAT_FEATURE_STORAGE_TEXEL_BUFFER_BIT : 0) |
                              (texel->uses & LS_ICD_TEXEL_UNIFORM ? VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT : 0);
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

/* The device extensions offered, with their ls_icd_device.extensions bit (LS_ICD_EXT_PLAIN: one with
 * no command), each when the arbiter's device has the feature it brings (NULL: always). */
static const struct {
    VkExtensionProperties properties;
    uint32_t bit;
    const char *needs;
} EXTENSIONS[] = {
    {{VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME, VK_KHR_TIMELINE_SEMAPHORE_SPEC_VERSION}, LS_ICD_EXT_TIMELINE, NULL},
#if LS_ICD_OFFERS_SYNC2
    {{VK_KHR_SYNCHRONIZATION_2_EXTENSION_NAME, VK_KHR_SYNCHRONIZATION_2_SPEC_VERSION}, LS_ICD_EXT_SYNC2, NULL},
#endif
    {{VK_EXT_HOST_QUERY_RESET_EXTENSION_NAME, VK_EXT_HOST_QUERY_RESET_SPEC_VERSION}, LS_ICD_EXT_QUERY_RESET, NULL},
    {{VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME, VK_KHR_PUSH_DESCRIPTOR_SPEC_VERSION}, LS_ICD_EXT_PUSH, NULL},
    {{VK_KHR_DESCRIPTOR_UPDATE_TEMPLATE_EXTENSION_NAME, VK_KHR_DESCRIPTOR_UPDATE_TEMPLATE_SPEC_VERSION},
     LS_ICD_EXT_TEMPLATE, NULL},
    /* Vulkan 1.1's, under their extension names too: applications that enable them when listed (Taichi) */
    {{VK_KHR_GET_MEMORY_REQUIREMENTS_2_EXTENSION_NAME, VK_KHR_GET_MEMORY_REQUIREMENTS_2_SPEC_VERSION},
     LS_ICD_EXT_MEMORY_REQUIREMENTS, NULL},
    {{VK_KHR_BIND_MEMORY_2_EXTENSION_NAME, VK_KHR_BIND_MEMORY_2_SPEC_VERSION}, LS_ICD_EXT_BIND_MEMORY, NULL},
    {{VK_KHR_DEDICATED_ALLOCATION_EXTENSION_NAME, VK_KHR_DEDICATED_ALLOCATION_SPEC_VERSION}, LS_ICD_EXT_PLAIN, NULL},
    {{VK_KHR_MAINTENANCE_1_EXTENSION_NAME, VK_KHR_MAINTENANCE_1_SPEC_VERSION}, LS_ICD_EXT_MAINTENANCE1, NULL},
    {{VK_KHR_MAINTENANCE_2_EXTENSION_NAME, VK_KHR_MAINTENANCE_2_SPEC_VERSION}, LS_ICD_EXT_PLAIN, NULL},
    {{VK_KHR_MAINTENANCE_3_EXTENSION_NAME, VK_KHR_MAINTENANCE_3_SPEC_VERSION}, LS_ICD_EXT_MAINTENANCE3, NULL},
    {{VK_KHR_SPIRV_1_4_EXTENSION_NAME, VK_KHR_SPIRV_1_4_SPEC_VERSION}, LS_ICD_EXT_PLAIN, NULL}, /* (1.2 takes 1.5) */
    {{VK_EXT_ROBUSTNESS_2_EXTENSION_NAME, VK_EXT_ROBUSTNESS_2_SPEC_VERSION}, LS_ICD_EXT_PLAIN, "robustBufferAccess2"},
    {{VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME, VK_KHR_DRIVER_PROPERTIES_SPEC_VERSION}, LS_ICD_EXT_PLAIN, NULL},
    {{VK_KHR_SHADER_FLOAT_CONTROLS_EXTENSION_NAME, VK_KHR_SHADER_FLOAT_CONTROLS_SPEC_VERSION}, LS_ICD_EXT_PLAIN, NULL},
    /* a device that cannot take non-semantic instructions gets modules without them (programs/nonsemantic.py) */
    {{VK_KHR_SHADER_NON_SEMANTIC_INFO_EXTENSION_NAME, VK_KHR_SHADER_NON_SEMANTIC_INFO_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     NULL},
    {{VK_KHR_STORAGE_BUFFER_STORAGE_CLASS_EXTENSION_NAME, VK_KHR_STORAGE_BUFFER_STORAGE_CLASS_SPEC_VERSION},
     LS_ICD_EXT_PLAIN, NULL},
    {{VK_KHR_16BIT_STORAGE_EXTENSION_NAME, VK_KHR_16BIT_STORAGE_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "storageBuffer16BitAccess"},
    {{VK_KHR_8BIT_STORAGE_EXTENSION_NAME, VK_KHR_8BIT_STORAGE_SPEC_VERSION}, LS_ICD_EXT_PLAIN, "storageBuffer8BitAccess"},
    {{VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME, VK_KHR_SHADER_FLOAT16_INT8_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "shaderInt8"},
    {{VK_KHR_SHADER_ATOMIC_INT64_EXTENSION_NAME, VK_KHR_SHADER_ATOMIC_INT64_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "shaderBufferInt64Atomics"},
    {{VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME, VK_KHR_VULKAN_MEMORY_MODEL_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "vulkanMemoryModel"},
    {{VK_KHR_SHADER_SUBGROUP_EXTENDED_TYPES_EXTENSION_NAME, VK_KHR_SHADER_SUBGROUP_EXTENDED_TYPES_SPEC_VERSION},
     LS_ICD_EXT_PLAIN, "shaderSubgroupExtendedTypes"},
    {{VK_EXT_SCALAR_BLOCK_LAYOUT_EXTENSION_NAME, VK_EXT_SCALAR_BLOCK_LAYOUT_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "scalarBlockLayout"},
    {{VK_KHR_UNIFORM_BUFFER_STANDARD_LAYOUT_EXTENSION_NAME, VK_KHR_UNIFORM_BUFFER_STANDARD_LAYOUT_SPEC_VERSION},
     LS_ICD_EXT_PLAIN, "uniformBufferStandardLayout"},
    {{VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME, VK_EXT_SHADER_ATOMIC_FLOAT_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "shaderBufferFloat32Atomics"},
    {{VK_EXT_SHADER_ATOMIC_FLOAT_2_EXTENSION_NAME, VK_EXT_SHADER_ATOMIC_FLOAT_2_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "shaderBufferFloat32AtomicMinMax"},
    {{VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_SPEC_VERSION},
     LS_ICD_EXT_PLAIN, "shaderIntegerDotProduct"},
    {{VK_KHR_ZERO_INITIALIZE_WORKGROUP_MEMORY_EXTENSION_NAME, VK_KHR_ZERO_INITIALIZE_WORKGROUP_MEMORY_SPEC_VERSION},
     LS_ICD_EXT_PLAIN, "shaderZeroInitializeWorkgroupMemory"},
    {{VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME, VK_EXT_SUBGROUP_SIZE_CONTROL_SPEC_VERSION}, LS_ICD_EXT_PLAIN,
     "subgroupSizeControl"},
};

#define NEXTENSIONS ((uint32_t)(sizeof(EXTENSIONS) / sizeof(EXTENSIONS[0])))

static int offered(const struct ls_icd_physical *physical, uint32_t i)
{
    return EXTENSIONS[i].needs == NULL || ls_icd_fields_reported(physical, EXTENSIONS[i].needs);
}

uint32_t ls_icd_extension_bit(const struct ls_icd_physical *physical, const char *name)
{
    for (uint32_t i = 0; i < NEXTENSIONS; i++)
        if (strcmp(name, EXTENSIONS[i].properties.extensionName) == 0 && offered(physical, i))
            return EXTENSIONS[i].bit;
    return 0;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateDeviceExtensionProperties(VkPhysicalDevice pd, const char *layer,
                                                                        uint32_t *count, VkExtensionProperties *out)
{
    const struct ls_icd_physical *physical = physical_of(pd);
    uint32_t total = 0, written = 0;
    if (layer != NULL)
        return VK_ERROR_LAYER_NOT_PRESENT;
    for (uint32_t i = 0; i < NEXTENSIONS; i++) {
        if (!offered(physical, i))
            continue;
        if (out != NULL && written < *count)
            out[written++] = EXTENSIONS[i].properties;
        total++;
    }
    *count = out == NULL ? total : written;
    return out != NULL && written < total ? VK_INCOMPLETE : VK_SUCCESS;
}
