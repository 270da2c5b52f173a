/* An unmodified C program on the Vulkan API (the loader's vulkan/vulkan.h, -lvulkan): what it sees.
 *
 * Prints one line per physical device: "device NAME|HEAP_BYTES|FAMILIES|QUEUE_FLAGS|MAX_GROUP_X", then
 * "create_device RESULT" for its first device, or "instance RESULT" when the instance cannot be made.
 * With a device, it then uses its queue, memory and buffers (use_device) and prints one line
 * "NAME RESULT" a step, then its semaphores, fences and events (use_sync), then command buffers
 * (use_commands), and "allocator 1" when all the device's host memory taken from the application's
 * allocator was given back to it. Exit status 0 whatever Vulkan answered: a crash is the failure. It knows nothing
 * of libshare. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

/* Commands outside the driver's slice: an error where they return one, nothing where they do not, called
 * directly and through vkGetDeviceProcAddr with their own types (each is its own function: the addresses
 * differ); and a shader module of one word, invalid (VK_ERROR_UNKNOWN). */
static void refused(VkDevice device, VkQueue queue)
{
    VkCommandPoolCreateInfo pool = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    uint32_t code = 0x07230203;
    VkShaderModuleCreateInfo module = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = 4,
                                       .pCode = &code};
    VkImageCreateInfo image = {.sType = VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO, .imageType = VK_IMAGE_TYPE_2D,
                               .format = VK_FORMAT_R8G8B8A8_UNORM, .extent = {4, 4, 1}, .mipLevels = 1,
                               .arrayLayers = 1, .samples = VK_SAMPLE_COUNT_1_BIT,
                               .usage = VK_IMAGE_USAGE_SAMPLED_BIT};
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    VkSamplerCreateInfo sampler = {.sType = VK_STRUCTURE_TYPE_SAMPLER_CREATE_INFO};
    VkRenderPassCreateInfo pass = {.sType = VK_STRUCTURE_TYPE_RENDER_PASS_CREATE_INFO};
    PFN_vkCreateSampler create_sampler = (PFN_vkCreateSampler)vkGetDeviceProcAddr(device, "vkCreateSampler");
    PFN_vkCreateRenderPass create_pass = (PFN_vkCreateRenderPass)vkGetDeviceProcAddr(device, "vkCreateRenderPass");
    PFN_vkDestroyImage destroy_image = (PFN_vkDestroyImage)vkGetDeviceProcAddr(device, "vkDestroyImage");
    PFN_vkDestroySampler destroy_sampler = (PFN_vkDestroySampler)vkGetDeviceProcAddr(device, "vkDestroySampler");
    VkCommandPool made_pool;
    VkShaderModule made_module;
    VkImage made_image;
    VkSampler made_sampler;
    VkRenderPass made_pass;
    printf("command_pool %d\n", vkCreateCommandPool(device, &pool, NULL, &made_pool));
    printf("shader_module %d\n", vkCreateShaderModule(device, &module, NULL, &made_module));
    printf("image %d\n", vkCreateImage(device, &image, NULL, &made_image));
    printf("submit %d\n", vkQueueSubmit(queue, 1, &submit, VK_NULL_HANDLE));
    printf("proc_refused %d %d\n", create_sampler(device, &sampler, NULL, &made_sampler),
           create_pass(device, &pass, NULL, &made_pass));
    destroy_image(device, VK_NULL_HANDLE, NULL);
    destroy_sampler(device, VK_NULL_HANDLE, NULL);
    printf("proc_distinct %d\n", (PFN_vkVoidFunction)create_sampler != (PFN_vkVoidFunction)create_pass &&
                                     (PFN_vkVoidFunction)destroy_image != (PFN_vkVoidFunction)destroy_sampler);
    vkUpdateDescriptorSets(device, 0, NULL, 0, NULL);
    vkDestroyCommandPool(device, VK_NULL_HANDLE, NULL);
    vkDestroyCommandPool(device, made_pool, NULL);
}

/* Submissions with no command buffer through the ring: a binary semaphore signaled then waited, a
 * timeline one whose wait holds a submission until the host signals it, events, and hostile calls (a
 * wait nothing signals, a pending fence submitted or reset again, wrong handles). */
