/* The calls of reattach.c (surviving an arbiter's restart, docs/icd.md "Surviving a restart") and
 * the two of queue.c around it: between control.c, device.c, queue.c and reattach.c alone. */
#ifndef LIBSHARE_ICD_REATTACH_H
#define LIBSHARE_ICD_REATTACH_H

#include "icd.h"

struct ls_icd_ledger;
/* ls_icd_ask's: file an answered request (``text``, its payload, ``reply``, ``frame``'s descriptors). */
void ls_icd_keep(struct ls_icd_device *device, const char *text, const void *payload, size_t len, const cJSON *reply,
                 const struct ls_icd_frame *frame);
/* ls_icd_forget's: the object ``id`` is freed. */
void ls_icd_unkeep(struct ls_icd_device *device, int64_t id);
/* vkDestroyDevice's: the ledger's copies and memfds freed. */
void ls_icd_ledger_free(struct ls_icd_device *device);
/* queue.c's, the device's lock held, the arbiter dead and nothing pushed unanswered: move the device to
 * the arbiter that replaced it. VK_SUCCESS, or VK_ERROR_DEVICE_LOST (the old session and ring stay). */
VkResult ls_icd_reattach(struct ls_icd_device *device);
/* queue.c's, for ls_icd_reattach (the lock held, nothing pushed in flight): the ring of ``device->session``
 * (the new arbiter's) replaces the old; the queue stays. VK_SUCCESS, or VK_ERROR_INITIALIZATION_FAILED. */
VkResult ls_icd_path_reopen(struct ls_icd_device *device);
/* queue.c's, for a submission and control.c's requests (the lock held): when the arbiter died, move the
 * device to its successor (ls_icd_reattach) with nothing in flight, else the device is lost. */
void ls_icd_path_survive(struct ls_icd_device *device);

#endif
