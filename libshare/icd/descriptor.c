/* VkDescriptorSetLayout, VkDescriptorPool, VkDescriptorSet and their updates (templates and push
 * descriptors write through them: template.c).
 *
 * A set layout is its bindings sorted by number (gaps allowed), each of a buffer type (storage or
 * uniform, dynamic or not) or a texel buffer type (storage or uniform: a view of view.c). Any other
 * type (samplers, images, input attachments, and so immutable samplers) with a count, or flags (update
 * after bind; push descriptors without VK_KHR_push_descriptor enabled) make vkCreateDescriptorSetLayout
 * answer LS_ICD_INVALID, since the specification gives that command no error for a layout the device
 * cannot make (only running out of memory);
 * vkGetDescriptorSetLayoutSupport, the specification's way to ask first, answers unsupported for
 * exactly the layouts create refuses. A binding of count 0 is allowed and holds no descriptor;
 * binding numbers are distinct; a layout holds at most the device's maxPerSetDescriptors (and
 * LS_ICD_MOST_DESCRIPTORS) descriptors; a layout of push descriptors at most LS_ICD_MOST_PUSHED,
 * none dynamic (as Vulkan requires), and no set is allocated of it. Pipeline layouts and sets keep copies
 * (ls_icd_set_layout_copy), so a layout may be destroyed while they live.
 *
 * A pool counts its sets against maxSets (past it: VK_ERROR_OUT_OF_POOL_MEMORY; its per-type sizes
 * are not counted, so a size of 0 descriptors, which Vulkan forbids and older ncnn asks for, as
 * lavapipe allows, is let by) and keeps their handles: vkResetDescriptorPool and vkDestroyDescriptorPool free
 * them, and so does vkFreeDescriptorSets, from a pool made without FREE_DESCRIPTOR_SET too (Vulkan
 * forbids it, lavapipe allows it, and the command has no error to give); a set of another pool is
 * LS_ICD_INVALID. A set is a copy of its layout and one ls_icd_descriptor an entry.
 *
 * vkUpdateDescriptorSets returns nothing, so a write or copy it cannot apply is skipped whole and
 * named on stderr (one line), never half applied: a set, binding or buffer that does not exist
 * (the buffer is looked up at write time), a type other than the binding's, an offset not aligned
 * to the device's minStorage/UniformBufferOffsetAlignment, a range of 0, past the buffer or past
 * maxStorage/UniformBufferRange, a texel buffer's view that is no live view of a format serving
 * that type (view.c's ls_icd_view_wrong), or elements past the last binding. Elements past a binding's
 * count go on into the next binding (the next number in the layout, skipping those of count 0),
 * which must be of the same type, as the specification describes. Writes come first, then copies.
 * A texel descriptor holds its view's handle, offset and range 0.
 *
 * commands.c resolves a bound descriptor with ls_icd_descriptor_resolve: the buffer's memory's
 * arbiter buffer_id, the buffer's offset in it plus the descriptor's plus the dynamic offset, and
 * the range clipped to the buffer. The device's lock is held around every use of its table. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "descriptor.h"
#include "icd.h"

#define MOST_BINDINGS 4096 /* a layout's bindings, a template's entries */
#define ANY_TYPE VK_DESCRIPTOR_TYPE_MAX_ENUM

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_object *find(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    return ls_icd_object_find(&device->objects, handle, kind);
}

static int is_buffer_type(VkDescriptorType type)
{
    return type == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER || type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER ||
           type == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC || type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC;
}

int ls_icd_descriptor_texel(VkDescriptorType type)
{
    return type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER || type == VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
}

int ls_icd_descriptor_offered(VkDescriptorType type)
{
    return is_buffer_type(type) || ls_icd_descriptor_texel(type);
}

int ls_icd_descriptor_dynamic(VkDescriptorType type)
{
    return type == VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC || type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC;
}

static int is_uniform(VkDescriptorType type)
{
    return type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER || type == VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER_DYNAMIC;
}

/* ---- set layouts */

