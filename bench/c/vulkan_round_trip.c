/*
 * Direct Vulkan, the baseline: the tiny saxpy dispatch (64 floats, one
 * workgroup) recorded once into a command buffer, then submitted and waited
 * on with a fence, again and again, in one process with no arbiter.
 *
 *   vulkan_round_trip SAXPY_SPV                 prints "vulkan_round_trip NS"
 *   vulkan_round_trip SAXPY_SPV --for SECONDS   after set-up prints "ready"; for each line on
 *                                               stdin does round trips for SECONDS and prints
 *                                               their rate per second
 *   vulkan_round_trip SAXPY_SPV --chain N       prints "vulkan_chain NS": a step of N dependent
 *                                               saxpy dispatches (a compute barrier between two)
 *                                               recorded once in one command buffer, submitted
 *                                               and waited on
 *
 * It knows nothing of libshare: bench/test_icd_bench.py runs it on the real driver and, unmodified,
 * through libshare's Vulkan driver (VK_DRIVER_FILES).
 */
#include "timing.h"

#include <vulkan/vulkan.h>

#define VK(call) do { VkResult r_ = (call); if (r_ != VK_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, r_); exit(1); } } while (0)

struct direct {
    VkDevice device;
    VkQueue queue;
    VkCommandBuffer commands;
    VkFence fence;
};

static int round_trip(void *arg)
{
    struct direct *d = arg;
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &d->commands};
    VK(vkQueueSubmit(d->queue, 1, &submit, d->fence));
    VK(vkWaitForFences(d->device, 1, &d->fence, VK_TRUE, UINT64_MAX));
    VK(vkResetFences(d->device, 1, &d->fence));
    return 0;
}

static VkBuffer host_buffer(VkPhysicalDevice gpu, VkDevice device)
{
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 4096,
                               .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkBuffer buffer;
    VK(vkCreateBuffer(device, &info, NULL, &buffer));
    VkMemoryRequirements need;
    vkGetBufferMemoryRequirements(device, buffer, &need);
    VkPhysicalDeviceMemoryProperties props;
    vkGetPhysicalDeviceMemoryProperties(gpu, &props);
    uint32_t type = 0;
    while (!((need.memoryTypeBits >> type) & 1) ||
           !(props.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
        type++;
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = need.size,
                                  .memoryTypeIndex = type};
    VkDeviceMemory memory;
    VK(vkAllocateMemory(device, &alloc, NULL, &memory));
    VK(vkBindBufferMemory(device, buffer, memory, 0));
    return buffer;
}

static VkPipeline saxpy_pipeline(VkDevice device, const char *path, VkPipelineLayout *layout, VkDescriptorSetLayout *set_layout)
{
    static uint32_t code[1 << 14];
    FILE *f = fopen(path, "rb");
    if (!f)
        exit((perror(path), 1));
    size_t size = fread(code, 1, sizeof code, f);
    fclose(f);
    VkShaderModuleCreateInfo module_info = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = size, .pCode = code};
    VkShaderModule module;
    VK(vkCreateShaderModule(device, &module_info, NULL, &module));
    VkDescriptorSetLayoutBinding bindings[2] = {
        {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        {1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL}};
    VkDescriptorSetLayoutCreateInfo set_info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = 2, .pBindings = bindings};
    VK(vkCreateDescriptorSetLayout(device, &set_info, NULL, set_layout));
    VkPushConstantRange push = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 8};
    VkPipelineLayoutCreateInfo layout_info = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                              .pSetLayouts = set_layout, .pushConstantRangeCount = 1, .pPushConstantRanges = &push};
    VK(vkCreatePipelineLayout(device, &layout_info, NULL, layout));
    VkComputePipelineCreateInfo info = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, .layout = *layout,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = module, .pName = "main"}};
    VkPipeline pipeline;
    VK(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &info, NULL, &pipeline));
    return pipeline;
}

