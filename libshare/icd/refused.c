/* The core device-level commands outside what the driver implements: refused, or nothing.
 *
 * The loader's trampolines call what vkGetDeviceProcAddr gave them without a check, so every core
 * Vulkan 1.0 and 1.1 device-level command must be in loader.c's table. Those the driver does not
 * implement (graphics, images, sparse binding; shader modules, pipelines and descriptors are
 * pipeline.c's and descriptor.c's, query pools and their vkCmd* query.c's) point at ls_icd_refused,
 * which answers VK_ERROR_FEATURE_NOT_PRESENT, when they return a VkResult, and at ls_icd_nothing
 * when they return nothing: the graphics vkCmd* (draws, render passes, dynamic state, image copies
 * and clears), which record nothing into a command buffer (commands.c). Both take no parameters and
 * are called with the command's: on the System V x86-64 and AArch64 calling conventions (the
 * platforms the driver builds on) the caller owns its arguments' registers and stack, so a callee
 * that reads none is called safely. Since no object those commands make can exist, a command that
 * would act on one is never given a real one. The few void queries that the application reads an
 * answer from write an honest empty one: no sparse requirements. */
#include "icd.h"

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_refused(void)
{
    return VK_ERROR_FEATURE_NOT_PRESENT;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_nothing(void)
{
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetImageSparseMemoryRequirements(VkDevice device, VkImage image, uint32_t *count,
                                                                  VkSparseImageMemoryRequirements *out)
{
    (void)device, (void)image, (void)out;
    *count = 0; /* no image exists */
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetImageSparseMemoryRequirements2(VkDevice device,
                                                                   const VkImageSparseMemoryRequirementsInfo2 *info,
                                                                   uint32_t *count,
                                                                   VkSparseImageMemoryRequirements2 *out)
{
    (void)device, (void)info, (void)out;
    *count = 0;
}
