/* The feature and property structures past VkPhysicalDeviceFeatures: what the driver reports of the
 * arbiter's device, and what vkCreateDevice may enable.
 *
 * Each VkBool32 the driver may report on is a row of FIELDS: the structure it lives in (Vulkan 1.1
 * and 1.2's aggregates and the structures of the extensions they absorbed, which an application
 * may chain instead; VK_EXT_shader_atomic_float's and _float2's buffer and shared atomics, integer dot
 * products, zero-initialized workgroup memory and subgroup size control, extensions of Vulkan 1.3's: the last
 * only where the device runs one subgroup size, hello.c), its offset there, and the
 * name the arbiter's welcome gives it
 * (libshare/arbiter/serve/device_info.py: the features its VkDevice was created with, and its
 * float-controls properties), or ALWAYS for what the driver provides itself (timeline semaphores,
 * synchronization2, the host's query reset). A name in the welcome turns on every row of that name
 * (ls_icd_feature_set; physical->reported holds one bit a row). A feature turns on only when the
 * arbiter has it: its admission refuses a module needing a feature its device lacks, so the driver
 * never offers what the arbiter would refuse. Off for good: bufferDeviceAddress (a raw address would
 * escape the arbiter's bounds), descriptor indexing and update-after-bind (descriptor.c's sets
 * hold buffers bound whole), and graphics (multiview, draw parameters, shaderOutputLayer...).
 *
 * vkGetPhysicalDeviceFeatures2 and Properties2 (physical.c) call ls_icd_fields_report on every
 * chained structure: one of FIELDS' structures has each of its VkBool32 set to what is reported
 * (the others zero). vkCreateDevice (device.c) calls ls_icd_fields_check on every chained
 * structure: one of FIELDS' structures asking for a VkBool32 not reported is
 * VK_ERROR_FEATURE_NOT_PRESENT. The structures are sType, pNext and then only VkBool32 (the
 * properties ones aside, which are never enabled). */
#include <stddef.h>
#include <string.h>

#include "icd.h"
#include "physical.h"

#define ALWAYS NULL

#define V11 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES
#define V12 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES
#define S16 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES
#define S8 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES
#define F16 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES
#define I64 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_INT64_FEATURES
#define VMM VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES
#define SGX VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SUBGROUP_EXTENDED_TYPES_FEATURES
#define SBL VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SCALAR_BLOCK_LAYOUT_FEATURES
#define UBL VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_UNIFORM_BUFFER_STANDARD_LAYOUT_FEATURES
#define AF VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT
#define AF2 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_2_FEATURES_EXT
#define IDP VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES
#define ZWM VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ZERO_INITIALIZE_WORKGROUP_MEMORY_FEATURES
#define SSC VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES
#define RB2 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT
#define TLS VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES
#define HQR VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_HOST_QUERY_RESET_FEATURES
#define SY2 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SYNCHRONIZATION_2_FEATURES
#define FCP VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES
#define P12 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES

#define ROW(type, structure, field, name) {type, offsetof(structure, field), name}
#define SAME(type, structure, field) ROW(type, structure, field, #field)
#define FLOAT(field) SAME(FCP, VkPhysicalDeviceFloatControlsProperties, field), \
                     SAME(P12, VkPhysicalDeviceVulkan12Properties, field)

