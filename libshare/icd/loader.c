/* The loader interface: what the Vulkan loader calls first, and the table of entry points.
 *
 * The loader reads the manifest (libshare/icd/__init__.py writes it), dlopens this library and
 * calls the three exported functions of the loader-driver interface (the Vulkan-Loader's
 * LoaderDriverInterface.md): vk_icdNegotiateLoaderICDInterfaceVersion (version 5 at most:
 * the loader checks our apiVersion, and wants nothing Windows-only), vk_icdGetInstanceProcAddr
 * and vk_icdGetPhysicalDeviceProcAddr. Every entry point the driver offers is in a table (core
 * and KHR-suffixed aliases side by side): global, instance, physical-device and device commands
 * (DEVICE_ENTRY_POINTS: every core Vulkan 1.0, 1.1 and 1.2 device-level command, implemented or
 * refused.c's, since the loader's trampolines call them unchecked: a command not implemented is
 * a line pointing at a marker, ls_icd_refused, ls_icd_zero or ls_icd_nothing, and the lookup answers its typed stub,
 * generated into stubs.c by _stubs.py), and the commands of the device
 * extensions offered (TIMELINE_ENTRY_POINTS, SYNC2_ENTRY_POINTS, QUERY_RESET_ENTRY_POINTS,
 * PUSH_ENTRY_POINTS, TEMPLATE_ENTRY_POINTS, and the KHR names of Vulkan 1.1's commands for the
 * extensions it absorbed: MEMORY_REQUIREMENTS_, BIND_MEMORY_, MAINTENANCE1_ and MAINTENANCE3_ENTRY_POINTS).
 * vk_icdGetInstanceProcAddr
 * answers all of them, vkGetDeviceProcAddr the device's core commands and those of the extensions
 * it enabled; any other name answers NULL, so the
 * loader reports it absent. Global commands (those with no instance) are answered for any instance,
 * as the interface requires. */
#include <string.h>

#include "commands.h"
#include "descriptor.h"
#include "icd.h"
#include "physical.h"

#define LS_ICD_EXPORT __attribute__((visibility("default")))
#define ENTRY(name, function) {name, (PFN_vkVoidFunction)function}

struct entry {
    const char *name;
    PFN_vkVoidFunction function;
};

static const struct entry GLOBAL_ENTRY_POINTS[] = {
    ENTRY("vkCreateInstance", ls_icd_CreateInstance),
    ENTRY("vkEnumerateInstanceExtensionProperties", ls_icd_EnumerateInstanceExtensionProperties),
    ENTRY("vkEnumerateInstanceVersion", ls_icd_EnumerateInstanceVersion),
};

