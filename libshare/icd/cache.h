/* cache.c's: the device's bind groups and command lists, shared by content across its recordings.
 * Every function is called with the device's lock held. */
#ifndef LIBSHARE_ICD_CACHE_H
#define LIBSHARE_ICD_CACHE_H

#include "icd.h"
#include "ring.h"

struct ls_icd_cached; /* a bind group or a list the arbiter holds for the device; its id below */

int64_t ls_icd_cached_id(const struct ls_icd_cached *cached);

/* The bind group of program ``program`` over ``n`` entries ([buffer_id, offset, range] each): one made
 * before over the same, or made now ({"op":"bind_group"}); held once more for the caller, who gives it
 * back with ls_icd_cache_release. VK_SUCCESS, or the arbiter's refusal (``*out`` untouched). */
VkResult ls_icd_cache_group(struct ls_icd_device *device, int64_t program, const uint64_t *entries, uint32_t n,
                            struct ls_icd_cached **out);
/* The same for a command list of ``n`` descriptors ({"op":"load_list"}). */
VkResult ls_icd_cache_list(struct ls_icd_device *device, const struct ls_desc *commands, uint32_t n,
                           struct ls_icd_cached **out);
/* ``cached`` held once more (a primary inlining a secondary's groups); given back once. */
void ls_icd_cache_hold(struct ls_icd_cached *cached);
void ls_icd_cache_release(struct ls_icd_device *device, struct ls_icd_cached *cached);
/* vkFreeMemory and vkDestroyPipeline: the groups and lists naming arbiter buffer ``buffer_id`` (or
 * program ``program_id``), and the lists naming those groups, can never be asked for again; those
 * idle are freed now, those held when given back. */
void ls_icd_cache_drop_buffer(struct ls_icd_device *device, int64_t buffer_id);
void ls_icd_cache_drop_program(struct ls_icd_device *device, int64_t program_id);
/* vkDestroyDevice (its session closed: the arbiter freed everything with it): the host memory freed. */
void ls_icd_cache_free(struct ls_icd_device *device);

#endif
