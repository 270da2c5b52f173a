/* VkShaderModule, VkPipelineLayout, VkPipeline (the arbiter's programs) and VkPipelineCache.
 *
 * A shader module is a copy of its SPIR-V, checked for shape only (whole words, the magic, at most
 * LS_ICD_MOST_SPIRV bytes so that it fits a frame): everything else is admission's, at the arbiter,
 * when a pipeline is made of it. A pipeline layout keeps deep copies of its set layouts
 * (ls_icd_set_layout_copy; at most the device's maxBoundDescriptorSets, one of them at most of push
 * descriptors) and its push size, the end of its last push-constant range (ranges of whole words
 * within maxPushConstantsSize).
 *
 * vkCreateComputePipelines sends, for each create info, the request a Python session sends
 * (session.load_program): {"op": "load_program", "constants": [[SpecId, value], ...]} with the
 * module's SPIR-V as the payload, its answer waited for as long as the session's welcome says a
 * load may take (the arbiter vets a new module in a child first: minutes for a large kernel on a
 * CPU device). The arbiter freezes the constants into the module itself
 * (programs/specialize.py) and wants each value typed as the module declares it (true or false for
 * a bool, an integer in its range, a number for a float), so the driver reads the module's
 * OpDecorate SpecId, OpSpecConstant* and scalar types (spec_type) to encode each map entry's
 * bytes: a VkBool32 as true or false, an integer of 1, 2, 4 or 8 bytes signed or not as the module
 * declares it, a float of 2, 4 or 8 bytes as a number (infinities and NaN as Infinity, -Infinity
 * and NaN, which JSON lacks and the arbiter's reader takes; a NaN arrives as the quiet NaN of its
 * width, its sign and payload lost). A map entry past pData's dataSize, of another size, or an id
 * given twice is LS_ICD_INVALID; one whose id the module does not declare is left out, as the
 * specification says
 * it has no effect. For each variable of the module whose type is a runtime-sized array of buffers
 * (b[], put_arrays), the request carries "arrays": [[set, binding, count], ...], count the
 * descriptorCount of that binding in the pipeline layout, which is what Vulkan means by the array's
 * length (programs/arrays.py makes it a fixed-size array of that length; a binding the layout lacks
 * is sent as 0, which the arbiter refuses). The reply (ls_icd_whole_field, and each resource read and ranged) names the
 * program: its id, the buffers a bind group names ("bindings"), push size, workgroup size, entry
 * point and "resources" ([set, binding, count, kind] each, in bind-group order, their counts
 * summing to "bindings"). The driver then checks what the arbiter could not: pName is the
 * module's entry point, the pipeline layout holds each resource at its (set, binding) as a
 * descriptor of its kind (storage or uniform, dynamic or not; storage or uniform texel buffer)
 * with at least its count, and the layout's push constants
 * cover the program's; a pipeline that fails is freed at the arbiter (ls_icd_forget) and is
 * LS_ICD_INVALID. A refusal of the arbiter (invalid SPIR-V, a capability not enabled, an image)
 * is LS_ICD_INVALID too, its message one line on stderr (ls_icd_ask). Each pPipelines[i] that
 * fails is VK_NULL_HANDLE and the others are made; the first failure is the answer. Base
 * pipelines and derivatives are ignored; pipeline flags other than DISABLE_OPTIMIZATION,
 * ALLOW_DERIVATIVES, DERIVATIVE and DISPATCH_BASE, and stage flags and required subgroup sizes that
 * physical.c's ls_icd_stage_subgroups refuses, are LS_ICD_INVALID.
 * vkDestroyPipeline frees the program at the arbiter.
 *
 * Pipeline caches hold nothing (the arbiter caches programs by content itself): any initial data
 * is accepted and ignored, vkGetPipelineCacheData writes the specification's header
 * (VkPipelineCacheHeaderVersionOne: the device's vendorID, deviceID and pipelineCacheUUID) and no
 * payload, and merging succeeds. The device's lock is held around every use of its table. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "descriptor.h"
#include "icd.h"
#include "physical.h"

#define SPIRV_MAGIC 0x07230203u
#define MOST_CONSTANTS 64                  /* specialize.py's MAX_CONSTANTS */
#define REQUEST_TEXT 8192                  /* the load_program request's JSON */
#define MOST_RESOURCES 32                  /* engine/lists.c's LS_ENGINE_MAX_BINDINGS */
#define CACHE_HEADER 32                    /* sizeof VkPipelineCacheHeaderVersionOne */
#define PIPELINE_FLAGS                                                                                        \
    (VK_PIPELINE_CREATE_DISABLE_OPTIMIZATION_BIT | VK_PIPELINE_CREATE_ALLOW_DERIVATIVES_BIT |                 \
     VK_PIPELINE_CREATE_DERIVATIVE_BIT | VK_PIPELINE_CREATE_DISPATCH_BASE_BIT)

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_object *find(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    return ls_icd_object_find(&device->objects, handle, kind);
}