static const struct entry PHYSICAL_ENTRY_POINTS[] = {
    ENTRY("vkGetPhysicalDeviceProperties", ls_icd_GetPhysicalDeviceProperties),
    ENTRY("vkGetPhysicalDeviceProperties2", ls_icd_GetPhysicalDeviceProperties2),
    ENTRY("vkGetPhysicalDeviceProperties2KHR", ls_icd_GetPhysicalDeviceProperties2),
    ENTRY("vkGetPhysicalDeviceFeatures", ls_icd_GetPhysicalDeviceFeatures),
    ENTRY("vkGetPhysicalDeviceFeatures2", ls_icd_GetPhysicalDeviceFeatures2),
    ENTRY("vkGetPhysicalDeviceFeatures2KHR", ls_icd_GetPhysicalDeviceFeatures2),
    ENTRY("vkGetPhysicalDeviceQueueFamilyProperties", ls_icd_GetPhysicalDeviceQueueFamilyProperties),
    ENTRY("vkGetPhysicalDeviceQueueFamilyProperties2", ls_icd_GetPhysicalDeviceQueueFamilyProperties2),
    ENTRY("vkGetPhysicalDeviceQueueFamilyProperties2KHR", ls_icd_GetPhysicalDeviceQueueFamilyProperties2),
    ENTRY("vkGetPhysicalDeviceMemoryProperties", ls_icd_GetPhysicalDeviceMemoryProperties),
    ENTRY("vkGetPhysicalDeviceMemoryProperties2", ls_icd_GetPhysicalDeviceMemoryProperties2),
    ENTRY("vkGetPhysicalDeviceMemoryProperties2KHR", ls_icd_GetPhysicalDeviceMemoryProperties2),
    ENTRY("vkGetPhysicalDeviceFormatProperties", ls_icd_GetPhysicalDeviceFormatProperties),
    ENTRY("vkGetPhysicalDeviceFormatProperties2", ls_icd_GetPhysicalDeviceFormatProperties2),
    ENTRY("vkGetPhysicalDeviceFormatProperties2KHR", ls_icd_GetPhysicalDeviceFormatProperties2),
    ENTRY("vkGetPhysicalDeviceImageFormatProperties", ls_icd_GetPhysicalDeviceImageFormatProperties),
    ENTRY("vkGetPhysicalDeviceImageFormatProperties2", ls_icd_GetPhysicalDeviceImageFormatProperties2),
    ENTRY("vkGetPhysicalDeviceImageFormatProperties2KHR", ls_icd_GetPhysicalDeviceImageFormatProperties2),
    ENTRY("vkGetPhysicalDeviceSparseImageFormatProperties", ls_icd_GetPhysicalDeviceSparseImageFormatProperties),
    ENTRY("vkGetPhysicalDeviceSparseImageFormatProperties2", ls_icd_GetPhysicalDeviceSparseImageFormatProperties2),
    ENTRY("vkGetPhysicalDeviceSparseImageFormatProperties2KHR", ls_icd_GetPhysicalDeviceSparseImageFormatProperties2),
    ENTRY("vkGetPhysicalDeviceExternalBufferProperties", ls_icd_GetPhysicalDeviceExternalBufferProperties),
    ENTRY("vkGetPhysicalDeviceExternalFenceProperties", ls_icd_GetPhysicalDeviceExternalFenceProperties),
    ENTRY("vkGetPhysicalDeviceExternalSemaphoreProperties", ls_icd_GetPhysicalDeviceExternalSemaphoreProperties),
    ENTRY("vkEnumerateDeviceExtensionProperties", ls_icd_EnumerateDeviceExtensionProperties),
    ENTRY("vkCreateDevice", ls_icd_CreateDevice),
};