static void use_sync(VkDevice device, VkQueue queue)
{
    PFN_vkWaitSemaphoresKHR wait_semaphores = (PFN_vkWaitSemaphoresKHR)vkGetDeviceProcAddr(device, "vkWaitSemaphoresKHR");
    PFN_vkSignalSemaphoreKHR signal_semaphore =
        (PFN_vkSignalSemaphoreKHR)vkGetDeviceProcAddr(device, "vkSignalSemaphoreKHR");
    PFN_vkGetSemaphoreCounterValueKHR counter =
        (PFN_vkGetSemaphoreCounterValueKHR)vkGetDeviceProcAddr(device, "vkGetSemaphoreCounterValueKHR");
    VkSemaphoreTypeCreateInfo type = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                      .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE};
    VkSemaphoreCreateInfo binary_info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    VkSemaphoreCreateInfo timeline_info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &type};
    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkEventCreateInfo event_info = {.sType = VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
    VkPipelineStageFlags stage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
    VkSemaphore binary, timeline, wrong = (VkSemaphore)(uintptr_t)0x4242424242ull;
    VkFence fence, held;
    VkEvent event;
    uint64_t two = 2, three = 3, value = 0;
    if (!wait_semaphores || !signal_semaphore || !counter) {
        printf("timeline_commands 0\n");
        return;
    }
    vkCreateSemaphore(device, &binary_info, NULL, &binary);
    vkCreateSemaphore(device, &timeline_info, NULL, &timeline);
    vkCreateFence(device, &fence_info, NULL, &fence);
    vkCreateFence(device, &fence_info, NULL, &held);
    VkSubmitInfo signal = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .signalSemaphoreCount = 1,
                           .pSignalSemaphores = &binary};
    VkSubmitInfo wait = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .waitSemaphoreCount = 1, .pWaitSemaphores = &binary,
                         .pWaitDstStageMask = &stage};
    printf("binary_signal %d\n", vkQueueSubmit(queue, 1, &signal, VK_NULL_HANDLE));
    printf("binary_wait %d\n", vkQueueSubmit(queue, 1, &wait, fence));
    printf("binary_fence %d\n", vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX));
    printf("binary_unsignaled %d\n", vkQueueSubmit(queue, 1, &wait, VK_NULL_HANDLE));
    VkTimelineSemaphoreSubmitInfo values = {.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                            .waitSemaphoreValueCount = 1, .pWaitSemaphoreValues = &two,
                                            .signalSemaphoreValueCount = 1, .pSignalSemaphoreValues = &three};
    VkSubmitInfo timed = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .pNext = &values, .waitSemaphoreCount = 1,
                          .pWaitSemaphores = &timeline, .pWaitDstStageMask = &stage, .signalSemaphoreCount = 1,
                          .pSignalSemaphores = &timeline};
    VkSemaphoreWaitInfo for_three = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, .semaphoreCount = 1,
                                     .pSemaphores = &timeline, .pValues = &three};
    VkSemaphoreSignalInfo to_two = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = timeline,
                                    .value = 2};
    VkSemaphoreSignalInfo to_wrong = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = wrong,
                                      .value = 9};
    printf("timeline_held %d\n", vkQueueSubmit(queue, 1, &timed, held));
    printf("held_status %d\n", vkGetFenceStatus(device, held));
    printf("held_again %d\n", vkQueueSubmit(queue, 0, NULL, held));
    printf("held_reset %d\n", vkResetFences(device, 1, &held));
    printf("timeline_timeout %d\n", wait_semaphores(device, &for_three, 1000000));
    printf("timeline_signal %d\n", signal_semaphore(device, &to_two));
    printf("timeline_back %d\n", signal_semaphore(device, &to_two));
    printf("timeline_wrong %d\n", signal_semaphore(device, &to_wrong));
    printf("timeline_wait %d\n", wait_semaphores(device, &for_three, UINT64_MAX));
    printf("held_fence %d\n", vkWaitForFences(device, 1, &held, VK_TRUE, UINT64_MAX));
    VkResult read = counter(device, timeline, &value);
    printf("counter %d %llu\n", read, (unsigned long long)value);
    printf("fence_wrong %d\n", vkWaitForFences(device, 1, (VkFence *)&wrong, VK_TRUE, 0));
    vkCreateEvent(device, &event_info, NULL, &event);
    printf("event %d\n", vkGetEventStatus(device, event));
    printf("event_set %d", vkSetEvent(device, event));
    printf(" %d\n", vkGetEventStatus(device, event));
    printf("event_reset %d", vkResetEvent(device, event));
    printf(" %d\n", vkGetEventStatus(device, event));
    printf("event_wrong %d\n", vkSetEvent(device, (VkEvent)(uintptr_t)wrong));
    printf("idle_sync %d\n", vkQueueWaitIdle(queue));
    vkDestroyEvent(device, event, NULL);
    vkDestroyFence(device, held, NULL);
    vkDestroyFence(device, fence, NULL);
    vkDestroySemaphore(device, timeline, NULL);
    vkDestroySemaphore(device, binary, NULL);
}

/* A command buffer of a fill, an update, a copy, a barrier, an event set and a secondary command buffer's
 * fill, submitted and checked in the mapping; then one freed while its submission is pending (released
 * when it is answered). */
