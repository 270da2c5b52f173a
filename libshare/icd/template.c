/* VkDescriptorUpdateTemplate and push descriptors (VK_KHR_push_descriptor): descriptors written other
 * ways than vkUpdateDescriptorSets, each through descriptor.c's sets and writes.
 *
 * An update template keeps its entries, each of an offered type, and whether it is of push
 * descriptors (type PUSH_DESCRIPTORS, its pipeline layout checked at creation; the type is
 * LS_ICD_INVALID without the extension enabled). vkUpdateDescriptorSetWithTemplate reads each
 * entry's VkDescriptorBufferInfo (a texel buffer's VkBufferView) from pData at its offset and stride
 * and applies it as a write (ls_icd_descriptors_write): an entry it cannot apply is skipped and named
 * on stderr, as vkUpdateDescriptorSets does, and so is a template of push descriptors.
 *
 * Push descriptors. The driver resolves a dispatch's descriptors when it records the dispatch
 * (dispatch.c), so a pushed descriptor needs no storage on the device: each command buffer keeps,
 * per set number, a set of no pool (ls_icd_set_new) that vkCmdPushDescriptorSetKHR and
 * vkCmdPushDescriptorSetWithTemplateKHR write into and bind. Pushes add up, as Vulkan says, while
 * the set number's layout stays the same; a push with another layout starts a new set with nothing
 * written (Vulkan calls the old descriptors disturbed). The pushed sets are freed when the command
 * buffer is reset or freed (commands.c). A push that cannot be applied (no such pipeline layout or
 * set in it, a set layout not of push descriptors, a write the checks of vkUpdateDescriptorSets
 * refuse) is the recording's error, which vkEndCommandBuffer answers. The set's handle is never
 * given to the application; vkFreeDescriptorSets refuses it as a set of no pool of its. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "descriptor.h"
#include "icd.h"

#define MOST_ENTRIES 4096 /* a template's entries */

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_object *find(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    return ls_icd_object_find(&device->objects, handle, kind);
}