/* Every core Vulkan 1.0 and 1.1 device-level command: those implemented, then the rest (refused.c). */
static const struct entry DEVICE_ENTRY_POINTS[] = {
    ENTRY("vkDestroyDevice", ls_icd_DestroyDevice),
    ENTRY("vkGetDeviceQueue", ls_icd_GetDeviceQueue),
    ENTRY("vkQueueSubmit", ls_icd_QueueSubmit),
    ENTRY("vkQueueWaitIdle", ls_icd_QueueWaitIdle),
    ENTRY("vkDeviceWaitIdle", ls_icd_DeviceWaitIdle),
    ENTRY("vkAllocateMemory", ls_icd_AllocateMemory),
    ENTRY("vkFreeMemory", ls_icd_FreeMemory),
    ENTRY("vkMapMemory", ls_icd_MapMemory),
    ENTRY("vkUnmapMemory", ls_icd_UnmapMemory),
    ENTRY("vkFlushMappedMemoryRanges", ls_icd_FlushMappedMemoryRanges),
    ENTRY("vkInvalidateMappedMemoryRanges", ls_icd_FlushMappedMemoryRanges),
    ENTRY("vkGetDeviceMemoryCommitment", ls_icd_GetDeviceMemoryCommitment),
    ENTRY("vkBindBufferMemory", ls_icd_BindBufferMemory),
    ENTRY("vkGetBufferMemoryRequirements", ls_icd_GetBufferMemoryRequirements),
    ENTRY("vkGetImageSparseMemoryRequirements", ls_icd_GetImageSparseMemoryRequirements),
    ENTRY("vkCreateFence", ls_icd_CreateFence),
    ENTRY("vkDestroyFence", ls_icd_DestroyFence),
    ENTRY("vkResetFences", ls_icd_ResetFences),
    ENTRY("vkGetFenceStatus", ls_icd_GetFenceStatus),
    ENTRY("vkWaitForFences", ls_icd_WaitForFences),
    ENTRY("vkCreateSemaphore", ls_icd_CreateSemaphore),
    ENTRY("vkDestroySemaphore", ls_icd_DestroySemaphore),
    ENTRY("vkCreateEvent", ls_icd_CreateEvent),
    ENTRY("vkDestroyEvent", ls_icd_DestroyEvent),
    ENTRY("vkGetEventStatus", ls_icd_GetEventStatus),
    ENTRY("vkSetEvent", ls_icd_SetEvent),
    ENTRY("vkResetEvent", ls_icd_ResetEvent),
    ENTRY("vkCreateBuffer", ls_icd_CreateBuffer),
    ENTRY("vkDestroyBuffer", ls_icd_DestroyBuffer),
    ENTRY("vkBindBufferMemory2", ls_icd_BindBufferMemory2),
    ENTRY("vkGetDeviceGroupPeerMemoryFeatures", ls_icd_GetDeviceGroupPeerMemoryFeatures),
    ENTRY("vkGetBufferMemoryRequirements2", ls_icd_GetBufferMemoryRequirements2),
    ENTRY("vkGetImageSparseMemoryRequirements2", ls_icd_GetImageSparseMemoryRequirements2),
    ENTRY("vkGetDeviceQueue2", ls_icd_GetDeviceQueue2),
    ENTRY("vkGetDescriptorSetLayoutSupport", ls_icd_GetDescriptorSetLayoutSupport),
    ENTRY("vkCreateShaderModule", ls_icd_CreateShaderModule),
    ENTRY("vkDestroyShaderModule", ls_icd_DestroyShaderModule),
    ENTRY("vkCreatePipelineCache", ls_icd_CreatePipelineCache),
    ENTRY("vkDestroyPipelineCache", ls_icd_DestroyPipelineCache),
    ENTRY("vkGetPipelineCacheData", ls_icd_GetPipelineCacheData),
    ENTRY("vkMergePipelineCaches", ls_icd_MergePipelineCaches),
    ENTRY("vkCreateComputePipelines", ls_icd_CreateComputePipelines),
    ENTRY("vkDestroyPipeline", ls_icd_DestroyPipeline),
    ENTRY("vkCreatePipelineLayout", ls_icd_CreatePipelineLayout),
    ENTRY("vkDestroyPipelineLayout", ls_icd_DestroyPipelineLayout),
    ENTRY("vkCreateDescriptorSetLayout", ls_icd_CreateDescriptorSetLayout),
    ENTRY("vkDestroyDescriptorSetLayout", ls_icd_DestroyDescriptorSetLayout),
    ENTRY("vkCreateDescriptorPool", ls_icd_CreateDescriptorPool),
    ENTRY("vkDestroyDescriptorPool", ls_icd_DestroyDescriptorPool),
    ENTRY("vkResetDescriptorPool", ls_icd_ResetDescriptorPool),
    ENTRY("vkAllocateDescriptorSets", ls_icd_AllocateDescriptorSets),
    ENTRY("vkFreeDescriptorSets", ls_icd_FreeDescriptorSets),
    ENTRY("vkUpdateDescriptorSets", ls_icd_UpdateDescriptorSets),
    ENTRY("vkCreateDescriptorUpdateTemplate", ls_icd_CreateDescriptorUpdateTemplate),
    ENTRY("vkDestroyDescriptorUpdateTemplate", ls_icd_DestroyDescriptorUpdateTemplate),
    ENTRY("vkUpdateDescriptorSetWithTemplate", ls_icd_UpdateDescriptorSetWithTemplate),
    ENTRY("vkBindImageMemory", ls_icd_refused),
    ENTRY("vkGetImageMemoryRequirements", ls_icd_nothing),
    ENTRY("vkQueueBindSparse", ls_icd_refused),
    ENTRY("vkCreateQueryPool", ls_icd_CreateQueryPool),
    ENTRY("vkDestroyQueryPool", ls_icd_DestroyQueryPool),
    ENTRY("vkGetQueryPoolResults", ls_icd_GetQueryPoolResults),
    ENTRY("vkCreateBufferView", ls_icd_CreateBufferView),
    ENTRY("vkDestroyBufferView", ls_icd_DestroyBufferView),
    ENTRY("vkCreateImage", ls_icd_refused),
    ENTRY("vkDestroyImage", ls_icd_nothing),
    ENTRY("vkGetImageSubresourceLayout", ls_icd_nothing),
    ENTRY("vkCreateImageView", ls_icd_refused),
    ENTRY("vkDestroyImageView", ls_icd_nothing),
    ENTRY("vkCreateGraphicsPipelines", ls_icd_refused),
    ENTRY("vkCreateSampler", ls_icd_refused),
    ENTRY("vkDestroySampler", ls_icd_nothing),
    ENTRY("vkCreateFramebuffer", ls_icd_refused),
    ENTRY("vkDestroyFramebuffer", ls_icd_nothing),
    ENTRY("vkCreateRenderPass", ls_icd_refused),
    ENTRY("vkDestroyRenderPass", ls_icd_nothing),
    ENTRY("vkGetRenderAreaGranularity", ls_icd_nothing),
    ENTRY("vkCreateCommandPool", ls_icd_CreateCommandPool),
    ENTRY("vkDestroyCommandPool", ls_icd_DestroyCommandPool),
    ENTRY("vkResetCommandPool", ls_icd_ResetCommandPool),
    ENTRY("vkAllocateCommandBuffers", ls_icd_AllocateCommandBuffers),
    ENTRY("vkFreeCommandBuffers", ls_icd_FreeCommandBuffers),
    ENTRY("vkBeginCommandBuffer", ls_icd_BeginCommandBuffer),
    ENTRY("vkEndCommandBuffer", ls_icd_EndCommandBuffer),
    ENTRY("vkResetCommandBuffer", ls_icd_ResetCommandBuffer),
    ENTRY("vkCmdBindPipeline", ls_icd_CmdBindPipeline),
    ENTRY("vkCmdSetViewport", ls_icd_nothing),
    ENTRY("vkCmdSetScissor", ls_icd_nothing),
    ENTRY("vkCmdSetLineWidth", ls_icd_nothing),
    ENTRY("vkCmdSetDepthBias", ls_icd_nothing),
    ENTRY("vkCmdSetBlendConstants", ls_icd_nothing),
    ENTRY("vkCmdSetDepthBounds", ls_icd_nothing),
    ENTRY("vkCmdSetStencilCompareMask", ls_icd_nothing),
    ENTRY("vkCmdSetStencilWriteMask", ls_icd_nothing),
    ENTRY("vkCmdSetStencilReference", ls_icd_nothing),
    ENTRY("vkCmdBindDescriptorSets", ls_icd_CmdBindDescriptorSets),
    ENTRY("vkCmdBindIndexBuffer", ls_icd_nothing),
    ENTRY("vkCmdBindVertexBuffers", ls_icd_nothing),
    ENTRY("vkCmdDraw", ls_icd_nothing),
    ENTRY("vkCmdDrawIndexed", ls_icd_nothing),
    ENTRY("vkCmdDrawIndirect", ls_icd_nothing),
    ENTRY("vkCmdDrawIndexedIndirect", ls_icd_nothing),
    ENTRY("vkCmdDispatch", ls_icd_CmdDispatch),
    ENTRY("vkCmdDispatchIndirect", ls_icd_CmdDispatchIndirect),
    ENTRY("vkCmdCopyBuffer", ls_icd_CmdCopyBuffer),
    ENTRY("vkCmdCopyImage", ls_icd_nothing),
    ENTRY("vkCmdBlitImage", ls_icd_nothing),
    ENTRY("vkCmdCopyBufferToImage", ls_icd_nothing),
    ENTRY("vkCmdCopyImageToBuffer", ls_icd_nothing),
    ENTRY("vkCmdUpdateBuffer", ls_icd_CmdUpdateBuffer),
    ENTRY("vkCmdFillBuffer", ls_icd_CmdFillBuffer),
    ENTRY("vkCmdClearColorImage", ls_icd_nothing),
    ENTRY("vkCmdClearDepthStencilImage", ls_icd_nothing),
    ENTRY("vkCmdClearAttachments", ls_icd_nothing),
    ENTRY("vkCmdResolveImage", ls_icd_nothing),
    ENTRY("vkCmdSetEvent", ls_icd_CmdSetEvent),
    ENTRY("vkCmdResetEvent", ls_icd_CmdResetEvent),
    ENTRY("vkCmdWaitEvents", ls_icd_CmdWaitEvents),
    ENTRY("vkCmdPipelineBarrier", ls_icd_CmdPipelineBarrier),
    ENTRY("vkCmdBeginQuery", ls_icd_CmdBeginQuery),
    ENTRY("vkCmdEndQuery", ls_icd_CmdEndQuery),
    ENTRY("vkCmdResetQueryPool", ls_icd_CmdResetQueryPool),
    ENTRY("vkCmdWriteTimestamp", ls_icd_CmdWriteTimestamp),
    ENTRY("vkCmdCopyQueryPoolResults", ls_icd_CmdCopyQueryPoolResults),
    ENTRY("vkCmdPushConstants", ls_icd_CmdPushConstants),
    ENTRY("vkCmdBeginRenderPass", ls_icd_nothing),
    ENTRY("vkCmdNextSubpass", ls_icd_nothing),
    ENTRY("vkCmdEndRenderPass", ls_icd_nothing),
    ENTRY("vkCmdExecuteCommands", ls_icd_CmdExecuteCommands),
    ENTRY("vkBindImageMemory2", ls_icd_refused),
    ENTRY("vkCmdSetDeviceMask", ls_icd_nothing),
    ENTRY("vkCmdDispatchBase", ls_icd_CmdDispatchBase),
    ENTRY("vkGetImageMemoryRequirements2", ls_icd_nothing),
    ENTRY("vkTrimCommandPool", ls_icd_TrimCommandPool),
    ENTRY("vkCreateSamplerYcbcrConversion", ls_icd_refused),
    ENTRY("vkDestroySamplerYcbcrConversion", ls_icd_nothing),
    /* Vulkan 1.2 */
    ENTRY("vkCmdDrawIndirectCount", ls_icd_nothing),
    ENTRY("vkCmdDrawIndexedIndirectCount", ls_icd_nothing),
    ENTRY("vkCreateRenderPass2", ls_icd_refused),
    ENTRY("vkCmdBeginRenderPass2", ls_icd_nothing),
    ENTRY("vkCmdNextSubpass2", ls_icd_nothing),
    ENTRY("vkCmdEndRenderPass2", ls_icd_nothing),
    ENTRY("vkResetQueryPool", ls_icd_ResetQueryPool),
    ENTRY("vkGetSemaphoreCounterValue", ls_icd_GetSemaphoreCounterValue),
    ENTRY("vkWaitSemaphores", ls_icd_WaitSemaphores),
    ENTRY("vkSignalSemaphore", ls_icd_SignalSemaphore),
    ENTRY("vkGetBufferDeviceAddress", ls_icd_zero),
    ENTRY("vkGetBufferOpaqueCaptureAddress", ls_icd_zero),
    ENTRY("vkGetDeviceMemoryOpaqueCaptureAddress", ls_icd_zero),
};