static const struct field {
    VkStructureType type;
    size_t at;        /* the VkBool32's offset in its structure */
    const char *name; /* the welcome's name that turns it on, or ALWAYS */
} FIELDS[] = {
    SAME(V11, VkPhysicalDeviceVulkan11Features, storageBuffer16BitAccess),
    SAME(V11, VkPhysicalDeviceVulkan11Features, uniformAndStorageBuffer16BitAccess),
    SAME(V11, VkPhysicalDeviceVulkan11Features, storagePushConstant16),
    SAME(S16, VkPhysicalDevice16BitStorageFeatures, storageBuffer16BitAccess),
    SAME(S16, VkPhysicalDevice16BitStorageFeatures, uniformAndStorageBuffer16BitAccess),
    SAME(S16, VkPhysicalDevice16BitStorageFeatures, storagePushConstant16),
    SAME(V12, VkPhysicalDeviceVulkan12Features, storageBuffer8BitAccess),
    SAME(V12, VkPhysicalDeviceVulkan12Features, uniformAndStorageBuffer8BitAccess),
    SAME(V12, VkPhysicalDeviceVulkan12Features, storagePushConstant8),
    SAME(V12, VkPhysicalDeviceVulkan12Features, shaderBufferInt64Atomics),
    SAME(V12, VkPhysicalDeviceVulkan12Features, shaderSharedInt64Atomics),
    SAME(V12, VkPhysicalDeviceVulkan12Features, shaderFloat16),
    SAME(V12, VkPhysicalDeviceVulkan12Features, shaderInt8),
    ROW(V12, VkPhysicalDeviceVulkan12Features, hostQueryReset, ALWAYS),
    ROW(V12, VkPhysicalDeviceVulkan12Features, timelineSemaphore, ALWAYS),
    SAME(V12, VkPhysicalDeviceVulkan12Features, vulkanMemoryModel),
    SAME(V12, VkPhysicalDeviceVulkan12Features, vulkanMemoryModelDeviceScope),
    SAME(V12, VkPhysicalDeviceVulkan12Features, vulkanMemoryModelAvailabilityVisibilityChains),
    SAME(V12, VkPhysicalDeviceVulkan12Features, shaderSubgroupExtendedTypes),
    SAME(S8, VkPhysicalDevice8BitStorageFeatures, storageBuffer8BitAccess),
    SAME(S8, VkPhysicalDevice8BitStorageFeatures, uniformAndStorageBuffer8BitAccess),
    SAME(S8, VkPhysicalDevice8BitStorageFeatures, storagePushConstant8),
    SAME(F16, VkPhysicalDeviceShaderFloat16Int8Features, shaderFloat16),
    SAME(F16, VkPhysicalDeviceShaderFloat16Int8Features, shaderInt8),
    SAME(I64, VkPhysicalDeviceShaderAtomicInt64Features, shaderBufferInt64Atomics),
    SAME(I64, VkPhysicalDeviceShaderAtomicInt64Features, shaderSharedInt64Atomics),
    SAME(VMM, VkPhysicalDeviceVulkanMemoryModelFeatures, vulkanMemoryModel),
    SAME(VMM, VkPhysicalDeviceVulkanMemoryModelFeatures, vulkanMemoryModelDeviceScope),
    SAME(VMM, VkPhysicalDeviceVulkanMemoryModelFeatures, vulkanMemoryModelAvailabilityVisibilityChains),
    SAME(SGX, VkPhysicalDeviceShaderSubgroupExtendedTypesFeatures, shaderSubgroupExtendedTypes),
    SAME(V12, VkPhysicalDeviceVulkan12Features, scalarBlockLayout),
    SAME(SBL, VkPhysicalDeviceScalarBlockLayoutFeatures, scalarBlockLayout),
    SAME(V12, VkPhysicalDeviceVulkan12Features, uniformBufferStandardLayout),
    SAME(UBL, VkPhysicalDeviceUniformBufferStandardLayoutFeatures, uniformBufferStandardLayout),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderBufferFloat32Atomics),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderBufferFloat32AtomicAdd),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderBufferFloat64Atomics),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderBufferFloat64AtomicAdd),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderSharedFloat32Atomics),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderSharedFloat32AtomicAdd),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderSharedFloat64Atomics),
    SAME(AF, VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, shaderSharedFloat64AtomicAdd),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderBufferFloat16Atomics),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderBufferFloat16AtomicAdd),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderBufferFloat16AtomicMinMax),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderBufferFloat32AtomicMinMax),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderBufferFloat64AtomicMinMax),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderSharedFloat16Atomics),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderSharedFloat16AtomicAdd),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderSharedFloat16AtomicMinMax),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderSharedFloat32AtomicMinMax),
    SAME(AF2, VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, shaderSharedFloat64AtomicMinMax),
    SAME(IDP, VkPhysicalDeviceShaderIntegerDotProductFeatures, shaderIntegerDotProduct),
    SAME(ZWM, VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures, shaderZeroInitializeWorkgroupMemory),
    SAME(SSC, VkPhysicalDeviceSubgroupSizeControlFeatures, subgroupSizeControl),
    SAME(SSC, VkPhysicalDeviceSubgroupSizeControlFeatures, computeFullSubgroups),
    SAME(RB2, VkPhysicalDeviceRobustness2FeaturesEXT, robustBufferAccess2),
    ROW(TLS, VkPhysicalDeviceTimelineSemaphoreFeatures, timelineSemaphore, ALWAYS),
    ROW(HQR, VkPhysicalDeviceHostQueryResetFeatures, hostQueryReset, ALWAYS),
    ROW(SY2, VkPhysicalDeviceSynchronization2Features, synchronization2, ALWAYS),
    FLOAT(shaderSignedZeroInfNanPreserveFloat16),
    FLOAT(shaderSignedZeroInfNanPreserveFloat32),
    FLOAT(shaderSignedZeroInfNanPreserveFloat64),
    FLOAT(shaderDenormPreserveFloat16),
    FLOAT(shaderDenormPreserveFloat32),
    FLOAT(shaderDenormPreserveFloat64),
    FLOAT(shaderDenormFlushToZeroFloat16),
    FLOAT(shaderDenormFlushToZeroFloat32),
    FLOAT(shaderDenormFlushToZeroFloat64),
    FLOAT(shaderRoundingModeRTEFloat16),
    FLOAT(shaderRoundingModeRTEFloat32),
    FLOAT(shaderRoundingModeRTEFloat64),
    FLOAT(shaderRoundingModeRTZFloat16),
    FLOAT(shaderRoundingModeRTZFloat32),
    FLOAT(shaderRoundingModeRTZFloat64),
};