static void use_commands(VkDevice device, VkQueue queue, VkBuffer buffer, const uint32_t *words)
{
    VkCommandPoolCreateInfo pool_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                         .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT};
    VkCommandBufferAllocateInfo primary_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                                .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 2};
    VkCommandBufferAllocateInfo secondary_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                                  .level = VK_COMMAND_BUFFER_LEVEL_SECONDARY,
                                                  .commandBufferCount = 1};
    VkCommandBufferInheritanceInfo inheritance = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VkCommandBufferBeginInfo begin_secondary = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                                .pInheritanceInfo = &inheritance};
    VkEventCreateInfo event_info = {.sType = VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkBufferCopy region = {.srcOffset = 64, .dstOffset = 1024, .size = 16};
    VkCommandPool pool;
    VkCommandBuffer cbs[2], secondary;
    VkEvent event;
    VkFence fence;
    uint32_t pattern[64];
    int ran = 1;
    for (uint32_t i = 0; i < 64; i++)
        pattern[i] = i;
    VkResult made = vkCreateCommandPool(device, &pool_info, NULL, &pool);
    primary_info.commandPool = secondary_info.commandPool = pool;
    if (made == VK_SUCCESS)
        made = vkAllocateCommandBuffers(device, &primary_info, cbs);
    if (made == VK_SUCCESS)
        made = vkAllocateCommandBuffers(device, &secondary_info, &secondary);
    if (made == VK_SUCCESS)
        made = vkCreateEvent(device, &event_info, NULL, &event);
    if (made == VK_SUCCESS)
        made = vkCreateFence(device, &fence_info, NULL, &fence);
    printf("command_buffers %d\n", made);
    if (made != VK_SUCCESS)
        return;
    vkBeginCommandBuffer(secondary, &begin_secondary);
    vkCmdFillBuffer(secondary, buffer, 0, 64, 5);
    vkEndCommandBuffer(secondary);
    vkBeginCommandBuffer(cbs[0], &begin);
    vkCmdFillBuffer(cbs[0], buffer, 0, VK_WHOLE_SIZE, 0x11);
    vkCmdUpdateBuffer(cbs[0], buffer, 64, sizeof(pattern), pattern);
    vkCmdPipelineBarrier(cbs[0], VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 0, NULL, 0, NULL,
                         0, NULL);
    vkCmdCopyBuffer(cbs[0], buffer, buffer, 1, &region);
    vkCmdExecuteCommands(cbs[0], 1, &secondary);
    vkCmdSetEvent(cbs[0], event, VK_PIPELINE_STAGE_TRANSFER_BIT);
    ((PFN_vkCmdDraw)vkGetDeviceProcAddr(device, "vkCmdDraw"))(cbs[0], 3, 1, 0, 0); /* a graphics command: nothing */
    printf("record %d\n", vkEndCommandBuffer(cbs[0]));
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = cbs};
    if (vkQueueSubmit(queue, 1, &submit, fence) == VK_SUCCESS)
        vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX);
    for (uint32_t i = 0; i < 1024; i++)
        ran &= words[i] == (i < 16 ? 5u : i < 80 ? i - 16 : i >= 256 && i < 260 ? i - 256 : 0x11u);
    printf("commands_ran %d\n", ran);
    printf("cmd_event %d\n", vkGetEventStatus(device, event));
    vkResetFences(device, 1, &fence);
    vkBeginCommandBuffer(cbs[1], &begin);
    vkCmdFillBuffer(cbs[1], buffer, 0, 4096, 7);
    vkEndCommandBuffer(cbs[1]);
    submit.pCommandBuffers = &cbs[1];
    if (vkQueueSubmit(queue, 1, &submit, fence) == VK_SUCCESS) {
        vkFreeCommandBuffers(device, pool, 1, &cbs[1]); /* while pending: released once answered */
        printf("freed_pending %d\n", vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX));
    }
    vkDestroyFence(device, fence, NULL);
    vkDestroyEvent(device, event, NULL);
    vkDestroyCommandPool(device, pool, NULL);
}

/* Host-visible memory written through its mapping and read back through a second one; buffers bound in
 * it, one past its end; hostile calls (a wrong handle, mapping twice, memory freed under a buffer). */