/* The commands of the device extensions offered (physical.c's list): answered by vkGetDeviceProcAddr
 * for a device that enabled the extension (the loader's trampolines need them found that way). */
static const struct entry TIMELINE_ENTRY_POINTS[] = {
    ENTRY("vkGetSemaphoreCounterValue", ls_icd_GetSemaphoreCounterValue),
    ENTRY("vkGetSemaphoreCounterValueKHR", ls_icd_GetSemaphoreCounterValue),
    ENTRY("vkWaitSemaphores", ls_icd_WaitSemaphores),
    ENTRY("vkWaitSemaphoresKHR", ls_icd_WaitSemaphores),
    ENTRY("vkSignalSemaphore", ls_icd_SignalSemaphore),
    ENTRY("vkSignalSemaphoreKHR", ls_icd_SignalSemaphore),
};

static const struct entry PUSH_ENTRY_POINTS[] = {
    ENTRY("vkCmdPushDescriptorSetKHR", ls_icd_CmdPushDescriptorSetKHR),
    ENTRY("vkCmdPushDescriptorSetWithTemplateKHR", ls_icd_CmdPushDescriptorSetWithTemplateKHR),
};

static const struct entry TEMPLATE_ENTRY_POINTS[] = {
    ENTRY("vkCreateDescriptorUpdateTemplateKHR", ls_icd_CreateDescriptorUpdateTemplate),
    ENTRY("vkDestroyDescriptorUpdateTemplateKHR", ls_icd_DestroyDescriptorUpdateTemplate),
    ENTRY("vkUpdateDescriptorSetWithTemplateKHR", ls_icd_UpdateDescriptorSetWithTemplate),
};

