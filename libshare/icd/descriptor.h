/* Descriptors (descriptor.c, template.c) and buffer views (view.c): the entry points for loader.c's tables, and
 * what pipeline.c, dispatch.c and memory.c ask of them; kept out of icd.h, the driver's map, to keep
 * it one file a reader can hold. */
#ifndef LIBSHARE_ICD_DESCRIPTOR_H
#define LIBSHARE_ICD_DESCRIPTOR_H

#include "icd.h"

/* ---- descriptor.c: set layouts, pools, sets, their updates; template.c's templates among the entry points */
#define LS_ICD_MOST_DESCRIPTORS (1u << 16) /* a set layout's descriptors, at most (and maxPerSetDescriptors) */
/* A deep copy of ``from`` into ``to`` (VK_SUCCESS or VK_ERROR_OUT_OF_HOST_MEMORY, ``to`` then empty). */
VkResult ls_icd_set_layout_copy(struct ls_icd_set_layout *to, const struct ls_icd_set_layout *from);
void ls_icd_set_layout_free(struct ls_icd_set_layout *layout);
/* Free what ``object`` (a set layout, set, pool or template) holds; the lock held; the slot stays. */
void ls_icd_descriptor_object_free(struct ls_icd_object *object);
/* A set's descriptor in the arbiter's terms, for a bind group (commands.c, the lock held): the buffer's
 * memory's arbiter ``buffer_id``; ``offset`` = the buffer's offset in its memory + ``d->offset`` +
 * ``dynamic_offset`` (a dynamic descriptor's offset is applied here, at bind time: the descriptor's
 * offset plus the dynamic offset); ``range``: ``d->range`` clipped to the buffer's end from there
 * (VK_WHOLE_SIZE: to the buffer's end). LS_ICD_INVALID when the descriptor was never written, its
 * buffer or that buffer's memory is gone or unbound, or the offsets reach past the buffer. */
VkResult ls_icd_descriptor_resolve(struct ls_icd_device *device, const struct ls_icd_descriptor *d,
                                   uint32_t dynamic_offset, uint32_t *buffer_id, uint64_t *offset, uint64_t *range);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorSetLayout(VkDevice device,
                                                                const VkDescriptorSetLayoutCreateInfo *info,
                                                                const VkAllocationCallbacks *allocator,
                                                                VkDescriptorSetLayout *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorSetLayout(VkDevice device, VkDescriptorSetLayout layout,
                                                             const VkAllocationCallbacks *allocator);
VKAPI_ATTR void VKAPI_CALL ls_icd_GetDescriptorSetLayoutSupport(VkDevice device,
                                                                const VkDescriptorSetLayoutCreateInfo *info,
                                                                VkDescriptorSetLayoutSupport *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorPool(VkDevice device, const VkDescriptorPoolCreateInfo *info,
                                                           const VkAllocationCallbacks *allocator,
                                                           VkDescriptorPool *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorPool(VkDevice device, VkDescriptorPool pool,
                                                        const VkAllocationCallbacks *allocator);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetDescriptorPool(VkDevice device, VkDescriptorPool pool,
                                                          VkDescriptorPoolResetFlags flags);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_AllocateDescriptorSets(VkDevice device, const VkDescriptorSetAllocateInfo *info,
                                                             VkDescriptorSet *out);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_FreeDescriptorSets(VkDevice device, VkDescriptorPool pool, uint32_t count,
                                                         const VkDescriptorSet *sets);
VKAPI_ATTR void VKAPI_CALL ls_icd_UpdateDescriptorSets(VkDevice device, uint32_t nwrites,
                                                       const VkWriteDescriptorSet *writes, uint32_t ncopies,
                                                       const VkCopyDescriptorSet *copies);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateDescriptorUpdateTemplate(VkDevice device,
                                                                     const VkDescriptorUpdateTemplateCreateInfo *info,
                                                                     const VkAllocationCallbacks *allocator,
                                                                     VkDescriptorUpdateTemplate *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyDescriptorUpdateTemplate(VkDevice device, VkDescriptorUpdateTemplate template,
                                                                  const VkAllocationCallbacks *allocator);
VKAPI_ATTR void VKAPI_CALL ls_icd_UpdateDescriptorSetWithTemplate(VkDevice device, VkDescriptorSet set,
                                                                  VkDescriptorUpdateTemplate template,
                                                                  const void *data);

/* For template.c (the lock held): a set of a copy of ``layout`` kept by ``pool`` (0: none), its handle or 0;
 * a set freed (taken out of its pool's list); ``count`` descriptors written into a set from (binding,
 * element) on, all or none, NULL or why not (buffer infos for a buffer type, views for a texel type);
 * a skipped update named on stderr; whether a type is offered, and whether it is a texel buffer's. */
uint64_t ls_icd_set_new(struct ls_icd_device *device, const struct ls_icd_set_layout *layout, uint64_t pool);
void ls_icd_set_free(struct ls_icd_device *device, uint64_t set);
const char *ls_icd_descriptors_write(struct ls_icd_device *device, uint64_t set_handle, uint32_t binding,
                                     uint32_t element, VkDescriptorType type, uint32_t count,
                                     const VkDescriptorBufferInfo *infos, const VkBufferView *views);
void ls_icd_descriptor_skipped(const char *what, uint32_t index, const char *why);
int ls_icd_descriptor_offered(VkDescriptorType type);
int ls_icd_descriptor_texel(VkDescriptorType type);
int ls_icd_descriptor_dynamic(VkDescriptorType type); /* (for dispatch.c too: a dynamic buffer type) */

/* ---- template.c: push descriptors (VK_KHR_push_descriptor), for dispatch.c, the lock held. A command
 * buffer keeps a set of no pool per set number, ``*pushed`` (0: none yet): ls_icd_push_writes and
 * ls_icd_push_template write into it (made, or made anew when ``pipeline_layout``'s set ``number`` has
 * another layout, which must be of push descriptors) and answer NULL, or why the push is invalid
 * (``dstSet`` is ignored, as Vulkan says); ls_icd_pushed_free frees ``count`` of them. */
const char *ls_icd_push_writes(struct ls_icd_device *device, uint64_t *pushed, uint64_t pipeline_layout,
                               uint32_t number, uint32_t nwrites, const VkWriteDescriptorSet *writes);
const char *ls_icd_push_template(struct ls_icd_device *device, uint64_t *pushed, uint64_t template,
                                 uint64_t pipeline_layout, uint32_t number, const void *data);
void ls_icd_pushed_free(struct ls_icd_device *device, uint64_t *pushed, uint32_t count);

/* ---- view.c: buffer views. ls_icd_views_orphan: memory ``buffer_id`` is being freed (the lock held): its
 * views' bind groups and lists dropped, and the views forgotten, as the arbiter frees them with it.
 * ls_icd_view_wrong: why view ``handle`` cannot be a descriptor of ``type``, or NULL (the lock held). */
void ls_icd_views_orphan(struct ls_icd_device *device, int64_t buffer_id);
const char *ls_icd_view_wrong(struct ls_icd_device *device, VkDescriptorType type, uint64_t handle);
/* The arbiter's id of view ``handle``, or -1 when it is no view or its memory was freed (the lock held). */
int64_t ls_icd_view_id(struct ls_icd_device *device, uint64_t handle);
VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateBufferView(VkDevice device, const VkBufferViewCreateInfo *info,
                                                       const VkAllocationCallbacks *allocator, VkBufferView *out);
VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyBufferView(VkDevice device, VkBufferView view,
                                                    const VkAllocationCallbacks *allocator);

#endif