#define NFIELDS (sizeof(FIELDS) / sizeof(FIELDS[0]))
_Static_assert(NFIELDS <= 64 * LS_ICD_ROW_WORDS, "physical->reported holds one bit a row");

/* Whether row i is reported, and reporting it. */
static int row_on(const struct ls_icd_physical *physical, size_t i)
{
    return (physical->reported[i / 64] >> (i % 64)) & 1;
}

static void report_row(struct ls_icd_physical *physical, size_t i)
{
    physical->reported[i / 64] |= 1ull << (i % 64);
}

/* The feature structures of FIELDS and where their members end (each sType, pNext, then VkBool32
 * only): the last member's end, not sizeof, whose tail padding an application need not have set. */
static const struct {
    VkStructureType type;
    size_t size;
} FEATURE_STRUCTS[] = {
    {V11, LS_ICD_END(VkPhysicalDeviceVulkan11Features, shaderDrawParameters)},
    {V12, LS_ICD_END(VkPhysicalDeviceVulkan12Features, subgroupBroadcastDynamicId)},
    {S16, LS_ICD_END(VkPhysicalDevice16BitStorageFeatures, storageInputOutput16)},
    {S8, LS_ICD_END(VkPhysicalDevice8BitStorageFeatures, storagePushConstant8)},
    {F16, LS_ICD_END(VkPhysicalDeviceShaderFloat16Int8Features, shaderInt8)},
    {I64, LS_ICD_END(VkPhysicalDeviceShaderAtomicInt64Features, shaderSharedInt64Atomics)},
    {VMM, LS_ICD_END(VkPhysicalDeviceVulkanMemoryModelFeatures, vulkanMemoryModelAvailabilityVisibilityChains)},
    {SGX, LS_ICD_END(VkPhysicalDeviceShaderSubgroupExtendedTypesFeatures, shaderSubgroupExtendedTypes)},
    {SBL, LS_ICD_END(VkPhysicalDeviceScalarBlockLayoutFeatures, scalarBlockLayout)},
    {UBL, LS_ICD_END(VkPhysicalDeviceUniformBufferStandardLayoutFeatures, uniformBufferStandardLayout)},
    {AF, LS_ICD_END(VkPhysicalDeviceShaderAtomicFloatFeaturesEXT, sparseImageFloat32AtomicAdd)},
    {AF2, LS_ICD_END(VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT, sparseImageFloat32AtomicMinMax)},
    {IDP, LS_ICD_END(VkPhysicalDeviceShaderIntegerDotProductFeatures, shaderIntegerDotProduct)},
    {ZWM, LS_ICD_END(VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures, shaderZeroInitializeWorkgroupMemory)},
    {SSC, LS_ICD_END(VkPhysicalDeviceSubgroupSizeControlFeatures, computeFullSubgroups)},
    {RB2, LS_ICD_END(VkPhysicalDeviceRobustness2FeaturesEXT, nullDescriptor)},
    {TLS, LS_ICD_END(VkPhysicalDeviceTimelineSemaphoreFeatures, timelineSemaphore)},
    {HQR, LS_ICD_END(VkPhysicalDeviceHostQueryResetFeatures, hostQueryReset)},
    {SY2, LS_ICD_END(VkPhysicalDeviceSynchronization2Features, synchronization2)},
};