static const struct entry MEMORY_REQUIREMENTS_ENTRY_POINTS[] = {
    ENTRY("vkGetBufferMemoryRequirements2KHR", ls_icd_GetBufferMemoryRequirements2),
    ENTRY("vkGetImageMemoryRequirements2KHR", ls_icd_nothing),
    ENTRY("vkGetImageSparseMemoryRequirements2KHR", ls_icd_GetImageSparseMemoryRequirements2),
};

static const struct entry BIND_MEMORY_ENTRY_POINTS[] = {
    ENTRY("vkBindBufferMemory2KHR", ls_icd_BindBufferMemory2),
    ENTRY("vkBindImageMemory2KHR", ls_icd_refused),
};

static const struct entry MAINTENANCE1_ENTRY_POINTS[] = {
    ENTRY("vkTrimCommandPoolKHR", ls_icd_TrimCommandPool),
};

static const struct entry MAINTENANCE3_ENTRY_POINTS[] = {
    ENTRY("vkGetDescriptorSetLayoutSupportKHR", ls_icd_GetDescriptorSetLayoutSupport),
};

static const struct entry QUERY_RESET_ENTRY_POINTS[] = {
    ENTRY("vkResetQueryPoolEXT", ls_icd_ResetQueryPool),
};

static const struct entry SYNC2_ENTRY_POINTS[] = {
    ENTRY("vkQueueSubmit2", ls_icd_QueueSubmit2),
    ENTRY("vkQueueSubmit2KHR", ls_icd_QueueSubmit2),
    ENTRY("vkCmdPipelineBarrier2", ls_icd_CmdPipelineBarrier2),
    ENTRY("vkCmdPipelineBarrier2KHR", ls_icd_CmdPipelineBarrier2),
    ENTRY("vkCmdSetEvent2", ls_icd_CmdSetEvent2),
    ENTRY("vkCmdSetEvent2KHR", ls_icd_CmdSetEvent2),
    ENTRY("vkCmdResetEvent2", ls_icd_CmdResetEvent2),
    ENTRY("vkCmdResetEvent2KHR", ls_icd_CmdResetEvent2),
    ENTRY("vkCmdWaitEvents2", ls_icd_CmdWaitEvents2),
    ENTRY("vkCmdWaitEvents2KHR", ls_icd_CmdWaitEvents2),
    ENTRY("vkCmdWriteTimestamp2", ls_icd_CmdWriteTimestamp2),
    ENTRY("vkCmdWriteTimestamp2KHR", ls_icd_CmdWriteTimestamp2),
};

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL ls_icd_GetDeviceProcAddr(VkDevice device, const char *name);