int main(int argc, char **argv)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo instance_info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkInstance instance;
    VK(vkCreateInstance(&instance_info, NULL, &instance));
    uint32_t count = 1;
    VkPhysicalDevice gpu;
    vkEnumeratePhysicalDevices(instance, &count, &gpu);   /* VK_INCOMPLETE is fine: the first one */
    if (count == 0)
        return fprintf(stderr, "no Vulkan device\n"), 1;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = 0,
                                          .queueCount = 1, .pQueuePriorities = &priority};
    VkDeviceCreateInfo device_info = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1, .pQueueCreateInfos = &queue_info};
    struct direct d;
    VK(vkCreateDevice(gpu, &device_info, NULL, &d.device));
    vkGetDeviceQueue(d.device, 0, 0, &d.queue);
    VkPipelineLayout layout;
    VkDescriptorSetLayout set_layout;
    VkPipeline pipeline = saxpy_pipeline(d.device, argc > 1 ? argv[1] : "shaders/saxpy.spv", &layout, &set_layout);
    VkDescriptorPoolSize pool_size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2};
    VkDescriptorPoolCreateInfo pool_info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = 1, .poolSizeCount = 1, .pPoolSizes = &pool_size};
    VkDescriptorPool pool;
    VK(vkCreateDescriptorPool(d.device, &pool_info, NULL, &pool));
    VkDescriptorSetAllocateInfo set_alloc = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = pool,
                                             .descriptorSetCount = 1, .pSetLayouts = &set_layout};
    VkDescriptorSet set;
    VK(vkAllocateDescriptorSets(d.device, &set_alloc, &set));
    VkDescriptorBufferInfo buffers[2] = {{host_buffer(gpu, d.device), 0, 4096}, {host_buffer(gpu, d.device), 0, 4096}};
    VkWriteDescriptorSet write = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .descriptorCount = 2,
                                  .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = buffers};
    vkUpdateDescriptorSets(d.device, 1, &write, 0, NULL);
    VkCommandPoolCreateInfo command_pool_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = 0};
    VkCommandPool command_pool;
    VK(vkCreateCommandPool(d.device, &command_pool_info, NULL, &command_pool));
    VkCommandBufferAllocateInfo command_alloc = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = command_pool,
                                                 .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VK(vkAllocateCommandBuffers(d.device, &command_alloc, &d.commands));
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VK(vkBeginCommandBuffer(d.commands, &begin));
    struct { uint32_t n; float a; } push = {64, 1.0f};
    vkCmdBindPipeline(d.commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
    vkCmdBindDescriptorSets(d.commands, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
    vkCmdPushConstants(d.commands, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, &push);
    vkCmdDispatch(d.commands, 1, 1, 1);
    VK(vkEndCommandBuffer(d.commands));
    int chain = argc > 3 && strcmp(argv[2], "--chain") == 0 ? atoi(argv[3]) : 0;
    if (chain > 0) {    /* the step: chain dispatches in one command buffer, each after the one before */
        VK(vkAllocateCommandBuffers(d.device, &command_alloc, &d.commands));
        VK(vkBeginCommandBuffer(d.commands, &begin));
        vkCmdBindPipeline(d.commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
        vkCmdBindDescriptorSets(d.commands, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
        vkCmdPushConstants(d.commands, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, &push);
        VkMemoryBarrier barrier = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                   .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        for (int i = 0; i < chain; i++) {
            if (i > 0)
                vkCmdPipelineBarrier(d.commands, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                     0, 1, &barrier, 0, NULL, 0, NULL);
            vkCmdDispatch(d.commands, 1, 1, 1);
        }
        VK(vkEndCommandBuffer(d.commands));
    }
    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VK(vkCreateFence(d.device, &fence_info, NULL, &d.fence));
    double seconds = bench_for_seconds(argc, argv);
    int failed = seconds > 0 ? bench_for("vulkan_round_trip", seconds, round_trip, &d)
                 : chain > 0 ? bench("vulkan_chain", round_trip, &d, 20)
                             : bench("vulkan_round_trip", round_trip, &d, 200);
    vkDeviceWaitIdle(d.device);
    vkDestroyDevice(d.device, NULL);   /* the process ends here: the driver frees the rest */
    vkDestroyInstance(instance, NULL);
    return failed;
}
