/* An unmodified C program on the Vulkan API (the loader's vulkan/vulkan.h, -lvulkan): what it sees.
 *
 * Prints one line per physical device: "device NAME|HEAP_BYTES|FAMILIES|QUEUE_FLAGS|MAX_GROUP_X", then
 * "create_device RESULT" for its first device, or "instance RESULT" when the instance cannot be made.
 * Exit status 0 whatever Vulkan answered: a crash is the failure. It knows nothing of libshare. */
#include <stdio.h>
#include <vulkan/vulkan.h>

int main(void)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "probe.c",
                             .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance instance;
    VkPhysicalDevice devices[8];
    uint32_t count = 8;
    VkResult result = vkCreateInstance(&info, NULL, &instance);
    if (result != VK_SUCCESS) {
        printf("instance %d\n", result);
        return 0;
    }
    result = vkEnumeratePhysicalDevices(instance, &count, devices);
    for (uint32_t i = 0; result >= 0 && i < count; i++) {
        VkPhysicalDeviceProperties2 properties = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
        VkPhysicalDeviceMemoryProperties memory;
        VkQueueFamilyProperties families[4];
        uint32_t family_count = 4;
        vkGetPhysicalDeviceProperties2(devices[i], &properties);
        vkGetPhysicalDeviceMemoryProperties(devices[i], &memory);
        vkGetPhysicalDeviceQueueFamilyProperties(devices[i], &family_count, families);
        printf("device %s|%llu|%u|%u|%u\n", properties.properties.deviceName,
               (unsigned long long)memory.memoryHeaps[0].size, family_count, families[0].queueFlags,
               properties.properties.limits.maxComputeWorkGroupCount[0]);
    }
    if (result >= 0 && count > 0) {
        float priority = 1.0f;
        VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = 0,
                                         .queueCount = 1, .pQueuePriorities = &priority};
        VkDeviceCreateInfo create = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                     .pQueueCreateInfos = &queue};
        VkDevice device;
        result = vkCreateDevice(devices[0], &create, NULL, &device);
        printf("create_device %d\n", result);
        if (result == VK_SUCCESS)
            vkDestroyDevice(device, NULL);
    }
    vkDestroyInstance(instance, NULL);
    return 0;
}