static const struct entry INSTANCE_ENTRY_POINTS[] = {
    ENTRY("vkDestroyInstance", ls_icd_DestroyInstance),
    ENTRY("vkEnumeratePhysicalDevices", ls_icd_EnumeratePhysicalDevices),
    ENTRY("vkEnumeratePhysicalDeviceGroups", ls_icd_EnumeratePhysicalDeviceGroups),
    ENTRY("vkEnumeratePhysicalDeviceGroupsKHR", ls_icd_EnumeratePhysicalDeviceGroups),
    ENTRY("vkGetDeviceProcAddr", ls_icd_GetDeviceProcAddr),
};

#define COUNT(table) (sizeof(table) / sizeof(table[0]))

/* A table's function for ``name``: a marker (ls_icd_refused, ls_icd_nothing) answers the typed stub of
 * that name (stubs.c) instead, so no command is ever called through a pointer of another type. */
static PFN_vkVoidFunction find(const struct entry *table, size_t count, const char *name)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(table[i].name, name) == 0) {
            if (table[i].function == (PFN_vkVoidFunction)ls_icd_refused ||
                table[i].function == (PFN_vkVoidFunction)ls_icd_nothing ||
                table[i].function == (PFN_vkVoidFunction)ls_icd_zero)
                return ls_icd_stub(name);
            return table[i].function;
        }
    return NULL;
}