/* Make an object of ``kind`` (the lock held); its handle and the object, or 0. */
static uint64_t make(struct ls_icd_device *device, uint32_t kind, struct ls_icd_object **object)
{
    uint64_t made = ls_icd_object_new(&device->objects, kind);
    *object = made ? find(device, made, kind) : NULL;
    return made;
}

/* Drop ``handle`` of ``kind`` when it is one, freeing what it holds (a wrong handle given to a destroy:
 * nothing). */
static void drop(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    ls_icd_object_destroy_with(device, handle, kind, ls_icd_pipeline_object_free);
}

void ls_icd_pipeline_object_free(struct ls_icd_device *device, struct ls_icd_object *object)
{
    uint32_t i;
    switch (object->kind) {
    case LS_ICD_SHADER:
        free(object->u.shader.code);
        object->u.shader.code = NULL;
        break;
    case LS_ICD_PIPELINE_LAYOUT:
        for (i = 0; i < object->u.pipeline_layout.nsets; i++)
            ls_icd_set_layout_free(&object->u.pipeline_layout.sets[i]);
        free(object->u.pipeline_layout.sets);
        object->u.pipeline_layout.sets = NULL;
        break;
    case LS_ICD_PIPELINE:
        if (device != NULL) { /* (NULL: the device's session is gone, and its programs with it) */
            ls_icd_cache_drop_program(device, object->u.pipeline.program_id); /* its groups first */
            ls_icd_forget(device, "program_id", object->u.pipeline.program_id);
        }
        free(object->u.pipeline.resources);
        object->u.pipeline.resources = NULL;
        break;
    default:
        break;
    }
}

