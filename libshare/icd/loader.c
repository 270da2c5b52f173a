/* The loader interface: what the Vulkan loader calls first, and the table of entry points.
 *
 * The loader reads the manifest (libshare/icd/__init__.py writes it), dlopens this library and
 * calls the three exported functions of the loader-driver interface (the Vulkan-Loader's
 * LoaderDriverInterface.md): vk_icdNegotiateLoaderICDInterfaceVersion (version 5 at most:
 * the loader checks our apiVersion, and wants nothing Windows-only), vk_icdGetInstanceProcAddr
 * and vk_icdGetPhysicalDeviceProcAddr. Every entry point the driver offers is in ENTRY_POINTS
 * (core and KHR-suffixed aliases side by side); any other name answers NULL, so the loader
 * reports it absent. Global commands (those with no instance) are answered for any instance,
 * as the interface requires. */
#include <string.h>

#include "icd.h"

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

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL ls_icd_GetDeviceProcAddr(VkDevice device, const char *name);

static const struct entry INSTANCE_ENTRY_POINTS[] = {
    ENTRY("vkDestroyInstance", ls_icd_DestroyInstance),
    ENTRY("vkEnumeratePhysicalDevices", ls_icd_EnumeratePhysicalDevices),
    ENTRY("vkEnumeratePhysicalDeviceGroups", ls_icd_EnumeratePhysicalDeviceGroups),
    ENTRY("vkEnumeratePhysicalDeviceGroupsKHR", ls_icd_EnumeratePhysicalDeviceGroups),
    ENTRY("vkGetDeviceProcAddr", ls_icd_GetDeviceProcAddr),
};

#define COUNT(table) (sizeof(table) / sizeof(table[0]))

static PFN_vkVoidFunction find(const struct entry *table, size_t count, const char *name)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].function;
    return NULL;
}

/* No device can exist yet (ls_icd_CreateDevice refuses): no device-level entry point. The loader
 * wants the function itself all the same. */
static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL ls_icd_GetDeviceProcAddr(VkDevice device, const char *name)
{
    (void)device, (void)name;
    return NULL;
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
    return function;
}
