/* vkQueueSubmit and vkQueueSubmit2KHR: each submission read, checked and handed to queue.c.
 *
 * Both read a submission into one shape (its semaphore waits and signals as (handle, value), its
 * command buffers) and submit it the same way, in order, the device's lock held. The fence comes
 * first: it must exist and not wait on a submission already (a signaled one is reset); it goes
 * with the last submission (with none, an empty one that pushes a LS_OP_NOP so that it signals
 * behind the earlier
 * work). Each submission is checked before anything of it is kept: every semaphore exists; a
 * binary wait needs a signal submitted before it (submission order on the one queue orders them;
 * one that nothing signals is invalid usage) and consumes it; a binary signal needs the semaphore
 * unsignaled; a timeline one needs its values (VkTimelineSemaphoreSubmitInfo's, one a semaphore,
 * or VkSemaphoreSubmitInfo's), a signal greater than what is reached and promised. A timeline wait
 * the value of which is reached already is dropped; the rest may hold the submission (queue.c).
 * Then each command buffer is found among the device's (ls_icd_command_buffer_find: a pointer that
 * is not one is never followed) and taken (ls_icd_command_buffer_take, commands.c: executable, not
 * pending without SIMULTANEOUS_USE); one that cannot be hands back those taken. Any of these wrong
 * is LS_ICD_INVALID with the submission not queued (those before it in the call are); protected
 * submissions are refused the same way (no protected queue exists). */
#include <stdlib.h>
#include <string.h>

#include "icd.h"

/* One submission as both commands give it. */
struct request {
    const VkSemaphore *wait_handles;     /* vkQueueSubmit's */
    const uint64_t *wait_values;         /* NULL: none given */
    uint32_t nwaits, nwait_values;
    const VkSemaphore *signal_handles;
    const uint64_t *signal_values;
    uint32_t nsignals, nsignal_values;
    const VkSemaphoreSubmitInfo *wait_infos;   /* vkQueueSubmit2's */
    const VkSemaphoreSubmitInfo *signal_infos;
    const VkCommandBuffer *cbs;
    const VkCommandBufferSubmitInfo *cb_infos;
    uint32_t ncbs;
};

static void nth_wait(const struct request *r, uint32_t i, uint64_t *handle, uint64_t *value)
{
    *handle = r->wait_infos ? (uint64_t)(uintptr_t)r->wait_infos[i].semaphore : (uint64_t)(uintptr_t)r->wait_handles[i];
    *value = r->wait_infos ? r->wait_infos[i].value : i < r->nwait_values && r->wait_values ? r->wait_values[i] : 0;
}

static void nth_signal(const struct request *r, uint32_t i, uint64_t *handle, uint64_t *value)
{
    *handle = r->signal_infos ? (uint64_t)(uintptr_t)r->signal_infos[i].semaphore
                              : (uint64_t)(uintptr_t)r->signal_handles[i];
    *value = r->signal_infos ? r->signal_infos[i].value
                             : i < r->nsignal_values && r->signal_values ? r->signal_values[i] : 0;
}

static struct ls_icd_semaphore *semaphore_of(struct ls_icd_device *device, uint64_t handle)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, handle, LS_ICD_SEMAPHORE);
    return object ? &object->u.semaphore : NULL;
}

/* 1 when ``r`` waits on ``handle`` (a binary semaphore it may then signal again). */
static int waited_here(const struct request *r, uint64_t handle)
{
    uint64_t other, value;
    for (uint32_t i = 0; i < r->nwaits; i++) {
        nth_wait(r, i, &other, &value);
        if (other == handle)
            return 1;
    }
    return 0;
}

/* The semaphores of ``r`` checked (nothing changed): VK_SUCCESS or LS_ICD_INVALID. */
static VkResult check_semaphores(struct ls_icd_device *device, const struct request *r)
{
    uint64_t handle, value;
    if (!r->wait_infos && r->wait_values && r->nwait_values != r->nwaits)
        return LS_ICD_INVALID;
    if (!r->signal_infos && r->signal_values && r->nsignal_values != r->nsignals)
        return LS_ICD_INVALID;
    for (uint32_t i = 0; i < r->nwaits; i++) {
        struct ls_icd_semaphore *semaphore;
        nth_wait(r, i, &handle, &value);
        semaphore = semaphore_of(device, handle);
        if (semaphore == NULL || (semaphore->timeline && !r->wait_infos && !r->wait_values))
            return LS_ICD_INVALID;
        if (!semaphore->timeline && semaphore->value == 0) /* nothing submitted signals it */
            return LS_ICD_INVALID;
        for (uint32_t j = 0; j < i && !semaphore->timeline; j++) { /* a binary one waited twice */
            uint64_t other, ignored;
            nth_wait(r, j, &other, &ignored);
            if (other == handle)
                return LS_ICD_INVALID;
        }
    }
    for (uint32_t i = 0; i < r->nsignals; i++) {
        struct ls_icd_semaphore *semaphore;
        nth_signal(r, i, &handle, &value);
        semaphore = semaphore_of(device, handle);
        if (semaphore == NULL || (semaphore->timeline && !r->signal_infos && !r->signal_values))
            return LS_ICD_INVALID;
        if (semaphore->timeline ? value <= semaphore->value || value <= semaphore->promised
                                : semaphore->value != 0 && !waited_here(r, handle))
            return LS_ICD_INVALID;
    }
    return VK_SUCCESS;
}

