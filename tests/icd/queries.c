/* An unmodified C program of timestamp queries (the loader's vulkan.h), for tests/icd/test_queries.py.
 *
 * It makes a device, a query pool and a host-visible buffer; records a reset, a timestamp, a fill, a
 * timestamp and the results copied into the buffer (64-bit with availability, 32-bit with
 * availability); submits it with a fence and reads the results with WAIT_BIT before waiting on the
 * fence, then compares every way of reading them. Then wrong use. Each line it prints is "what
 * VkResult", or "what 1" for a check that held (0 when it did not). It knows nothing of libshare. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <vulkan/vulkan.h>

#define QUERIES 4

static void say(const char *what, long value)
{
    printf("%s %ld\n", what, value);
}

int main(void)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo iinfo = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance instance;
    VkPhysicalDevice physical;
    uint32_t count = 1;
    if (vkCreateInstance(&iinfo, NULL, &instance) != VK_SUCCESS ||
        vkEnumeratePhysicalDevices(instance, &count, &physical) < 0 || count == 0) {
        say("instance", -1);
        return 0;
    }
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueCount = 1,
                                     .pQueuePriorities = &priority};
    VkDeviceCreateInfo dinfo = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                .pQueueCreateInfos = &qinfo};
    VkDevice device;
    VkQueue queue;
    if (vkCreateDevice(physical, &dinfo, NULL, &device) != VK_SUCCESS) {
        say("device", -1);
        return 0;
    }
    vkGetDeviceQueue(device, 0, 0, &queue);
    VkPhysicalDeviceMemoryProperties types;
    vkGetPhysicalDeviceMemoryProperties(physical, &types);
    uint32_t host = 0;
    while (host < types.memoryTypeCount && !(types.memoryTypes[host].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
        host++;
    VkBufferCreateInfo binfo = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 4096,
                                .usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT};
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkMemoryAllocateInfo ainfo = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = 4096,
                                  .memoryTypeIndex = host};
    vkCreateBuffer(device, &binfo, NULL, &buffer);
    vkAllocateMemory(device, &ainfo, NULL, &memory);
    vkBindBufferMemory(device, buffer, memory, 0);

    VkQueryPoolCreateInfo pinfo = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                   .queryType = VK_QUERY_TYPE_OCCLUSION, .queryCount = QUERIES};
    VkQueryPool pool;
    say("occlusion", vkCreateQueryPool(device, &pinfo, NULL, &pool));
    pinfo.queryType = VK_QUERY_TYPE_TIMESTAMP;
    say("pool", vkCreateQueryPool(device, &pinfo, NULL, &pool));

    VkCommandPoolCreateInfo cinfo = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    VkCommandPool cpool;
    VkCommandBuffer cb;
    vkCreateCommandPool(device, &cinfo, NULL, &cpool);
    VkCommandBufferAllocateInfo cbinfo = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                          .commandPool = cpool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                          .commandBufferCount = 1};
    vkAllocateCommandBuffers(device, &cbinfo, &cb);
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cb, &begin);
    vkCmdResetQueryPool(cb, pool, 0, QUERIES);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0);
    vkCmdFillBuffer(cb, buffer, 1024, 3072, 7);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 1);
    VkQueryResultFlags all = VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WITH_AVAILABILITY_BIT | VK_QUERY_RESULT_WAIT_BIT;
    vkCmdCopyQueryPoolResults(cb, pool, 0, 2, buffer, 0, 16, all);
    vkCmdCopyQueryPoolResults(cb, pool, 0, 2, buffer, 256, 8, VK_QUERY_RESULT_WITH_AVAILABILITY_BIT);
    say("end", vkEndCommandBuffer(cb));

    VkFenceCreateInfo finfo = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    vkCreateFence(device, &finfo, NULL, &fence);
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    say("submit", vkQueueSubmit(queue, 1, &submit, fence));
    uint64_t waited[4];
    say("waited", vkGetQueryPoolResults(device, pool, 0, 2, sizeof(waited), waited, 16, all));
    say("stamps", waited[1] == 1 && waited[3] == 1 && 0 < waited[0] && waited[0] < waited[2]);
    say("fence", vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX));
    void *mapped;
    vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &mapped);
    const uint32_t *low = (const uint32_t *)((const char *)mapped + 256);
    say("copied", memcmp(mapped, waited, sizeof(waited)) == 0);
    say("copied_32", low[0] == (uint32_t)waited[0] && low[1] == 1 && low[2] == (uint32_t)waited[2] && low[3] == 1);
    say("filled", ((const uint32_t *)mapped)[256] == 7 && ((const uint32_t *)mapped)[1023] == 7);
    uint32_t narrow[2] = {0xabababab, 0xabababab};
    say("narrow", vkGetQueryPoolResults(device, pool, 1, 1, sizeof(narrow), narrow, 8,
                                        VK_QUERY_RESULT_WITH_AVAILABILITY_BIT));
    say("narrow_value", narrow[0] == (uint32_t)waited[2] && narrow[1] == 1);

    uint64_t rest[2] = {0xabababababababab, 0xabababababababab};
    say("unwritten", vkGetQueryPoolResults(device, pool, 2, 2, sizeof(rest), rest, 8, VK_QUERY_RESULT_64_BIT));
    say("left_alone", rest[0] == 0xabababababababab && rest[1] == 0xabababababababab);
    say("unwritten_wait", vkGetQueryPoolResults(device, pool, 2, 2, sizeof(rest), rest, 8,
                                                VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
    say("partial", vkGetQueryPoolResults(device, pool, 2, 2, sizeof(rest), rest, 8,
                                         VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_PARTIAL_BIT));
    say("partial_zeros", rest[0] == 0 && rest[1] == 0);
    say("too_small", vkGetQueryPoolResults(device, pool, 0, 2, 12, waited, 8, VK_QUERY_RESULT_64_BIT));
    say("past_pool", vkGetQueryPoolResults(device, pool, 3, 2, sizeof(waited), waited, 8, VK_QUERY_RESULT_64_BIT));
    say("null_data", vkGetQueryPoolResults(device, pool, 0, 1, 8, NULL, 8, VK_QUERY_RESULT_64_BIT));
    VkQueryPool wrong = (VkQueryPool)(uintptr_t)0x0f00000000000001ull;
    say("wrong_pool", vkGetQueryPoolResults(device, wrong, 0, 1, 8, waited, 8, VK_QUERY_RESULT_64_BIT));
    vkDestroyQueryPool(device, wrong, NULL);
    vkDestroyQueryPool(device, pool, NULL);
    say("destroyed", vkGetQueryPoolResults(device, pool, 0, 1, 8, waited, 8, VK_QUERY_RESULT_64_BIT));

    vkUnmapMemory(device, memory);
    vkDestroyFence(device, fence, NULL);
    vkDestroyCommandPool(device, cpool, NULL);
    vkDestroyBuffer(device, buffer, NULL);
    vkFreeMemory(device, memory, NULL);
    vkDestroyDevice(device, NULL);
    vkDestroyInstance(instance, NULL);
    return 0;
}