/* ---- shader modules */

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateShaderModule(VkDevice handle, const VkShaderModuleCreateInfo *info,
                                                         const VkAllocationCallbacks *allocator, VkShaderModule *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_shader shader = {.size = info->codeSize};
    uint64_t made;
    VkResult result;
    (void)allocator;
    if (info->flags != 0 || info->pCode == NULL || info->codeSize < 20 || info->codeSize % 4 != 0 ||
        info->codeSize > LS_ICD_MOST_SPIRV || info->pCode[0] != SPIRV_MAGIC)
        return LS_ICD_INVALID; /* (VK_ERROR_INVALID_SHADER_NV is an extension's) */
    shader.code = malloc(info->codeSize);
    if (shader.code == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    memcpy(shader.code, info->pCode, info->codeSize);
    result = ls_icd_object_create(device, LS_ICD_SHADER, &shader, sizeof(shader), &made);
    if (result != VK_SUCCESS) {
        free(shader.code);
        return result;
    }
    *out = (VkShaderModule)(uintptr_t)made;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyShaderModule(VkDevice handle, VkShaderModule module,
                                                      const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    drop(device_of(handle), (uint64_t)(uintptr_t)module, LS_ICD_SHADER);
}

/* ---- pipeline layouts */

static VkResult fill_layout(struct ls_icd_device *device, const VkPipelineLayoutCreateInfo *info,
                            struct ls_icd_pipeline_layout *layout)
{
    const VkPhysicalDeviceLimits *limits = &device->seen.properties.limits;
    for (uint32_t i = 0; i < info->pushConstantRangeCount; i++) {
        const VkPushConstantRange *range = &info->pPushConstantRanges[i];
        if (range->size == 0 || range->offset % 4 || range->size % 4 || range->offset > limits->maxPushConstantsSize ||
            range->size > limits->maxPushConstantsSize - range->offset)
            return LS_ICD_INVALID;
        if (range->offset + range->size > layout->push_size)
            layout->push_size = range->offset + range->size;
    }
    if (info->setLayoutCount == 0)
        return VK_SUCCESS;
    layout->sets = calloc(info->setLayoutCount, sizeof(*layout->sets));
    if (layout->sets == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0, pushed = 0; i < info->setLayoutCount; i++) {
        struct ls_icd_object *set =
            find(device, (uint64_t)(uintptr_t)info->pSetLayouts[i], LS_ICD_SET_LAYOUT);
        VkResult result = set ? ls_icd_set_layout_copy(&layout->sets[i], &set->u.set_layout) : LS_ICD_INVALID;
        if (result != VK_SUCCESS)
            return result;
        layout->nsets = i + 1;
        if ((layout->sets[i].flags & VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR) && pushed++)
            return LS_ICD_INVALID; /* a second set of push descriptors */
    }
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreatePipelineLayout(VkDevice handle, const VkPipelineLayoutCreateInfo *info,
                                                           const VkAllocationCallbacks *allocator,
                                                           VkPipelineLayout *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_pipeline_layout layout = {0};
    struct ls_icd_object holder = {.kind = LS_ICD_PIPELINE_LAYOUT};
    struct ls_icd_object *object;
    uint64_t made = 0;
    VkResult result = LS_ICD_INVALID;
    (void)allocator;
    if (info->flags != 0 || info->setLayoutCount > device->seen.properties.limits.maxBoundDescriptorSets ||
        (info->setLayoutCount && info->pSetLayouts == NULL) ||
        (info->pushConstantRangeCount && info->pPushConstantRanges == NULL))
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    result = fill_layout(device, info, &layout);
    if (result == VK_SUCCESS) {
        made = make(device, LS_ICD_PIPELINE_LAYOUT, &object);
        if (made)
            object->u.pipeline_layout = layout;
        else
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (result != VK_SUCCESS) {
        holder.u.pipeline_layout = layout;
        ls_icd_pipeline_object_free(NULL, &holder);
    }
    pthread_mutex_unlock(&device->lock);
    if (result == VK_SUCCESS)
        *out = (VkPipelineLayout)(uintptr_t)made;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipelineLayout(VkDevice handle, VkPipelineLayout layout,
                                                        const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    drop(device_of(handle), (uint64_t)(uintptr_t)layout, LS_ICD_PIPELINE_LAYOUT);
}

/* ---- specialization constants */

/* The scalar type of the spec constant ``spec_id`` declares in ``code``: 'b' (bool), 'i' (signed),
 * 'u' (unsigned) or 'f', with its width in bits; 0 when the module declares no such constant. */
static int spec_type(const uint32_t *code, size_t words, uint32_t spec_id, uint32_t *width)
{
    uint32_t result = 0, type = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (size_t at = 5; at < words;) {
            uint32_t count = code[at] >> 16, opcode = code[at] & 0xFFFF;
            const uint32_t *ops = code + at + 1;
            if (count == 0 || count > words - at)
                return 0; /* a broken module: the arbiter will say so */
            if (pass == 0 && opcode == 71 && count >= 4 && ops[1] == 1 && ops[2] == spec_id && !result)
                result = ops[0];                                   /* OpDecorate %x SpecId id */
            else if (pass == 1 && (opcode == 48 || opcode == 49 || opcode == 50) && count >= 3 && ops[1] == result)
                type = ops[0];                                     /* OpSpecConstant{True,False,} */
            else if (pass == 2 && (opcode == 20 || opcode == 21 || opcode == 22) && count >= 2 && ops[0] == type) {
                *width = count >= 3 ? ops[1] : 1;
                if (opcode == 20)
                    return 'b';
                if (opcode == 21 && count >= 4)
                    return ops[2] ? 'i' : 'u';
                return opcode == 22 ? 'f' : 0;
            }
            at += count;
        }
        if ((pass == 0 && !result) || (pass == 1 && !type))
            return 0;
    }
    return 0;
}

static double half_value(uint16_t bits)
{
    int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
    double value = exponent == 0 ? ldexp(mantissa, -24) : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                                                          : ldexp(mantissa | 0x400, exponent - 25);
    return bits & 0x8000 ? -value : value;
}

/* One constant's value, as specialize.py reads it, appended to ``text``; LS_ICD_INVALID when its
 * bytes do not fit its type. */
static VkResult put_value(char *text, size_t room, int kind, uint32_t width, const uint8_t *bytes, size_t size)
{
    uint64_t bits = 0;
    if ((kind == 'b' && size != 4) || (kind != 'b' && size * 8 != width))
        return LS_ICD_INVALID;
    memcpy(&bits, bytes, size); /* (little-endian hosts: the driver builds on x86-64 and AArch64) */
    if (kind == 'b') {
        snprintf(text, room, "%s", bits ? "true" : "false");
    } else if (kind == 'u') {
        snprintf(text, room, "%llu", (unsigned long long)bits);
    } else if (kind == 'i') {
        int64_t value = width == 64 ? (int64_t)bits : (int64_t)(bits << (64 - width)) >> (64 - width);
        snprintf(text, room, "%lld", (long long)value);
    } else {
        double value;
        float single;
        if (width == 16) {
            value = half_value((uint16_t)bits);
        } else if (width == 32) {
            memcpy(&single, bytes, 4);
            value = single;
        } else {
            memcpy(&value, bytes, 8);
        }
        if (isnan(value)) /* spelled as Python's json reads them; a NaN's sign and payload are not kept */
            snprintf(text, room, "NaN");
        else if (isinf(value))
            snprintf(text, room, "%sInfinity", value < 0 ? "-" : "");
        else
            snprintf(text, room, "%.17g%s", value, value == floor(value) && fabs(value) < 1e15 ? ".0" : "");
    }
    return VK_SUCCESS;
}

/* ---- runtime-sized arrays of buffers */

/* The word of the first instruction of ``opcode`` in ``code`` whose operand ``at`` is ``id`` and that has at
 * least ``count`` words (its operands from that word on); NULL when there is none. */
static const uint32_t *find_op(const uint32_t *code, size_t words, uint32_t opcode, uint32_t at, uint32_t id,
                               uint32_t count)
{
    for (size_t pos = 5; pos < words;) {
        uint32_t n = code[pos] >> 16;
        if (n == 0 || n > words - pos)
            return NULL; /* a broken module: the arbiter will say so */
        if ((code[pos] & 0xFFFF) == opcode && n >= count && n > at + 1 && code[pos + 1 + at] == id)
            return code + pos + 1;
        pos += n;
    }
    return NULL;
}

/* The decoration's first literal on ``target`` (OpDecorate %target which N), UINT32_MAX when it has none. */
static uint32_t decoration(const uint32_t *code, size_t words, uint32_t target, uint32_t which)
{
    for (size_t pos = 5; pos < words && code[pos] >> 16 && code[pos] >> 16 <= words - pos; pos += code[pos] >> 16)
        if ((code[pos] & 0xFFFF) == 71 && code[pos] >> 16 >= 4 && code[pos + 1] == target && code[pos + 2] == which)
            return code[pos + 3];
    return UINT32_MAX;
}

/* ",\"arrays\":[[set, binding, count], ...]" appended to ``text`` (``used`` bytes of it) for each
 * StorageBuffer or Uniform variable whose type is an OpTypeRuntimeArray (of blocks: the arbiter checks),
 * count the descriptorCount of its (set, binding) in ``layout``, 0 when the layout has none (which the
 * arbiter refuses); nothing when the module declares none. Returns the bytes used, or 0 past ``room``. */
static size_t put_arrays(const uint32_t *code, size_t words, const struct ls_icd_pipeline_layout *layout,
                         char *text, size_t used, size_t room)
{
    uint32_t given = 0;
    for (size_t pos = 5; pos < words && code[pos] >> 16 && code[pos] >> 16 <= words - pos; pos += code[pos] >> 16) {
        const uint32_t *var = code + pos + 1, *pointer;
        uint32_t set, binding, count = 0;
        if ((code[pos] & 0xFFFF) != 59 || code[pos] >> 16 < 4 || (var[2] != 2 && var[2] != 12))
            continue; /* OpVariable in Uniform or StorageBuffer */
        pointer = find_op(code, words, 32, 0, var[0], 4); /* OpTypePointer */
        if (pointer == NULL || find_op(code, words, 29, 0, pointer[2], 3) == NULL) /* OpTypeRuntimeArray */
            continue;
        set = decoration(code, words, var[1], 34);
        binding = decoration(code, words, var[1], 33);
        for (uint32_t i = 0; set < layout->nsets && i < layout->sets[set].nbindings; i++)
            if (layout->sets[set].bindings[i].binding == binding)
                count = layout->sets[set].bindings[i].count;
        if (++given > MOST_RESOURCES || room - used < 48)
            return 0;
        used += (size_t)snprintf(text + used, room - used, "%s[%u,%u,%u]", given > 1 ? "," : ",\"arrays\":[", set,
                                 binding, count);
    }
    if (given)
        used += (size_t)snprintf(text + used, room - used, "]");
    return used;
}

/* The load_program request of ``stage``'s module, constants and the lengths of its runtime arrays of
 * buffers (from ``layout``) included, in ``text``. */
static VkResult request_text(const struct ls_icd_shader *shader, const VkSpecializationInfo *spec,
                             const struct ls_icd_pipeline_layout *layout, char *text, size_t room)
{
    size_t used = (size_t)snprintf(text, room, "{\"op\":\"load_program\",\"constants\":[");
    uint32_t given = 0;
    if (spec != NULL && spec->mapEntryCount && spec->pMapEntries == NULL)
        return LS_ICD_INVALID;
    for (uint32_t i = 0; spec != NULL && i < spec->mapEntryCount; i++) {
        const VkSpecializationMapEntry *entry = &spec->pMapEntries[i];
        uint32_t width = 0;
        int kind;
        VkResult result;
        if (entry->offset > spec->dataSize || entry->size > spec->dataSize - entry->offset || spec->pData == NULL)
            return LS_ICD_INVALID; /* past pData */
        for (uint32_t j = 0; j < i; j++)
            if (spec->pMapEntries[j].constantID == entry->constantID)
                return LS_ICD_INVALID; /* given twice */
        kind = spec_type(shader->code, shader->size / 4, entry->constantID, &width);
        if (kind == 0)
            continue; /* not the module's: no effect */
        if (++given > MOST_CONSTANTS || room - used < 64)
            return LS_ICD_INVALID;
        used += (size_t)snprintf(text + used, room - used, "%s[%u,", given > 1 ? "," : "", entry->constantID);
        result = put_value(text + used, room - used - 2, kind, width,
                           (const uint8_t *)spec->pData + entry->offset, entry->size);
        if (result != VK_SUCCESS)
            return result;
        used += strlen(text + used);
        used += (size_t)snprintf(text + used, room - used, "]");
    }
    used += (size_t)snprintf(text + used, room - used, "]");
    used = put_arrays(shader->code, shader->size / 4, layout, text, used, room);
    if (used == 0 || room - used < 2)
        return LS_ICD_INVALID;
    snprintf(text + used, room - used, "}");
    return VK_SUCCESS;
}

/* ---- compute pipelines */

static int fits(VkDescriptorType type, const char *kind)
{
    if (strcmp(kind, "storage") == 0)
        return type == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER || type == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC;
    if (strcmp(kind, "uniform") == 0)
        return type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER || type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC;
    if (strcmp(kind, "storage_texel") == 0)
        return type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER;
    return strcmp(kind, "uniform_texel") == 0 && type == VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
}

/* 1 when ``layout`` holds the resource at (set, binding) as a buffer of its kind, count at least its. */
static int covered(const struct ls_icd_pipeline_layout *layout, const struct ls_icd_resource *resource,
                   const char *kind)
{
    if (resource->set >= layout->nsets)
        return 0;
    for (uint32_t i = 0; i < layout->sets[resource->set].nbindings; i++) {
        const struct ls_icd_layout_binding *binding = &layout->sets[resource->set].bindings[i];
        if (binding->binding == resource->binding)
            return fits(binding->type, kind) && binding->count >= resource->count;
    }
    return 0;
}

/* The reply's program read into ``pipeline`` and checked against ``layout`` and ``name``. */
static VkResult read_program(const cJSON *reply, const struct ls_icd_pipeline_layout *layout, const char *name,
                             uint32_t most_push, struct ls_icd_pipeline *pipeline)
{
    const cJSON *resources = cJSON_GetObjectItemCaseSensitive(reply, "resources");
    const cJSON *local = cJSON_GetObjectItemCaseSensitive(reply, "local_size");
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(reply, "entry_point");
    int64_t bindings = ls_icd_whole_field(reply, "bindings", 0, MOST_RESOURCES);
    int64_t push = ls_icd_whole_field(reply, "push_size", 0, most_push);
    uint32_t sum = 0, i = 0;
    const cJSON *item;
    if (bindings < 0 || push < 0 || !cJSON_IsArray(resources) || cJSON_GetArraySize(resources) > MOST_RESOURCES ||
        !cJSON_IsArray(local) || cJSON_GetArraySize(local) != 3 || !cJSON_IsString(entry))
        return LS_ICD_INVALID;
    pipeline->nbuffers = (uint32_t)bindings;
    pipeline->push_size = (uint32_t)push;
    cJSON_ArrayForEach(item, local) {
        if (!cJSON_IsNumber(item) || !(item->valuedouble >= 1) || item->valuedouble > 65535 ||
            item->valuedouble != (double)(uint32_t)item->valuedouble)
            return LS_ICD_INVALID;
        pipeline->local_size[i++] = (uint32_t)item->valuedouble;
    }
    if (strcmp(entry->valuestring, name) != 0) {
        fprintf(stderr, "libshare Vulkan driver: the module's entry point is \"%.100s\", not \"%.100s\"\n",
                entry->valuestring, name);
        return LS_ICD_INVALID;
    }
    pipeline->resources = calloc((size_t)cJSON_GetArraySize(resources) + 1, sizeof(*pipeline->resources));
    if (pipeline->resources == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    cJSON_ArrayForEach(item, resources) {
        struct ls_icd_resource *resource = &pipeline->resources[pipeline->nresources];
        const cJSON *kind = cJSON_GetArrayItem(item, 3);
        int64_t parts[3];
        for (int j = 0; j < 3; j++) {
            const cJSON *part = cJSON_GetArrayItem(item, j);
            parts[j] = cJSON_IsNumber(part) && part->valuedouble >= 0 && part->valuedouble <= 1u << 30 &&
                               part->valuedouble == (double)(int64_t)part->valuedouble
                           ? (int64_t)part->valuedouble
                           : -1;
        }
        if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 4 || !cJSON_IsString(kind) || parts[0] < 0 ||
            parts[1] < 0 || parts[2] < 1 || parts[2] > MOST_RESOURCES)
            return LS_ICD_INVALID;
        *resource = (struct ls_icd_resource){(uint32_t)parts[0], (uint32_t)parts[1], (uint32_t)parts[2]};
        sum += resource->count;
        pipeline->nresources++;
        if (!covered(layout, resource, kind->valuestring)) {
            fprintf(stderr, "libshare Vulkan driver: the pipeline layout has no %.20s buffer binding %u of set %u "
                    "for %u buffers\n", kind->valuestring, resource->binding, resource->set, resource->count);
            return LS_ICD_INVALID;
        }
    }
    if (sum != pipeline->nbuffers)
        return LS_ICD_INVALID;
    if (pipeline->push_size > layout->push_size) {
        fprintf(stderr, "libshare Vulkan driver: the module's push constants (%u bytes) are past the layout's "
                "(%u)\n", pipeline->push_size, layout->push_size);
        return LS_ICD_INVALID;
    }
    return VK_SUCCESS;
}

/* One compute pipeline made (the lock held): its handle in ``out``. */
static VkResult make_pipeline(struct ls_icd_device *device, const VkComputePipelineCreateInfo *info, VkPipeline *out)
{
    const VkPipelineShaderStageCreateInfo *stage = &info->stage;
    struct ls_icd_object *module = find(device, (uint64_t)(uintptr_t)stage->module, LS_ICD_SHADER);
    struct ls_icd_object *layout = find(device, (uint64_t)(uintptr_t)info->layout, LS_ICD_PIPELINE_LAYOUT);
    struct ls_icd_object holder = {.kind = LS_ICD_PIPELINE}, *object;
    struct ls_icd_pipeline_layout layout_copy;
    struct ls_icd_frame frame;
    cJSON *reply = NULL;
    char *text;
    uint64_t made;
    int64_t program;
    VkResult result;
    if (module == NULL || layout == NULL || stage->stage != VK_SHADER_STAGE_COMPUTE_BIT ||
        stage->pName == NULL || (info->flags & ~(VkPipelineCreateFlags)PIPELINE_FLAGS) != 0)
        return LS_ICD_INVALID;
    text = malloc(REQUEST_TEXT);
    if (text == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    result = request_text(&module->u.shader, stage->pSpecializationInfo, &layout->u.pipeline_layout, text,
                          REQUEST_TEXT);
    if (result == VK_SUCCESS)
        result = ls_icd_ask_within(device, device->session.load_ms, text, module->u.shader.code,
                                   module->u.shader.size, &frame, 0, &reply, LS_ICD_INVALID);
    else
        memset(&frame, 0, sizeof(frame));
    free(text);
    program = result == VK_SUCCESS ? ls_icd_whole_field(reply, "program_id", 0, 9007199254740991.0) : -1;
    if (result == VK_SUCCESS && program < 0)
        result = LS_ICD_INVALID; /* a malformed reply: the session's end frees whatever it made */
    if (result == VK_SUCCESS) {
        holder.u.pipeline.program_id = program;
        layout_copy = layout->u.pipeline_layout; /* (read before any object is made: the table may move) */
        result = read_program(reply, &layout_copy, stage->pName, device->seen.properties.limits.maxPushConstantsSize,
                              &holder.u.pipeline);
    }
    if (result == VK_SUCCESS) /* (its flags and required size: checked once its workgroup is known) */
        result = ls_icd_stage_subgroups(&device->seen, stage, holder.u.pipeline.local_size);
    cJSON_Delete(reply);
    ls_icd_frame_free(&frame);
    made = result == VK_SUCCESS ? make(device, LS_ICD_PIPELINE, &object) : 0;
    if (made) {
        object->u.pipeline = holder.u.pipeline;
        *out = (VkPipeline)(uintptr_t)made;
        return VK_SUCCESS;
    }
    if (program >= 0)
        ls_icd_pipeline_object_free(device, &holder); /* the program is freed at the arbiter */
    return result == VK_SUCCESS ? VK_ERROR_OUT_OF_HOST_MEMORY : result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateComputePipelines(VkDevice handle, VkPipelineCache cache, uint32_t count,
                                                             const VkComputePipelineCreateInfo *infos,
                                                             const VkAllocationCallbacks *allocator,
                                                             VkPipeline *out)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult answer = VK_SUCCESS;
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    for (uint32_t i = 0; i < count; i++) {
        VkResult result = cache != VK_NULL_HANDLE &&
                                  find(device, (uint64_t)(uintptr_t)cache, LS_ICD_PIPELINE_CACHE) == NULL
                              ? LS_ICD_INVALID
                              : make_pipeline(device, &infos[i], &out[i]);
        if (result != VK_SUCCESS) {
            out[i] = VK_NULL_HANDLE;
            if (answer == VK_SUCCESS)
                answer = result;
        }
    }
    pthread_mutex_unlock(&device->lock);
    return answer;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipeline(VkDevice handle, VkPipeline pipeline,
                                                  const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    drop(device_of(handle), (uint64_t)(uintptr_t)pipeline, LS_ICD_PIPELINE);
}

/* ---- pipeline caches: nothing kept */

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreatePipelineCache(VkDevice handle, const VkPipelineCacheCreateInfo *info,
                                                          const VkAllocationCallbacks *allocator,
                                                          VkPipelineCache *out)
{
    uint64_t made;
    VkResult result;
    (void)allocator;
    if (info->flags != 0) /* (externally synchronized caches are Vulkan 1.3's) */
        return LS_ICD_INVALID;
    result = ls_icd_object_create(device_of(handle), LS_ICD_PIPELINE_CACHE, NULL, 0, &made); /* its data: ignored */
    if (result == VK_SUCCESS)
        *out = (VkPipelineCache)(uintptr_t)made;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyPipelineCache(VkDevice handle, VkPipelineCache cache,
                                                       const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    drop(device_of(handle), (uint64_t)(uintptr_t)cache, LS_ICD_PIPELINE_CACHE);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetPipelineCacheData(VkDevice handle, VkPipelineCache cache, size_t *size,
                                                           void *data)
{
    struct ls_icd_device *device = device_of(handle);
    const VkPhysicalDeviceProperties *properties = &device->seen.properties;
    uint32_t words[4] = {CACHE_HEADER, VK_PIPELINE_CACHE_HEADER_VERSION_ONE, properties->vendorID,
                         properties->deviceID};
    int found;
    pthread_mutex_lock(&device->lock);
    found = find(device, (uint64_t)(uintptr_t)cache, LS_ICD_PIPELINE_CACHE) != NULL;
    pthread_mutex_unlock(&device->lock);
    if (!found)
        return LS_ICD_INVALID;
    if (data == NULL) {
        *size = CACHE_HEADER;
        return VK_SUCCESS;
    }
    if (*size < CACHE_HEADER) {
        *size = 0; /* the header does not fit: nothing is written */
        return VK_INCOMPLETE;
    }
    memcpy(data, words, sizeof(words));
    memcpy((uint8_t *)data + sizeof(words), properties->pipelineCacheUUID, VK_UUID_SIZE);
    *size = CACHE_HEADER;
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_MergePipelineCaches(VkDevice handle, VkPipelineCache into, uint32_t count,
                                                          const VkPipelineCache *caches)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    if (find(device, (uint64_t)(uintptr_t)into, LS_ICD_PIPELINE_CACHE) == NULL)
        result = LS_ICD_INVALID;
    for (uint32_t i = 0; i < count && result == VK_SUCCESS; i++)
        if (find(device, (uint64_t)(uintptr_t)caches[i], LS_ICD_PIPELINE_CACHE) == NULL)
            result = LS_ICD_INVALID;
    pthread_mutex_unlock(&device->lock);
    return result;
}
