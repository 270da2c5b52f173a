/* VkDevice: what vkCreateDevice checks, before the device layer exists.
 *
 * The checks are those the finished device keeps: one queue of family 0 (the only family, one
 * queue), no device extension (none is offered), and no feature the physical device does not
 * report (VkPhysicalDeviceFeatures, through pEnabledFeatures or a chained VkPhysicalDeviceFeatures2,
 * and VkPhysicalDevice16BitStorageFeatures); a chained structure that asks for a feature the
 * driver reports all off (physical.c's OFF: buffer device address, variable pointers,
 * multiview...) is VK_ERROR_FEATURE_NOT_PRESENT too. Every request that passes is then refused with
 * VK_ERROR_INITIALIZATION_FAILED: a device would have to offer every core device-level command,
 * since the loader's trampolines call what the driver gives them unchecked (docs/icd.md). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "icd.h"

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
        case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES:
            if (more_than(&((const VkPhysicalDevice16BitStorageFeatures *)next)->storageBuffer16BitAccess,
                          &physical->storage16.storageBuffer16BitAccess, 4)) /* its four VkBool32 */
                return VK_ERROR_FEATURE_NOT_PRESENT;
            break;
        default: /* a structure whose features the driver reports all off (physical.c's OFF) */
            size = ls_icd_off_size(next->sType);
            if (size != 0 && any_on(next, size))
                return VK_ERROR_FEATURE_NOT_PRESENT;
            break;
        }
    }
    return VK_SUCCESS;
}

VkResult ls_icd_check_device(const struct ls_icd_physical *physical, const VkDeviceCreateInfo *info)
{
    if (info->enabledExtensionCount > 0)
        return VK_ERROR_EXTENSION_NOT_PRESENT;
    if (info->queueCreateInfoCount != 1 || info->pQueueCreateInfos == NULL ||
        info->pQueueCreateInfos[0].queueFamilyIndex != 0 || info->pQueueCreateInfos[0].queueCount != 1)
        return VK_ERROR_INITIALIZATION_FAILED; /* one family, one queue */
    return check_features(physical, info);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *info,
                                                   const VkAllocationCallbacks *allocator, VkDevice *out)
{
    VkResult result = ls_icd_check_device((const struct ls_icd_physical *)pd, info);
    (void)allocator, (void)out;
    if (result != VK_SUCCESS)
        return result;
    fprintf(stderr, "libshare Vulkan driver: devices are not implemented yet (docs/icd.md)\n");
    return VK_ERROR_INITIALIZATION_FAILED;
}
