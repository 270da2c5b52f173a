/* VkPhysicalDevice's entry points and queries (physical.c), for loader.c's tables and the files
 * that read the reported features: kept out of icd.h, the driver's map, to keep it one file a
 * reader can hold. */
#ifndef LIBSHARE_ICD_PHYSICAL_H
#define LIBSHARE_ICD_PHYSICAL_H

#include "icd.h"

#include <stddef.h>

/* Where a chained structure's members end: past ``last``, its last member. A reader of an
 * application's structure stops there, not at sizeof, whose tail padding it need not have set. */
#define LS_ICD_END(structure, last) (offsetof(structure, last) + sizeof(((structure *)0)->last))

int ls_icd_feature_set(struct ls_icd_physical *physical, const char *name);
/* features.c: the chained feature and property structures (its essay) */
void ls_icd_fields_always(struct ls_icd_physical *physical);           /* what the driver provides itself */
int ls_icd_fields_set(struct ls_icd_physical *physical, const char *name); /* 1 if a row has that name */
int ls_icd_fields_reported(const struct ls_icd_physical *physical, const char *name);
int ls_icd_fields_known(VkStructureType type);                          /* a feature structure of the table */
void ls_icd_fields_report(const struct ls_icd_physical *physical, VkBaseOutStructure *next);
VkResult ls_icd_fields_check(const struct ls_icd_physical *physical, const VkBaseInStructure *next);
size_t ls_icd_off_size(VkStructureType type); /* where an OFF structure's members end, or 0 */
/* physical.c: whether a compute stage's subgroup flags and required size (VK_EXT_subgroup_size_control)
 * may be made of a program of workgroup ``local_size`` here: VK_SUCCESS, else LS_ICD_INVALID. Offered
 * only where the device runs one subgroup size: a required size must be that one (and not with
 * ALLOW_VARYING), REQUIRE_FULL needs a workgroup of whole subgroups in x; no other flag. */
VkResult ls_icd_stage_subgroups(const struct ls_icd_physical *physical, const VkPipelineShaderStageCreateInfo *stage,
                                const uint32_t local_size[3]);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties(VkPhysicalDevice pd, VkPhysicalDeviceProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceProperties2(VkPhysicalDevice pd, VkPhysicalDeviceProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures(VkPhysicalDevice pd, VkPhysicalDeviceFeatures *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFeatures2(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties(VkPhysicalDevice pd, uint32_t *count,
                                                                         VkQueueFamilyProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceQueueFamilyProperties2(VkPhysicalDevice pd, uint32_t *count,
                                                                          VkQueueFamilyProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties(VkPhysicalDevice pd,
                                                                    VkPhysicalDeviceMemoryProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceMemoryProperties2(VkPhysicalDevice pd,
                                                                     VkPhysicalDeviceMemoryProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties(VkPhysicalDevice pd, VkFormat format,
                                                                    VkFormatProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceFormatProperties2(VkPhysicalDevice pd, VkFormat format,
                                                                     VkFormatProperties2 *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkImageTiling tiling, VkImageUsageFlags usage,
    VkImageCreateFlags flags, VkImageFormatProperties *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPhysicalDeviceImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceImageFormatInfo2 *info, VkImageFormatProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties(
    VkPhysicalDevice pd, VkFormat format, VkImageType type, VkSampleCountFlagBits samples, VkImageUsageFlags usage,
    VkImageTiling tiling, uint32_t *count, VkSparseImageFormatProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceSparseImageFormatProperties2(
    VkPhysicalDevice pd, const VkPhysicalDeviceSparseImageFormatInfo2 *info, uint32_t *count,
    VkSparseImageFormatProperties2 *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalBufferProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalBufferInfo *info, VkExternalBufferProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalFenceProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalFenceInfo *info, VkExternalFenceProperties *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetPhysicalDeviceExternalSemaphoreProperties(
    VkPhysicalDevice pd, const VkPhysicalDeviceExternalSemaphoreInfo *info, VkExternalSemaphoreProperties *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateDeviceExtensionProperties(VkPhysicalDevice pd, const char *layer,
                                                                        uint32_t *count,
                                                                        VkExtensionProperties *out);
#endif