/* ``r``'s semaphores, checked, as a submission's: binary waits consumed, binary signals set,
 * timeline waits not reached kept, timeline signals kept. VK_SUCCESS or VK_ERROR_OUT_OF_HOST_MEMORY. */
static VkResult take_semaphores(struct ls_icd_device *device, const struct request *r, struct ls_icd_submission *s)
{
    uint64_t handle, value;
    s->waits = r->nwaits ? calloc(r->nwaits, sizeof(*s->waits)) : NULL;
    s->signals = r->nsignals ? calloc(r->nsignals, sizeof(*s->signals)) : NULL;
    if ((r->nwaits && s->waits == NULL) || (r->nsignals && s->signals == NULL))
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < r->nwaits; i++) {
        struct ls_icd_semaphore *semaphore;
        nth_wait(r, i, &handle, &value);
        semaphore = semaphore_of(device, handle);
        if (!semaphore->timeline)
            semaphore->value = 0;
        else if (value > semaphore->value)
            s->waits[s->nwaits++] = (struct ls_icd_signal){handle, value};
    }
    for (uint32_t i = 0; i < r->nsignals; i++) {
        struct ls_icd_semaphore *semaphore;
        nth_signal(r, i, &handle, &value);
        semaphore = semaphore_of(device, handle);
        if (!semaphore->timeline)
            semaphore->value = 1; /* signaled as far as later submissions go: they run after it */
        s->signals[s->nsignals++] = (struct ls_icd_signal){handle, semaphore->timeline ? value : 0};
    }
    return VK_SUCCESS;
}

/* ``r``'s command buffers taken (commands.c): VK_SUCCESS, else every one taken handed back. */
static VkResult take_command_buffers(struct ls_icd_device *device, const struct request *r,
                                     struct ls_icd_submission *s)
{
    s->cbs = r->ncbs ? calloc(r->ncbs, sizeof(*s->cbs)) : NULL;
    if (r->ncbs && s->cbs == NULL)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < r->ncbs; i++) {
        struct ls_icd_command_buffer *cb = ls_icd_command_buffer_find(
            device, r->cb_infos ? (const void *)r->cb_infos[i].commandBuffer : (const void *)r->cbs[i]);
        VkResult result = cb == NULL ? LS_ICD_INVALID /* not one of the device's: never followed */
                                     : ls_icd_command_buffer_take(cb, &s->cbs[i].lists, &s->cbs[i].nlists);
        if (result != VK_SUCCESS) {
            for (uint32_t j = 0; j < i; j++)
                ls_icd_command_buffer_done(s->cbs[j].cb);
            return result;
        }
        s->cbs[i].cb = cb;
        s->ncbs = i + 1;
    }
    return VK_SUCCESS;
}

static void drop(struct ls_icd_submission *s)
{
    free(s->cbs);
    free(s->waits);
    free(s->signals);
}

/* One submission (the device's lock held), with ``fence`` (0: none) when it is the last. */
static VkResult submit_one(struct ls_icd_device *device, const struct request *r, uint64_t fence)
{
    struct ls_icd_submission s;
    struct ls_icd_object *found;
    VkResult result;
    memset(&s, 0, sizeof(s));
    if (r->ncbs == 0 && r->nsignals == 0 && r->nwaits == 0 && fence == 0)
        return VK_SUCCESS; /* nothing to do or to signal */
    result = check_semaphores(device, r);
    if (result == VK_SUCCESS)
        result = take_command_buffers(device, r, &s);
    if (result == VK_SUCCESS)
        result = take_semaphores(device, r, &s);
    if (result != VK_SUCCESS) {
        drop(&s);
        return result;
    }
    if (r->ncbs == 0 && r->nsignals == 0 && fence == 0) { /* binary waits alone: consumed, nothing to push */
        drop(&s);
        return VK_SUCCESS;
    }
    s.fence = fence;
    result = ls_icd_path_submit(device, &s);
    if (result != VK_SUCCESS)
        return result; /* (queue.c handed its command buffers back) */
    found = ls_icd_object_find(&device->objects, fence, LS_ICD_FENCE);
    if (found != NULL) {
        found->u.fence.signaled = 0;
        found->u.fence.pending = 1;
    }
    return VK_SUCCESS;
}

