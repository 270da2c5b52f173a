/* The driver's pipeline.c and descriptor.c seen from inside: compiled with the driver's own sources
 * (every C file of libshare/icd), it calls the ls_icd_* functions directly against a real arbiter and prints what
 * the driver recorded, which no Vulkan program can read back: a compute pipeline's program (the
 * workgroup size its specialization constants gave, its resources in bind-group order, its buffers
 * and push size), and descriptors resolved into the arbiter's terms (ls_icd_descriptor_resolve) after
 * plain writes, a template's writes, copies, a dynamic offset, and a buffer destroyed or memory freed
 * under them; and its answers to hostile create infos (a module of junk, a constant past its data,
 * another entry point, a wrong layout beside a good one) and updates (a copy count that wraps, a
 * template given no data), under the sanitizers. ``pipelines_unit KERNEL.spv`` prints one JSON object; exit status 0 unless a step that
 * must work did not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "icd.h"

#define CHECK(call)                                                                                           \
    do {                                                                                                      \
        VkResult checked_ = (call);                                                                           \
        if (checked_ != VK_SUCCESS) {                                                                         \
            fprintf(stderr, "%s: %d\n", #call, checked_);                                                     \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

static struct ls_icd_device *device;
static VkDevice dev;

static uint32_t *read_file(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    uint32_t *code = malloc(1 << 20);
    *size = file && code ? fread(code, 1, 1 << 20, file) : 0;
    if (file)
        fclose(file);
    return code;
}

static VkDescriptorSetLayout layout_of(uint32_t count, const VkDescriptorSetLayoutBinding *bindings)
{
    VkDescriptorSetLayoutCreateInfo info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                            .bindingCount = count, .pBindings = bindings};
    VkDescriptorSetLayout made;
    CHECK(ls_icd_CreateDescriptorSetLayout(dev, &info, NULL, &made));
    return made;
}

/* Entry ``entry`` of ``set`` resolved: "[buffer_id, offset, range]", or the error; then ``after``. */
static void print_resolved(VkDescriptorSet set, uint32_t entry, uint32_t dynamic, const char *after)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)set,
                                                      LS_ICD_DESCRIPTOR_SET);
    uint32_t id = 0;
    uint64_t offset = 0, range = 0;
    VkResult result = ls_icd_descriptor_resolve(device, &object->u.set.entries[entry], dynamic, &id, &offset, &range);
    if (result == VK_SUCCESS)
        printf("[%u, %llu, %llu]%s", id, (unsigned long long)offset, (unsigned long long)range, after);
    else
        printf("%d%s", result, after);
}

static int64_t buffer_id_of(VkDeviceMemory memory)
{
    return ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)memory, LS_ICD_MEMORY)->u.memory.buffer_id;
}

