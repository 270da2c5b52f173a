/* VkInstance: one libshare session each, and its one physical device.
 *
 * vkCreateInstance checks what the application enables (instance extensions: only
 * VK_KHR_get_physical_device_properties2; layers: none, the loader runs those), then says
 * hello to the arbiter (hello.c). The session lives as long as the instance: `libshare-control
 * ps` shows the application from vkCreateInstance to vkDestroyInstance, by the name, group and
 * priority of its environment. No arbiter answering, or a refusal, is
 * VK_ERROR_INITIALIZATION_FAILED (the loader then reports no driver), with one line on stderr
 * saying why. The instance holds its physical device inline: it is made with the instance and
 * enumerated as the only one. Host memory comes from the application's allocator when given. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "icd.h"

static const VkExtensionProperties EXTENSIONS[] = {
    {VK_KHR_GET_PHYSICAL_DEVICE_PROPERTIES_2_EXTENSION_NAME, VK_KHR_GET_PHYSICAL_DEVICE_PROPERTIES_2_SPEC_VERSION},
};
#define EXTENSION_COUNT (sizeof(EXTENSIONS) / sizeof(EXTENSIONS[0]))

/* Copy up to ``have`` entries of ``size`` bytes into ``out`` by the Vulkan rule of two calls. */
static VkResult enumerate(const void *have, uint32_t count, size_t size, uint32_t *wanted, void *out)
{
    if (out == NULL) {
        *wanted = count;
        return VK_SUCCESS;
    }
    uint32_t n = *wanted < count ? *wanted : count;
    memcpy(out, have, (size_t)n * size);
    *wanted = n;
    return n < count ? VK_INCOMPLETE : VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateInstanceExtensionProperties(const char *layer, uint32_t *count,
                                                                          VkExtensionProperties *properties)
{
    if (layer != NULL)
        return VK_ERROR_LAYER_NOT_PRESENT;
    return enumerate(EXTENSIONS, EXTENSION_COUNT, sizeof(EXTENSIONS[0]), count, properties);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumerateInstanceVersion(uint32_t *version)
{
    *version = LS_ICD_API_VERSION;
    return VK_SUCCESS;
}

static int offered(const char *name)
{
    for (size_t i = 0; i < EXTENSION_COUNT; i++)
        if (strcmp(name, EXTENSIONS[i].extensionName) == 0)
            return 1;
    return 0;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateInstance(const VkInstanceCreateInfo *info,
                                                     const VkAllocationCallbacks *allocator, VkInstance *out)
{
    struct ls_icd_instance *instance;
    char why[LS_ICD_WHY] = "";
    VkResult result;
    if (info->enabledLayerCount > 0)
        return VK_ERROR_LAYER_NOT_PRESENT;
    for (uint32_t i = 0; i < info->enabledExtensionCount; i++)
        if (!offered(info->ppEnabledExtensionNames[i]))
            return VK_ERROR_EXTENSION_NOT_PRESENT;
    instance = ls_icd_host_alloc(allocator, sizeof(*instance), VK_SYSTEM_ALLOCATION_SCOPE_INSTANCE);
    if (instance == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    set_loader_magic_value(instance);
    set_loader_magic_value(&instance->physical);
    instance->physical.instance = instance;
    if (allocator) {
        instance->allocator = *allocator;
        instance->has_allocator = 1;
    }
    instance->api_version = info->pApplicationInfo && info->pApplicationInfo->apiVersion
                                ? info->pApplicationInfo->apiVersion : VK_API_VERSION_1_0;
    result = ls_icd_hello(&instance->session, &instance->physical, why, sizeof(why));
    if (result != VK_SUCCESS) {
        if (why[0])
            fprintf(stderr, "libshare Vulkan driver: %s\n", why);
        ls_icd_host_free(allocator, instance);
        return result;
    }
    *out = (VkInstance)instance;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyInstance(VkInstance handle, const VkAllocationCallbacks *allocator)
{
    struct ls_icd_instance *instance = (struct ls_icd_instance *)handle;
    (void)allocator; /* the one it was made with is kept */
    if (instance == NULL)
        return;
    ls_icd_session_close(&instance->session); /* the arbiter ends the session when its socket closes */
    ls_icd_host_free(instance->has_allocator ? &instance->allocator : NULL, instance);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumeratePhysicalDevices(VkInstance handle, uint32_t *count,
                                                               VkPhysicalDevice *devices)
{
    struct ls_icd_instance *instance = (struct ls_icd_instance *)handle;
    VkPhysicalDevice only = (VkPhysicalDevice)&instance->physical;
    return enumerate(&only, 1, sizeof(only), count, devices);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_EnumeratePhysicalDeviceGroups(VkInstance handle, uint32_t *count,
                                                                    VkPhysicalDeviceGroupProperties *groups)
{
    struct ls_icd_instance *instance = (struct ls_icd_instance *)handle;
    if (groups == NULL) {
        *count = 1;
        return VK_SUCCESS;
    }
    if (*count == 0)
        return VK_INCOMPLETE; /* (no room: none written, *count stays 0) */
    groups[0].physicalDeviceCount = 1;
    groups[0].physicalDevices[0] = (VkPhysicalDevice)&instance->physical;
    groups[0].subsetAllocation = VK_FALSE;
    *count = 1;
    return VK_SUCCESS;
}