/* ---- update templates */

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorUpdateTemplate(VkDevice handle,
                                                                     const VkDescriptorUpdateTemplateCreateInfo *info,
                                                                     const VkAllocationCallbacks *allocator,
                                                                     VkDescriptorUpdateTemplate *out)
{
    struct ls_icd_device *device = device_of(handle);
    VkDescriptorUpdateTemplateEntry *entries;
    uint64_t made = 0;
    int push = info->templateType == VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_PUSH_DESCRIPTORS_KHR &&
               (device->extensions & LS_ICD_EXT_PUSH);
    uint64_t layout = push ? (uint64_t)(uintptr_t)info->pipelineLayout : (uint64_t)(uintptr_t)info->descriptorSetLayout;
    (void)allocator;
    if (info->flags != 0 || (info->templateType != VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET && !push) ||
        info->descriptorUpdateEntryCount > MOST_ENTRIES ||
        (info->descriptorUpdateEntryCount && info->pDescriptorUpdateEntries == NULL))
        return LS_ICD_INVALID;
    for (uint32_t i = 0; i < info->descriptorUpdateEntryCount; i++)
        if (!ls_icd_descriptor_offered(info->pDescriptorUpdateEntries[i].descriptorType) ||
            info->pDescriptorUpdateEntries[i].descriptorCount > LS_ICD_MOST_DESCRIPTORS)
            return LS_ICD_INVALID;
    entries = calloc(info->descriptorUpdateEntryCount + 1, sizeof(*entries));
    if (entries == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    memcpy(entries, info->pDescriptorUpdateEntries, info->descriptorUpdateEntryCount * sizeof(*entries));
    pthread_mutex_lock(&device->lock);
    if (find(device, layout, push ? LS_ICD_PIPELINE_LAYOUT : LS_ICD_SET_LAYOUT) != NULL)
        made = ls_icd_object_new(&device->objects, LS_ICD_UPDATE_TEMPLATE);
    if (made)
        find(device, made, LS_ICD_UPDATE_TEMPLATE)->u.update_template =
            (struct ls_icd_update_template){entries, info->descriptorUpdateEntryCount, push};
    pthread_mutex_unlock(&device->lock);
    if (!made) {
        free(entries);
        return LS_ICD_INVALID; /* (or the table full: the layout's handle is checked first) */
    }
    *out = (VkDescriptorUpdateTemplate)(uintptr_t)made;
    return VK_SUCCESS;
}

/* What a template holds, freed before its slot is dropped (ls_icd_object_destroy_with). */
static void forget_entries(struct ls_icd_device *device, struct ls_icd_object *object)
{
    (void)device;
    ls_icd_descriptor_object_free(object);
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorUpdateTemplate(VkDevice handle,
                                                                  VkDescriptorUpdateTemplate template,
                                                                  const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy_with(device_of(handle), (uint64_t)(uintptr_t)template, LS_ICD_UPDATE_TEMPLATE,
                               forget_entries);
}

/* Apply ``entry`` of a template to ``set`` from ``data`` as a write (the lock held): NULL, or why not. */
static const char *apply_entry(struct ls_icd_device *device, uint64_t set, const VkDescriptorUpdateTemplateEntry *entry,
                               const void *data)
{
    int texel = ls_icd_descriptor_texel(entry->descriptorType);
    size_t size = texel ? sizeof(VkBufferView) : sizeof(VkDescriptorBufferInfo);
    uint8_t *items = calloc((size_t)entry->descriptorCount + 1, size);
    const char *why = items == NULL ? "out of memory" : data == NULL ? "no data" : NULL;
    for (uint32_t j = 0; why == NULL && j < entry->descriptorCount; j++)
        memcpy(items + j * size, (const uint8_t *)data + entry->offset + (size_t)j * entry->stride, size);
    if (why == NULL)
        why = ls_icd_descriptors_write(device, set, entry->dstBinding, entry->dstArrayElement, entry->descriptorType,
                                       entry->descriptorCount, (const VkDescriptorBufferInfo *)items,
                                       (const VkBufferView *)items);
    free(items);
    return why;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_UpdateDescriptorSetWithTemplate(VkDevice handle, VkDescriptorSet set,
                                                                  VkDescriptorUpdateTemplate template,
                                                                  const void *data)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_object *object;
    pthread_mutex_lock(&device->lock);
    object = find(device, (uint64_t)(uintptr_t)template, LS_ICD_UPDATE_TEMPLATE);
    for (uint32_t i = 0; object != NULL && !object->u.update_template.push && i < object->u.update_template.nentries;
         i++) {
        const char *why = apply_entry(device, (uint64_t)(uintptr_t)set, &object->u.update_template.entries[i], data);
        if (why != NULL)
            ls_icd_descriptor_skipped("vkUpdateDescriptorSetWithTemplate: entry", i, why);
    }
    if (object == NULL || object->u.update_template.push)
        ls_icd_descriptor_skipped("vkUpdateDescriptorSetWithTemplate: template", 0,
                                  "no such update template (or one of push descriptors)");
    pthread_mutex_unlock(&device->lock);
}

/* ---- push descriptors: a command buffer's pushed sets (dispatch.c), sets of no pool */

static int same_layout(const struct ls_icd_set_layout *a, const struct ls_icd_set_layout *b)
{
    if (a->nbindings != b->nbindings || a->flags != b->flags)
        return 0;
    for (uint32_t i = 0; i < a->nbindings; i++)
        if (a->bindings[i].binding != b->bindings[i].binding || a->bindings[i].type != b->bindings[i].type ||
            a->bindings[i].count != b->bindings[i].count)
            return 0;
    return 1;
}

/* The set that pushes into set ``number`` of ``pipeline_layout`` write, in ``*pushed`` (the one pushed before
 * kept while its layout is the same, so that pushes add up, else freed and made anew, none written), the lock
 * held: NULL, or why not. */
static const char *pushed_set(struct ls_icd_device *device, uint64_t *pushed, uint64_t pipeline_layout,
                              uint32_t number)
{
    struct ls_icd_object *layout = find(device, pipeline_layout, LS_ICD_PIPELINE_LAYOUT);
    struct ls_icd_object *kept = *pushed ? find(device, *pushed, LS_ICD_DESCRIPTOR_SET) : NULL;
    const struct ls_icd_set_layout *wanted;
    if (layout == NULL || number >= layout->u.pipeline_layout.nsets)
        return "no such pipeline layout, or no such set in it";
    wanted = &layout->u.pipeline_layout.sets[number]; /* (the pipeline layout's own heap copy) */
    if (!(wanted->flags & VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR))
        return "that set's layout is not of push descriptors";
    if (kept != NULL && same_layout(&kept->u.set.layout, wanted))
        return NULL;
    if (kept != NULL)
        ls_icd_set_free(device, *pushed);
    *pushed = ls_icd_set_new(device, wanted, 0);
    return *pushed ? NULL : "out of host memory";
}

const char *ls_icd_push_writes(struct ls_icd_device *device, uint64_t *pushed, uint64_t pipeline_layout,
                               uint32_t number, uint32_t nwrites, const VkWriteDescriptorSet *writes)
{
    const char *why = nwrites && writes == NULL ? "no writes" : pushed_set(device, pushed, pipeline_layout, number);
    for (uint32_t i = 0; i < nwrites && why == NULL; i++)
        why = ls_icd_descriptors_write(device, *pushed, writes[i].dstBinding, writes[i].dstArrayElement,
                                writes[i].descriptorType, writes[i].descriptorCount, writes[i].pBufferInfo,
                                writes[i].pTexelBufferView);
    return why;
}

const char *ls_icd_push_template(struct ls_icd_device *device, uint64_t *pushed, uint64_t template,
                                 uint64_t pipeline_layout, uint32_t number, const void *data)
{
    struct ls_icd_object *object = find(device, template, LS_ICD_UPDATE_TEMPLATE);
    const char *why = object == NULL || !object->u.update_template.push
                          ? "no such update template of push descriptors"
                          : pushed_set(device, pushed, pipeline_layout, number);
    for (uint32_t i = 0; why == NULL && i < object->u.update_template.nentries; i++)
        why = apply_entry(device, *pushed, &object->u.update_template.entries[i], data);
    return why;
}

void ls_icd_pushed_free(struct ls_icd_device *device, uint64_t *pushed, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++)
        if (pushed[i] && find(device, pushed[i], LS_ICD_DESCRIPTOR_SET) != NULL)
            ls_icd_set_free(device, pushed[i]);
}