/* A device-level command by name: a core one, or one of an extension ``device`` enabled. */
static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL ls_icd_GetDeviceProcAddr(VkDevice device, const char *name)
{
    uint32_t extensions = device ? ((const struct ls_icd_device *)device)->extensions : 0;
    PFN_vkVoidFunction function;
    if (name == NULL)
        return NULL;
    if (strcmp(name, "vkGetDeviceProcAddr") == 0)
        return (PFN_vkVoidFunction)ls_icd_GetDeviceProcAddr;
    function = find(DEVICE_ENTRY_POINTS, COUNT(DEVICE_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_TIMELINE))
        function = find(TIMELINE_ENTRY_POINTS, COUNT(TIMELINE_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_SYNC2))
        function = find(SYNC2_ENTRY_POINTS, COUNT(SYNC2_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_QUERY_RESET))
        function = find(QUERY_RESET_ENTRY_POINTS, COUNT(QUERY_RESET_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_PUSH))
        function = find(PUSH_ENTRY_POINTS, COUNT(PUSH_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_TEMPLATE))
        function = find(TEMPLATE_ENTRY_POINTS, COUNT(TEMPLATE_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_MEMORY_REQUIREMENTS))
        function = find(MEMORY_REQUIREMENTS_ENTRY_POINTS, COUNT(MEMORY_REQUIREMENTS_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_BIND_MEMORY))
        function = find(BIND_MEMORY_ENTRY_POINTS, COUNT(BIND_MEMORY_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_MAINTENANCE1))
        function = find(MAINTENANCE1_ENTRY_POINTS, COUNT(MAINTENANCE1_ENTRY_POINTS), name);
    if (function == NULL && (extensions & LS_ICD_EXT_MAINTENANCE3))
        function = find(MAINTENANCE3_ENTRY_POINTS, COUNT(MAINTENANCE3_ENTRY_POINTS), name);
    return function;
}

LS_ICD_EXPORT VKAPI_ATTR VkResult VKAPI_CALL vk_icdNegotiateLoaderICDInterfaceVersion(uint32_t *version)
{
    if (*version < 2)
        return VK_ERROR_INCOMPATIBLE_DRIVER; /* before version 2 the driver would need its own trampolines */
    if (*version > 5)
        *version = 5;
    return VK_SUCCESS;
}

LS_ICD_EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vk_icdGetPhysicalDeviceProcAddr(VkInstance instance,
                                                                                     const char *name)
{
    (void)instance;
    if (name == NULL)
        return NULL;
    return find(PHYSICAL_ENTRY_POINTS, COUNT(PHYSICAL_ENTRY_POINTS), name);
}

LS_ICD_EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vk_icdGetInstanceProcAddr(VkInstance instance, const char *name)
{
    PFN_vkVoidFunction function;
    (void)instance;
    if (name == NULL)
        return NULL;
    function = find(GLOBAL_ENTRY_POINTS, COUNT(GLOBAL_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(INSTANCE_ENTRY_POINTS, COUNT(INSTANCE_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(PHYSICAL_ENTRY_POINTS, COUNT(PHYSICAL_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(DEVICE_ENTRY_POINTS, COUNT(DEVICE_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(TIMELINE_ENTRY_POINTS, COUNT(TIMELINE_ENTRY_POINTS), name);
    if (function == NULL && LS_ICD_OFFERS_SYNC2)
        function = find(SYNC2_ENTRY_POINTS, COUNT(SYNC2_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(QUERY_RESET_ENTRY_POINTS, COUNT(QUERY_RESET_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(PUSH_ENTRY_POINTS, COUNT(PUSH_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(TEMPLATE_ENTRY_POINTS, COUNT(TEMPLATE_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(MEMORY_REQUIREMENTS_ENTRY_POINTS, COUNT(MEMORY_REQUIREMENTS_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(BIND_MEMORY_ENTRY_POINTS, COUNT(BIND_MEMORY_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(MAINTENANCE1_ENTRY_POINTS, COUNT(MAINTENANCE1_ENTRY_POINTS), name);
    if (function == NULL)
        function = find(MAINTENANCE3_ENTRY_POINTS, COUNT(MAINTENANCE3_ENTRY_POINTS), name);
    return function;
}