VkResult ls_icd_set_layout_copy(struct ls_icd_set_layout *to, const struct ls_icd_set_layout *from)
{
    *to = *from;
    to->bindings = NULL;
    if (from->nbindings == 0)
        return VK_SUCCESS;
    to->bindings = malloc((size_t)from->nbindings * sizeof(*to->bindings));
    if (to->bindings == NULL) {
        to->nbindings = 0;
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    memcpy(to->bindings, from->bindings, (size_t)from->nbindings * sizeof(*to->bindings));
    return VK_SUCCESS;
}

void ls_icd_set_layout_free(struct ls_icd_set_layout *layout)
{
    free(layout->bindings);
    layout->bindings = NULL;
    layout->nbindings = 0;
}

static int by_number(const void *a, const void *b)
{
    uint32_t x = ((const struct ls_icd_layout_binding *)a)->binding;
    uint32_t y = ((const struct ls_icd_layout_binding *)b)->binding;
    return x < y ? -1 : x > y;
}

/* ``info`` read into ``layout`` (its bindings sorted, numbered): VK_SUCCESS, or why not. */
static VkResult read_layout(const struct ls_icd_device *device, const VkDescriptorSetLayoutCreateInfo *info,
                            struct ls_icd_set_layout *layout)
{
    uint64_t total = 0, most = device->seen.max_per_set_descriptors;
    int push = info->flags == VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR &&
               (device->extensions & LS_ICD_EXT_PUSH);
    memset(layout, 0, sizeof(*layout));
    if ((info->flags != 0 && !push) || info->bindingCount > MOST_BINDINGS ||
        (info->bindingCount && info->pBindings == NULL))
        return LS_ICD_INVALID;
    if (most == 0 || most > LS_ICD_MOST_DESCRIPTORS)
        most = LS_ICD_MOST_DESCRIPTORS;
    if (push)
        most = LS_ICD_MOST_PUSHED;
    for (uint32_t i = 0; i < info->bindingCount; i++) {
        const VkDescriptorSetLayoutBinding *binding = &info->pBindings[i];
        if (binding->descriptorCount > 0 &&
            (!ls_icd_descriptor_offered(binding->descriptorType) || (push && ls_icd_descriptor_dynamic(binding->descriptorType))))
            return LS_ICD_INVALID; /* not a buffer or texel buffer: no error of the specification's fits */
        total += binding->descriptorCount;
    }
    if (total > most)
        return LS_ICD_INVALID;
    layout->flags = info->flags;
    if (info->bindingCount == 0)
        return VK_SUCCESS;
    layout->bindings = malloc((size_t)info->bindingCount * sizeof(*layout->bindings));
    if (layout->bindings == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < info->bindingCount; i++)
        layout->bindings[i] = (struct ls_icd_layout_binding){info->pBindings[i].binding,
                                                             info->pBindings[i].descriptorType,
                                                             info->pBindings[i].descriptorCount, 0};
    layout->nbindings = info->bindingCount;
    qsort(layout->bindings, layout->nbindings, sizeof(*layout->bindings), by_number);
    for (uint32_t i = 0; i < layout->nbindings; i++) {
        if (i > 0 && layout->bindings[i].binding == layout->bindings[i - 1].binding) {
            ls_icd_set_layout_free(layout);
            return LS_ICD_INVALID; /* a number given twice */
        }
        layout->bindings[i].first = layout->nentries;
        layout->nentries += layout->bindings[i].count;
    }
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorSetLayout(VkDevice handle,
                                                                const VkDescriptorSetLayoutCreateInfo *info,
                                                                const VkAllocationCallbacks *allocator,
                                                                VkDescriptorSetLayout *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_set_layout layout;
    uint64_t made;
    VkResult result = read_layout(device, info, &layout);
    (void)allocator;
    if (result != VK_SUCCESS)
        return result;
    pthread_mutex_lock(&device->lock);
    made = ls_icd_object_new(&device->objects, LS_ICD_SET_LAYOUT);
    if (made)
        find(device, made, LS_ICD_SET_LAYOUT)->u.set_layout = layout;
    pthread_mutex_unlock(&device->lock);
    if (!made) {
        ls_icd_set_layout_free(&layout);
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    *out = (VkDescriptorSetLayout)(uintptr_t)made;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_GetDescriptorSetLayoutSupport(VkDevice handle,
                                                                const VkDescriptorSetLayoutCreateInfo *info,
                                                                VkDescriptorSetLayoutSupport *out)
{
    struct ls_icd_set_layout layout;
    out->supported = read_layout(device_of(handle), info, &layout) == VK_SUCCESS;
    if (out->supported)
        ls_icd_set_layout_free(&layout);
}

/* Free what ``object`` (a kind of this file) holds, its sets and their pool's list included. */
static void release(struct ls_icd_device *device, uint64_t handle);

void ls_icd_descriptor_object_free(struct ls_icd_object *object)
{
    switch (object->kind) {
    case LS_ICD_SET_LAYOUT:
        ls_icd_set_layout_free(&object->u.set_layout);
        break;
    case LS_ICD_DESCRIPTOR_SET:
        ls_icd_set_layout_free(&object->u.set.layout);
        free(object->u.set.entries);
        object->u.set.entries = NULL;
        break;
    case LS_ICD_DESCRIPTOR_POOL:
        free(object->u.descriptor_pool.sets);
        object->u.descriptor_pool.sets = NULL;
        break;
    case LS_ICD_UPDATE_TEMPLATE:
        free(object->u.update_template.entries);
        object->u.update_template.entries = NULL;
        break;
    default:
        break;
    }
}

static void release(struct ls_icd_device *device, uint64_t handle)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, handle, LS_ICD_DESCRIPTOR_SET);
    if (object == NULL)
        object = ls_icd_object_find(&device->objects, handle, LS_ICD_SET_LAYOUT);
    if (object == NULL)
        object = ls_icd_object_find(&device->objects, handle, LS_ICD_UPDATE_TEMPLATE);
    if (object == NULL)
        return;
    ls_icd_descriptor_object_free(object);
    ls_icd_object_drop(&device->objects, handle);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorSetLayout(VkDevice handle, VkDescriptorSetLayout layout,
                                                             const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = device_of(handle);
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    if (find(device, (uint64_t)(uintptr_t)layout, LS_ICD_SET_LAYOUT) != NULL)
        release(device, (uint64_t)(uintptr_t)layout);
    pthread_mutex_unlock(&device->lock);
}

/* ---- pools and sets */

/* Free every set of ``pool`` (the lock held). */
static void empty_pool(struct ls_icd_device *device, uint64_t pool)
{
    struct ls_icd_descriptor_pool *kept = &find(device, pool, LS_ICD_DESCRIPTOR_POOL)->u.descriptor_pool;
    for (uint32_t i = 0; i < kept->nsets; i++)
        release(device, kept->sets[i]);
    kept->nsets = 0;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorPool(VkDevice handle, const VkDescriptorPoolCreateInfo *info,
                                                           const VkAllocationCallbacks *allocator,
                                                           VkDescriptorPool *out)
{
    struct ls_icd_device *device = device_of(handle);
    uint64_t made;
    (void)allocator;
    if (info->maxSets == 0 || (info->flags & ~(VkDescriptorPoolCreateFlags)
                                                  VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT) != 0 ||
        (info->poolSizeCount && info->pPoolSizes == NULL))
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    made = ls_icd_object_new(&device->objects, LS_ICD_DESCRIPTOR_POOL);
    if (made) {
        struct ls_icd_descriptor_pool *pool = &find(device, made, LS_ICD_DESCRIPTOR_POOL)->u.descriptor_pool;
        pool->max_sets = info->maxSets;
    }
    pthread_mutex_unlock(&device->lock);
    if (!made)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    *out = (VkDescriptorPool)(uintptr_t)made;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorPool(VkDevice handle, VkDescriptorPool pool,
                                                        const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    object = find(device, (uint64_t)(uintptr_t)pool, LS_ICD_DESCRIPTOR_POOL);
    if (object != NULL) {
        empty_pool(device, (uint64_t)(uintptr_t)pool);
        ls_icd_descriptor_object_free(object);
        ls_icd_object_drop(&device->objects, (uint64_t)(uintptr_t)pool);
    }
    pthread_mutex_unlock(&device->lock);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetDescriptorPool(VkDevice handle, VkDescriptorPool pool,
                                                          VkDescriptorPoolResetFlags flags)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result = LS_ICD_INVALID;
    (void)flags; /* reserved */
    pthread_mutex_lock(&device->lock);
    if (find(device, (uint64_t)(uintptr_t)pool, LS_ICD_DESCRIPTOR_POOL) != NULL) {
        empty_pool(device, (uint64_t)(uintptr_t)pool);
        result = VK_SUCCESS;
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* A set of a copy of ``layout``, its entries typed and none written, kept by ``pool`` (0: none, a
 * command buffer's pushed set; the lock held): its handle, or 0 out of memory. */
uint64_t ls_icd_set_new(struct ls_icd_device *device, const struct ls_icd_set_layout *layout, uint64_t pool)
{
    struct ls_icd_set_layout copy;
    struct ls_icd_descriptor *entries;
    uint64_t made = 0;
    if (ls_icd_set_layout_copy(&copy, layout) != VK_SUCCESS) /* first: ``layout`` may be in the table */
        return 0;
    entries = calloc(copy.nentries + 1, sizeof(*entries));
    if (entries != NULL)
        made = ls_icd_object_new(&device->objects, LS_ICD_DESCRIPTOR_SET);
    if (!made) {
        free(entries);
        ls_icd_set_layout_free(&copy);
        return 0;
    }
    find(device, made, LS_ICD_DESCRIPTOR_SET)->u.set = (struct ls_icd_descriptor_set){pool, copy, entries};
    for (uint32_t b = 0; b < copy.nbindings; b++)
        for (uint32_t e = 0; e < copy.bindings[b].count; e++)
            entries[copy.bindings[b].first + e].type = copy.bindings[b].type;
    return made;
}

/* One set of ``layout`` in ``pool`` (the lock held; both found): its handle, or 0 out of memory. */
static uint64_t make_set(struct ls_icd_device *device, uint64_t pool, uint64_t layout)
{
    struct ls_icd_descriptor_pool *kept = &find(device, pool, LS_ICD_DESCRIPTOR_POOL)->u.descriptor_pool;
    uint64_t made;
    if (kept->nsets == kept->capacity) {
        uint32_t capacity = kept->capacity ? kept->capacity * 2 : 8;
        uint64_t *grown = realloc(kept->sets, (size_t)capacity * sizeof(*grown));
        if (grown == NULL)
            return 0;
        kept->sets = grown;
        kept->capacity = capacity;
    }
    made = ls_icd_set_new(device, &find(device, layout, LS_ICD_SET_LAYOUT)->u.set_layout, pool);
    if (made) {
        kept = &find(device, pool, LS_ICD_DESCRIPTOR_POOL)->u.descriptor_pool; /* (the table may have moved) */
        kept->sets[kept->nsets++] = made;
    }
    return made;
}

/* Take ``set`` out of its pool's list and free it (the lock held; found). */
void ls_icd_set_free(struct ls_icd_device *device, uint64_t set)
{
    uint64_t pool = find(device, set, LS_ICD_DESCRIPTOR_SET)->u.set.pool;
    struct ls_icd_object *owner = find(device, pool, LS_ICD_DESCRIPTOR_POOL);
    if (owner != NULL) {
        struct ls_icd_descriptor_pool *kept = &owner->u.descriptor_pool;
        for (uint32_t i = 0; i < kept->nsets; i++)
            if (kept->sets[i] == set) {
                kept->sets[i] = kept->sets[--kept->nsets];
                break;
            }
    }
    release(device, set);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateDescriptorSets(VkDevice handle, const VkDescriptorSetAllocateInfo *info,
                                                             VkDescriptorSet *out)
{
    struct ls_icd_device *device = device_of(handle);
    uint64_t pool = (uint64_t)(uintptr_t)info->descriptorPool;
    struct ls_icd_object *object;
    VkResult result = VK_SUCCESS;
    uint32_t i, made = 0;
    pthread_mutex_lock(&device->lock);
    object = find(device, pool, LS_ICD_DESCRIPTOR_POOL);
    if (object == NULL || (info->descriptorSetCount && info->pSetLayouts == NULL))
        result = LS_ICD_INVALID;
    for (i = 0; result == VK_SUCCESS && i < info->descriptorSetCount; i++) {
        struct ls_icd_object *layout = find(device, (uint64_t)(uintptr_t)info->pSetLayouts[i], LS_ICD_SET_LAYOUT);
        if (layout == NULL || layout->u.set_layout.flags != 0)
            result = LS_ICD_INVALID; /* no layout, or one of push descriptors */
    }
    if (result == VK_SUCCESS && info->descriptorSetCount > object->u.descriptor_pool.max_sets -
                                                               object->u.descriptor_pool.nsets)
        result = VK_ERROR_OUT_OF_POOL_MEMORY;
    for (; result == VK_SUCCESS && made < info->descriptorSetCount; made++) {
        uint64_t set = make_set(device, pool, (uint64_t)(uintptr_t)info->pSetLayouts[made]);
        out[made] = (VkDescriptorSet)(uintptr_t)set;
        if (!set)
            result = VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (result != VK_SUCCESS) { /* none is made: those that were are freed */
        for (i = 0; i < made; i++)
            if (out[i] != VK_NULL_HANDLE)
                ls_icd_set_free(device, (uint64_t)(uintptr_t)out[i]);
        for (i = 0; i < info->descriptorSetCount; i++)
            out[i] = VK_NULL_HANDLE;
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_FreeDescriptorSets(VkDevice handle, VkDescriptorPool pool, uint32_t count,
                                                         const VkDescriptorSet *sets)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    object = find(device, (uint64_t)(uintptr_t)pool, LS_ICD_DESCRIPTOR_POOL);
    if (object == NULL)
        result = LS_ICD_INVALID;
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++) {
        struct ls_icd_object *set = find(device, (uint64_t)(uintptr_t)sets[i], LS_ICD_DESCRIPTOR_SET);
        if (sets[i] != VK_NULL_HANDLE && (set == NULL || set->u.set.pool != (uint64_t)(uintptr_t)pool))
            result = LS_ICD_INVALID; /* checked whole before any is freed */
    }
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++)
        if (find(device, (uint64_t)(uintptr_t)sets[i], LS_ICD_DESCRIPTOR_SET) != NULL)
            ls_icd_set_free(device, (uint64_t)(uintptr_t)sets[i]); /* (a handle given twice: freed once) */
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* ---- updates */

/* The entry of ``set``'s element ``element`` of binding ``binding``, counted on through the
 * layout's consecutive bindings (those of count 0 skipped), which must be of ``type`` (or ANY_TYPE); NULL
 * past the last, or at a binding of another type. */
static struct ls_icd_descriptor *element_of(struct ls_icd_descriptor_set *set, uint32_t binding, uint64_t element,
                                            VkDescriptorType type)
{
    const struct ls_icd_set_layout *layout = &set->layout;
    uint32_t b = 0;
    while (b < layout->nbindings && layout->bindings[b].binding != binding)
        b++;
    if (b == layout->nbindings)
        return NULL;
    while (b < layout->nbindings && element >= layout->bindings[b].count) {
        element -= layout->bindings[b].count;
        b++;
    }
    if (b == layout->nbindings || (type != ANY_TYPE && layout->bindings[b].type != type))
        return NULL;
    return &set->entries[layout->bindings[b].first + element];
}

/* Why ``info`` cannot be a descriptor of ``type`` (the lock held), or NULL when it can. */
static const char *wrong_info(struct ls_icd_device *device, VkDescriptorType type, const VkDescriptorBufferInfo *info)
{
    const VkPhysicalDeviceLimits *limits = &device->seen.properties.limits;
    struct ls_icd_object *buffer = find(device, (uint64_t)(uintptr_t)info->buffer, LS_ICD_BUFFER);
    uint64_t alignment = is_uniform(type) ? limits->minUniformBufferOffsetAlignment
                                          : limits->minStorageBufferOffsetAlignment;
    uint64_t most = is_uniform(type) ? limits->maxUniformBufferRange : limits->maxStorageBufferRange;
    uint64_t range;
    if (buffer == NULL)
        return "no such buffer";
    if (alignment > 1 && info->offset % alignment != 0)
        return "an offset not aligned to the device's minimum offset alignment";
    if (info->offset >= buffer->u.buffer.size)
        return "an offset past the buffer";
    range = info->range == VK_WHOLE_SIZE ? buffer->u.buffer.size - info->offset : info->range;
    if (range == 0 || range > buffer->u.buffer.size - info->offset)
        return "a range of 0 or past the buffer";
    if (range > most)
        return "a range past the device's largest for its type";
    return NULL;
}

void ls_icd_descriptor_skipped(const char *what, uint32_t index, const char *why)
{
    fprintf(stderr, "libshare Vulkan driver: %s %u skipped: %s\n", what, index, why);
}

/* Write ``count`` descriptors into ``set_handle`` from (binding, element) on, all or none (the lock held):
 * buffer infos for a buffer type, view handles for a texel buffer type. */
const char *ls_icd_descriptors_write(struct ls_icd_device *device, uint64_t set_handle, uint32_t binding,
                                     uint32_t element, VkDescriptorType type, uint32_t count,
                                     const VkDescriptorBufferInfo *infos, const VkBufferView *views)
{
    struct ls_icd_object *object = find(device, set_handle, LS_ICD_DESCRIPTOR_SET);
    const char *why = NULL;
    int texel = ls_icd_descriptor_texel(type);
    if (object == NULL)
        return "no such descriptor set";
    if (!ls_icd_descriptor_offered(type) || (count && (texel ? views == NULL : infos == NULL)))
        return "not a buffer or texel buffer descriptor, or none given";
    for (uint32_t i = 0; i < count && why == NULL; i++)
        why = element_of(&object->u.set, binding, (uint64_t)element + i, type) == NULL
                  ? "no binding of that type holds its elements"
                  : texel ? ls_icd_view_wrong(device, type, (uint64_t)(uintptr_t)views[i])
                          : wrong_info(device, type, &infos[i]);
    for (uint32_t i = 0; i < count && why == NULL; i++)
        *element_of(&object->u.set, binding, (uint64_t)element + i, type) =
            texel ? (struct ls_icd_descriptor){type, (uint64_t)(uintptr_t)views[i], 0, 0}
                  : (struct ls_icd_descriptor){type, (uint64_t)(uintptr_t)infos[i].buffer, infos[i].offset,
                                               infos[i].range};
    return why;
}

static const char *copy_descriptors(struct ls_icd_device *device, const VkCopyDescriptorSet *copy)
{
    struct ls_icd_object *from = find(device, (uint64_t)(uintptr_t)copy->srcSet, LS_ICD_DESCRIPTOR_SET);
    struct ls_icd_object *to = find(device, (uint64_t)(uintptr_t)copy->dstSet, LS_ICD_DESCRIPTOR_SET);
    struct ls_icd_descriptor *taken;
    if (from == NULL || to == NULL)
        return "no such descriptor set";
    if (copy->descriptorCount > LS_ICD_MOST_DESCRIPTORS)
        return "more descriptors than a set holds";
    taken = calloc((size_t)copy->descriptorCount + 1, sizeof(*taken));
    if (taken == NULL)
        return "out of memory";
    for (uint32_t i = 0; i < copy->descriptorCount; i++) {
        const struct ls_icd_descriptor *source =
            element_of(&from->u.set, copy->srcBinding, (uint64_t)copy->srcArrayElement + i, ANY_TYPE);
        if (source == NULL ||
            element_of(&to->u.set, copy->dstBinding, (uint64_t)copy->dstArrayElement + i, source->type) == NULL) {
            free(taken);
            return "its elements are past a binding, or of two types";
        }
        taken[i] = *source; /* (all read before any is written: a copy within one set) */
    }
    for (uint32_t i = 0; i < copy->descriptorCount; i++)
        *element_of(&to->u.set, copy->dstBinding, (uint64_t)copy->dstArrayElement + i, taken[i].type) = taken[i];
    free(taken);
    return NULL;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_UpdateDescriptorSets(VkDevice handle, uint32_t nwrites,
                                                       const VkWriteDescriptorSet *writes, uint32_t ncopies,
                                                       const VkCopyDescriptorSet *copies)
{
    struct ls_icd_device *device = device_of(handle);
    pthread_mutex_lock(&device->lock);
    for (uint32_t i = 0; i < nwrites; i++) {
        const VkWriteDescriptorSet *write = &writes[i];
        const char *why = ls_icd_descriptors_write(device, (uint64_t)(uintptr_t)write->dstSet, write->dstBinding,
                                            write->dstArrayElement, write->descriptorType, write->descriptorCount,
                                            write->pBufferInfo, write->pTexelBufferView);
        if (why != NULL)
            ls_icd_descriptor_skipped("vkUpdateDescriptorSets: write", i, why);
    }
    for (uint32_t i = 0; i < ncopies; i++) {
        const char *why = copy_descriptors(device, &copies[i]);
        if (why != NULL)
            ls_icd_descriptor_skipped("vkUpdateDescriptorSets: copy", i, why);
    }
    pthread_mutex_unlock(&device->lock);
}

/* ---- for commands.c */

VkResult ls_icd_descriptor_resolve(struct ls_icd_device *device, const struct ls_icd_descriptor *d,
                                   uint32_t dynamic_offset, uint32_t *buffer_id, uint64_t *offset, uint64_t *range)
{
    struct ls_icd_object *buffer = find(device, d->buffer, LS_ICD_BUFFER);
    struct ls_icd_object *memory = buffer ? find(device, buffer->u.buffer.memory, LS_ICD_MEMORY) : NULL;
    uint64_t start = d->offset + dynamic_offset, size;
    if (memory == NULL || memory->u.memory.buffer_id < 0 || memory->u.memory.buffer_id > UINT32_MAX ||
        start < d->offset || start >= buffer->u.buffer.size)
        return LS_ICD_INVALID; /* never written, its buffer or memory gone or unbound, or past it */
    size = buffer->u.buffer.size - start;
    *buffer_id = (uint32_t)memory->u.memory.buffer_id;
    *offset = buffer->u.buffer.offset + start;
    *range = d->range == VK_WHOLE_SIZE || d->range > size ? size : d->range;
    return VK_SUCCESS;
}