/* ``fence`` may be submitted: 0 (none) or a fence not pending (a signaled one is reset by its submission:
 * Vulkan forbids submitting it, lavapipe takes it, and its meaning is plain). */
static VkResult check_fence(struct ls_icd_device *device, VkFence fence)
{
    struct ls_icd_object *found;
    if (fence == VK_NULL_HANDLE)
        return VK_SUCCESS;
    found = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)fence, LS_ICD_FENCE);
    return found == NULL || found->u.fence.pending ? LS_ICD_INVALID : VK_SUCCESS;
}

static VkResult read_submit(const VkSubmitInfo *info, struct request *r)
{
    memset(r, 0, sizeof(*r));
    r->wait_handles = info->pWaitSemaphores;
    r->nwaits = info->waitSemaphoreCount;
    r->signal_handles = info->pSignalSemaphores;
    r->nsignals = info->signalSemaphoreCount;
    r->cbs = info->pCommandBuffers;
    r->ncbs = info->commandBufferCount;
    for (const VkBaseInStructure *next = info->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO) {
            const VkTimelineSemaphoreSubmitInfo *values = (const VkTimelineSemaphoreSubmitInfo *)next;
            r->wait_values = values->pWaitSemaphoreValues;
            r->nwait_values = values->waitSemaphoreValueCount;
            r->signal_values = values->pSignalSemaphoreValues;
            r->nsignal_values = values->signalSemaphoreValueCount;
        } else if (next->sType == VK_STRUCTURE_TYPE_PROTECTED_SUBMIT_INFO &&
                   ((const VkProtectedSubmitInfo *)next)->protectedSubmit) {
            return LS_ICD_INVALID;
        }
    }
    return VK_SUCCESS;
}

static void read_submit2(const VkSubmitInfo2 *info, struct request *r)
{
    memset(r, 0, sizeof(*r));
    r->wait_infos = info->pWaitSemaphoreInfos;
    r->nwaits = info->waitSemaphoreInfoCount;
    r->signal_infos = info->pSignalSemaphoreInfos;
    r->nsignals = info->signalSemaphoreInfoCount;
    r->cb_infos = info->pCommandBufferInfos;
    r->ncbs = info->commandBufferInfoCount;
}

/* The submissions of either command (``submits`` or ``submits2``), in order, the last with the fence. */
static VkResult submit_all(struct ls_icd_queue *queue, uint32_t count, const VkSubmitInfo *submits,
                           const VkSubmitInfo2 *submits2, VkFence fence)
{
    struct ls_icd_device *device = queue->device;
    uint64_t fence_handle = (uint64_t)(uintptr_t)fence;
    struct request empty = {0};
    VkResult result;
    pthread_mutex_lock(&device->lock);
    result = ls_icd_path_poll(device) ? VK_ERROR_DEVICE_LOST : check_fence(device, fence);
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++) {
        struct request r;
        if (submits2 != NULL) {
            read_submit2(&submits2[i], &r);
            result = submits2[i].flags & VK_SUBMIT_PROTECTED_BIT ? LS_ICD_INVALID : VK_SUCCESS;
        } else {
            result = read_submit(&submits[i], &r);
        }
        if (result == VK_SUCCESS)
            result = submit_one(device, &r, i + 1 == count ? fence_handle : 0);
    }
    if (result == VK_SUCCESS && count == 0 && fence_handle != 0)
        result = submit_one(device, &empty, fence_handle);
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                                  VkFence fence)
{
    if (count > 0 && submits == NULL)
        return LS_ICD_INVALID;
    return submit_all((struct ls_icd_queue *)queue, count, submits, NULL, fence);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueSubmit2(VkQueue queue, uint32_t count, const VkSubmitInfo2 *submits,
                                                   VkFence fence)
{
    if (count > 0 && submits == NULL)
        return LS_ICD_INVALID;
    return submit_all((struct ls_icd_queue *)queue, count, NULL, submits, fence);
}