int main(int argc, char **argv)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo instance_info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueCount = 1,
                                     .pQueuePriorities = &priority};
    VkDeviceCreateInfo device_info = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                                      .pQueueCreateInfos = &queue};
    VkInstance instance;
    size_t size;
    uint32_t *code;
    if (argc != 2)
        return 2;
    code = read_file(argv[1], &size);
    CHECK(ls_icd_CreateInstance(&instance_info, NULL, &instance));
    CHECK(ls_icd_CreateDevice((VkPhysicalDevice) & ((struct ls_icd_instance *)instance)->physical, &device_info, NULL,
                              &dev));
    device = (struct ls_icd_device *)dev;

    /* The pipeline: two sets, a gap, uniform and storage, constants of every kind */
    VkDescriptorSetLayoutBinding set0_bindings[] = {
        {2, VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL}};
    VkDescriptorSetLayoutBinding set1_bindings[] = {
        {0, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        {1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        {3, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 0, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        {4, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 2, VK_SHADER_STAGE_COMPUTE_BIT, NULL}};
    VkDescriptorSetLayout sets[2] = {layout_of(2, set0_bindings), layout_of(4, set1_bindings)};
    VkPushConstantRange push = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 8};
    VkPipelineLayoutCreateInfo layout_info = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                              .setLayoutCount = 2, .pSetLayouts = sets,
                                              .pushConstantRangeCount = 1, .pPushConstantRanges = &push};
    VkPipelineLayout layout;
    CHECK(ls_icd_CreatePipelineLayout(dev, &layout_info, NULL, &layout));
    ls_icd_DestroyDescriptorSetLayout(dev, sets[0], NULL); /* the pipeline layout keeps its copy */
    sets[0] = layout_of(2, set0_bindings);
    VkShaderModuleCreateInfo module_info = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = size,
                                            .pCode = code};
    VkShaderModule module;
    CHECK(ls_icd_CreateShaderModule(dev, &module_info, NULL, &module));
    struct { uint32_t x; float scale; uint32_t flip; int32_t shift; } data = {48, 2.5f, 1, -3};
    VkSpecializationMapEntry entries[] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}, {3, 12, 4}};
    VkSpecializationInfo spec = {4, entries, sizeof(data), &data};
    VkComputePipelineCreateInfo pipeline_info = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = module, .pName = "main", .pSpecializationInfo = &spec},
        .layout = layout};
    VkComputePipelineCreateInfo infos[2] = {pipeline_info, pipeline_info};
    VkPipeline pipelines[2];
    infos[1].layout = (VkPipelineLayout)(uintptr_t)0x77; /* a wrong handle: that one fails, alone */
    VkResult made = ls_icd_CreateComputePipelines(dev, VK_NULL_HANDLE, 2, infos, NULL, pipelines);
    /* Hostile create infos, each alone: a module of junk, a constant past its data, another entry point */
    uint32_t junk[64] = {0x07230203, 0x10000, 0, 9, 0};
    memset(junk + 5, 0xFF, sizeof(junk) - 20);
    VkShaderModuleCreateInfo junk_info = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                          .codeSize = sizeof(junk), .pCode = junk};
    VkShaderModule junk_module;
    VkResult hostile[3];
    VkPipeline refused;
    CHECK(ls_icd_CreateShaderModule(dev, &junk_info, NULL, &junk_module));
    infos[1] = pipeline_info;
    infos[1].stage.module = junk_module;
    hostile[0] = ls_icd_CreateComputePipelines(dev, VK_NULL_HANDLE, 1, &infos[1], NULL, &refused);
    VkSpecializationMapEntry past = {0, 14, 4};
    VkSpecializationInfo past_spec = {1, &past, sizeof(data), &data};
    infos[1] = pipeline_info;
    infos[1].stage.pSpecializationInfo = &past_spec;
    hostile[1] = ls_icd_CreateComputePipelines(dev, VK_NULL_HANDLE, 1, &infos[1], NULL, &refused);
    infos[1] = pipeline_info;
    infos[1].stage.pName = "other"; /* loaded, then freed: not the module's entry point */
    hostile[2] = ls_icd_CreateComputePipelines(dev, VK_NULL_HANDLE, 1, &infos[1], NULL, &refused);
    ls_icd_DestroyShaderModule(dev, junk_module, NULL);
    ls_icd_DestroyShaderModule(dev, module, NULL);
    const struct ls_icd_pipeline *pipeline =
        &ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)pipelines[0], LS_ICD_PIPELINE)->u.pipeline;
    printf("{\"hostile\": [%d, %d, %d], ", hostile[0], hostile[1], hostile[2]);
    printf("\"made\": %d, \"second\": %llu, \"local_size\": [%u, %u, %u], \"buffers\": %u, \"push_size\": %u, "
           "\"resources\": [", made, (unsigned long long)(uintptr_t)pipelines[1], pipeline->local_size[0],
           pipeline->local_size[1], pipeline->local_size[2], pipeline->nbuffers, pipeline->push_size);
    for (uint32_t i = 0; i < pipeline->nresources; i++)
        printf("%s[%u, %u, %u]", i ? ", " : "", pipeline->resources[i].set, pipeline->resources[i].binding,
               pipeline->resources[i].count);
    printf("], ");

    /* Descriptors: memory, a buffer in it at an offset, sets written plainly, by template, by copy */
    VkMemoryAllocateInfo memory_info = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = 1 << 20,
                                        .memoryTypeIndex = 1};
    VkDeviceMemory memory;
    CHECK(ls_icd_AllocateMemory(dev, &memory_info, NULL, &memory));
    VkBufferCreateInfo buffer_info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 8192,
                                      .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkBuffer buffer, other;
    CHECK(ls_icd_CreateBuffer(dev, &buffer_info, NULL, &buffer));
    CHECK(ls_icd_CreateBuffer(dev, &buffer_info, NULL, &other));
    CHECK(ls_icd_BindBufferMemory(dev, buffer, memory, 65536));
    CHECK(ls_icd_BindBufferMemory(dev, other, memory, 131072));
    VkDescriptorPoolSize pool_size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 16};
    VkDescriptorPoolCreateInfo pool_info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = 4,
                                            .poolSizeCount = 1, .pPoolSizes = &pool_size};
    VkDescriptorPool pool;
    CHECK(ls_icd_CreateDescriptorPool(dev, &pool_info, NULL, &pool));
    VkDescriptorSetLayout four[4] = {sets[0], sets[1], sets[1], sets[1]};
    VkDescriptorSetAllocateInfo allocate = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                            .descriptorPool = pool, .descriptorSetCount = 4, .pSetLayouts = four};
    VkDescriptorSet s[4];
    CHECK(ls_icd_AllocateDescriptorSets(dev, &allocate, s));
    VkDescriptorBufferInfo written[4] = {{buffer, 256, 1024}, {buffer, 512, VK_WHOLE_SIZE}, {other, 0, 64},
                                         {other, 4096, 4096}};
    VkWriteDescriptorSet writes[2] = {
        {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = s[0], .dstBinding = 2, .descriptorCount = 1,
         .descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC, .pBufferInfo = &written[0]},
        /* four elements from binding 1 on: binding 1, then (3 holds none) binding 4's two, ... */
        {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = s[1], .dstBinding = 1, .descriptorCount = 3,
         .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &written[1]}};
    ls_icd_UpdateDescriptorSets(dev, 2, writes, 0, NULL);
    VkDescriptorUpdateTemplateEntry template_entry = {1, 0, 3, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 16,
                                                      sizeof(VkDescriptorBufferInfo) + 8};
    VkDescriptorUpdateTemplateCreateInfo template_info = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_UPDATE_TEMPLATE_CREATE_INFO, .descriptorUpdateEntryCount = 1,
        .pDescriptorUpdateEntries = &template_entry, .templateType = VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET,
        .descriptorSetLayout = sets[1]};
    VkDescriptorUpdateTemplate template;
    CHECK(ls_icd_CreateDescriptorUpdateTemplate(dev, &template_info, NULL, &template));
    unsigned char raw[16 + 3 * (sizeof(VkDescriptorBufferInfo) + 8)];
    memset(raw, 0xAB, sizeof(raw));
    for (int i = 0; i < 3; i++)
        memcpy(raw + 16 + i * (sizeof(VkDescriptorBufferInfo) + 8), &written[1 + i], sizeof(VkDescriptorBufferInfo));
    ls_icd_UpdateDescriptorSetWithTemplate(dev, s[2], template, raw);
    VkCopyDescriptorSet copy = {.sType = VK_STRUCTURE_TYPE_COPY_DESCRIPTOR_SET, .srcSet = s[1], .srcBinding = 1,
                                .dstSet = s[3], .dstBinding = 1, .descriptorCount = 3};
    ls_icd_UpdateDescriptorSets(dev, 0, NULL, 1, &copy);
    VkCopyDescriptorSet wrapping = copy; /* a count that wraps, a template with no data: skipped */
    wrapping.descriptorCount = 0xFFFFFFFFu;
    ls_icd_UpdateDescriptorSets(dev, 0, NULL, 1, &wrapping);
    ls_icd_UpdateDescriptorSetWithTemplate(dev, s[3], template, NULL);
    printf("\"buffer_id\": %lld, \"dynamic\": [", (long long)buffer_id_of(memory));
    print_resolved(s[0], 1, 0, ", ");    /* binding 2: the set's second entry */
    print_resolved(s[0], 1, 256, ", ");
    print_resolved(s[0], 1, 7424, ", "); /* clipped to the buffer */
    print_resolved(s[0], 1, 7936, "], "); /* past it */
    printf("\"never written\": ");
    print_resolved(s[0], 0, 0, ", ");
    for (int i = 1; i < 4; i++) {
        printf("\"%s\": [", i == 1 ? "plain" : i == 2 ? "template" : "copied");
        print_resolved(s[i], 1, 0, ", ");
        print_resolved(s[i], 2, 0, ", ");
        print_resolved(s[i], 3, 0, "], ");
    }
    ls_icd_DestroyBuffer(dev, other, NULL);
    printf("\"buffer destroyed\": ");
    print_resolved(s[1], 2, 0, ", ");
    ls_icd_FreeMemory(dev, memory, NULL);
    printf("\"memory freed\": ");
    print_resolved(s[1], 1, 0, "}\n");
    ls_icd_DestroyDescriptorUpdateTemplate(dev, template, NULL);
    ls_icd_DestroyPipeline(dev, pipelines[0], NULL);
    ls_icd_DestroyPipelineLayout(dev, layout, NULL);
    ls_icd_DestroyDescriptorSetLayout(dev, sets[0], NULL); /* sets[1], the pool and its sets: the device's end */
    ls_icd_DestroyDevice(dev, NULL);
    ls_icd_DestroyInstance(instance, NULL);
    free(code);
    return 0;
}