static size_t feature_size(VkStructureType type)
{
    for (size_t i = 0; i < sizeof(FEATURE_STRUCTS) / sizeof(FEATURE_STRUCTS[0]); i++)
        if (FEATURE_STRUCTS[i].type == type)
            return FEATURE_STRUCTS[i].size;
    return 0;
}

void ls_icd_fields_always(struct ls_icd_physical *physical)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (FIELDS[i].name == ALWAYS && (FIELDS[i].type != SY2 || LS_ICD_OFFERS_SYNC2))
            report_row(physical, i);
}

int ls_icd_fields_set(struct ls_icd_physical *physical, const char *name)
{
    int found = 0;
    for (size_t i = 0; i < NFIELDS; i++) {
        if (FIELDS[i].name != ALWAYS && strcmp(FIELDS[i].name, name) == 0) {
            report_row(physical, i);
            found = 1;
        }
    }
    return found;
}

int ls_icd_fields_reported(const struct ls_icd_physical *physical, const char *name)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (FIELDS[i].name != ALWAYS && strcmp(FIELDS[i].name, name) == 0)
            return row_on(physical, i);
    return 0;
}

void ls_icd_fields_report(const struct ls_icd_physical *physical, VkBaseOutStructure *next)
{
    const VkBool32 on = VK_TRUE;
    size_t size = feature_size(next->sType);
    if (size != 0) /* (a properties structure's other members are physical.c's to write) */
        memset((char *)next + sizeof(VkBaseOutStructure), 0, size - sizeof(VkBaseOutStructure));
    for (size_t i = 0; i < NFIELDS; i++)
        if (FIELDS[i].type == next->sType && row_on(physical, i))
            memcpy((char *)next + FIELDS[i].at, &on, sizeof(on));
}

int ls_icd_fields_known(VkStructureType type)
{
    return feature_size(type) != 0;
}

VkResult ls_icd_fields_check(const struct ls_icd_physical *physical, const VkBaseInStructure *next)
{
    size_t size = feature_size(next->sType);
    for (size_t at = sizeof(VkBaseInStructure); at + sizeof(VkBool32) <= size; at += sizeof(VkBool32)) {
        VkBool32 asked;
        int offered = 0;
        memcpy(&asked, (const char *)next + at, sizeof(asked));
        for (size_t i = 0; asked && i < NFIELDS && !offered; i++)
            offered = FIELDS[i].type == next->sType && FIELDS[i].at == at && row_on(physical, i);
        if (asked && !offered)
            return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    return VK_SUCCESS;
}