static void use_device(VkDevice device)
{
    const VkDeviceSize size = 65536;
    VkMemoryAllocateInfo allocate = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = size,
                                     .memoryTypeIndex = 1};
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 4096,
                               .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkDeviceMemory memory, wrong = (VkDeviceMemory)(uintptr_t)0x4242424242ull;
    VkBuffer buffer, past;
    VkFence fence;
    VkQueue queue = VK_NULL_HANDLE;
    uint32_t *words;
    void *twice;
    int same = 1;
    vkGetDeviceQueue(device, 0, 0, &queue);
    printf("queue %d\n", queue != VK_NULL_HANDLE);
    VkResult result = vkAllocateMemory(device, &allocate, NULL, &memory);
    printf("allocate %d\n", result);
    if (result != VK_SUCCESS)
        return;
    result = vkMapMemory(device, memory, 0, size, 0, (void **)&words);
    printf("map %d\n", result);
    if (result != VK_SUCCESS)
        return;
    for (uint32_t i = 0; i < size / 4; i++)
        words[i] = i * 2654435761u;
    result = vkMapMemory(device, memory, 0, size, 0, &twice); /* Vulkan forbids it; lavapipe maps again */
    printf("map_twice %d %d\n", result, result == VK_SUCCESS && twice == (void *)words);
    vkUnmapMemory(device, memory);
    result = vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, (void **)&words);
    printf("map_again %d\n", result);
    if (result != VK_SUCCESS)
        return;
    for (uint32_t i = 0; i < size / 4; i++)
        same &= words[i] == i * 2654435761u;
    printf("read_back %d\n", same);
    printf("map_wrong %d\n", vkMapMemory(device, wrong, 0, 16, 0, &twice));
    vkCreateBuffer(device, &info, NULL, &buffer);
    vkCreateBuffer(device, &info, NULL, &past);
    printf("bind %d\n", vkBindBufferMemory(device, buffer, memory, 0));
    printf("bind_past %d\n", vkBindBufferMemory(device, past, memory, size - 256));
    printf("bind_wrong %d\n", vkBindBufferMemory(device, past, wrong, 0));
    vkCreateFence(device, &fence_info, NULL, &fence);
    printf("fence %d\n", vkGetFenceStatus(device, fence));
    printf("submit_empty %d\n", vkQueueSubmit(queue, 0, NULL, fence));
    printf("wait %d\n", vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX));
    printf("idle %d\n", vkDeviceWaitIdle(device));
    use_sync(device, queue);
    use_commands(device, queue, buffer, words);
    refused(device, queue);
    vkFreeMemory(device, memory, NULL); /* while the buffer is bound to it */
    printf("bind_freed %d\n", vkBindBufferMemory(device, past, memory, 0));
    vkFreeMemory(device, wrong, NULL);
    vkDestroyBuffer(device, buffer, NULL);
    vkDestroyBuffer(device, past, NULL);
    vkDestroyFence(device, fence, NULL);
}

/* The application's allocator for the device: each block behind a 16-byte header, so a block freed by the
 * wrong allocator is an invalid free (AddressSanitizer's); counted, so what is made is seen freed. */
struct counts {
    long made, live;
};

static void *counted_allocation(void *user, size_t size, size_t alignment, VkSystemAllocationScope scope)
{
    struct counts *counts = user;
    unsigned char *block = alignment <= 16 ? malloc(size + 16) : NULL;
    (void)scope;
    if (block == NULL)
        return NULL;
    counts->made++, counts->live++;
    return block + 16;
}

static void counted_free(void *user, void *memory)
{
    struct counts *counts = user;
    if (memory == NULL)
        return;
    counts->live--;
    free((unsigned char *)memory - 16);
}

static void *counted_reallocation(void *user, void *original, size_t size, size_t alignment,
                                  VkSystemAllocationScope scope)
{
    unsigned char *block;
    if (original == NULL)
        return counted_allocation(user, size, alignment, scope);
    if (size == 0) {
        counted_free(user, original);
        return NULL;
    }
    block = realloc((unsigned char *)original - 16, size + 16);
    return block ? block + 16 : NULL;
}

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
        const char *timeline = VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME;
        VkPhysicalDeviceTimelineSemaphoreFeatures features = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES, .timelineSemaphore = VK_TRUE};
        VkDeviceCreateInfo create = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &features,
                                     .queueCreateInfoCount = 1, .pQueueCreateInfos = &queue,
                                     .enabledExtensionCount = 1, .ppEnabledExtensionNames = &timeline};
        VkDevice device;
        struct counts counts = {0, 0};
        VkAllocationCallbacks allocator = {.pUserData = &counts, .pfnAllocation = counted_allocation,
                                           .pfnReallocation = counted_reallocation, .pfnFree = counted_free};
        result = vkCreateDevice(devices[0], &create, &allocator, &device);
        printf("create_device %d\n", result);
        if (result == VK_SUCCESS) {
            use_device(device);
            vkDestroyDevice(device, &allocator);
            printf("allocator %d\n", counts.made > 0 && counts.live == 0);
        }
    }
    vkDestroyInstance(instance, NULL);
    return 0;
}
