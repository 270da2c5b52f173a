/* VkFence and VkEvent: the host's side of them.
 *
 * A fence is a flag: made signaled or not, reset by vkResetFences, set when the submission it came
 * with is wholly answered (queue.c retires it). Submitted (submit.c), it is pending until then: a
 * pending fence submitted again or reset is LS_ICD_INVALID; a signaled one submitted is reset by
 * its submission (Vulkan forbids it; lavapipe takes it). A
 * status query reads the answers there are first (without sleeping); vkWaitForFences sleeps in
 * queue.c's wait (on the ring while work is pending) up to its timeout, VK_TIMEOUT then; an infinite
 * wait on a fence nothing queued will signal answers VK_TIMEOUT at once rather than never return.
 * Once the device is lost (queue.c), the status and the waits answer VK_ERROR_DEVICE_LOST. A wrong
 * fence handle is LS_ICD_INVALID (VK_ERROR_UNKNOWN), with no fence reset or signaled.
 *
 * An event is a flag the host sets and resets (vkSetEvent, vkResetEvent) and reads
 * (vkGetEventStatus: VK_EVENT_SET or VK_EVENT_RESET); commands.c's vkCmdSetEvent and vkCmdResetEvent
 * change it through ls_icd_event_set once their submission is answered. */
#include "icd.h"

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_fence *fence_of(struct ls_icd_device *device, VkFence fence)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)fence, LS_ICD_FENCE);
    return object ? &object->u.fence : NULL;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateFence(VkDevice handle, const VkFenceCreateInfo *info,
                                                  const VkAllocationCallbacks *allocator, VkFence *out)
{
    struct ls_icd_fence made = {.signaled = (info->flags & VK_FENCE_CREATE_SIGNALED_BIT) != 0};
    uint64_t fence;
    VkResult result = ls_icd_object_create(device_of(handle), LS_ICD_FENCE, &made, sizeof(made), &fence);
    (void)allocator;
    if (result == VK_SUCCESS)
        *out = (VkFence)(uintptr_t)fence;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyFence(VkDevice handle, VkFence fence, const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy(device_of(handle), (uint64_t)(uintptr_t)fence, LS_ICD_FENCE);
}

/* Every one of ``fences`` exists: VK_SUCCESS, else LS_ICD_INVALID (the device's lock held). */
static VkResult all_exist(struct ls_icd_device *device, uint32_t count, const VkFence *fences)
{
    for (uint32_t i = 0; i < count; i++)
        if (fence_of(device, fences[i]) == NULL)
            return LS_ICD_INVALID;
    return VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetFences(VkDevice handle, uint32_t count, const VkFence *fences)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result;
    pthread_mutex_lock(&device->lock);
    ls_icd_path_poll(device);
    result = all_exist(device, count, fences);
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++)
        if (fence_of(device, fences[i])->pending)
            result = LS_ICD_INVALID; /* a submission still holds it */
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++)
        fence_of(device, fences[i])->signaled = 0;
    pthread_mutex_unlock(&device->lock);
    return result;
}

struct fences {
    uint32_t count;
    const VkFence *fences;
    VkBool32 all;
};

/* The wait's condition: VK_SUCCESS when all (or any) are signaled. */
static VkResult signaled(struct ls_icd_device *device, const void *arg)
{
    const struct fences *wait = arg;
    uint32_t count = 0;
    VkResult result = all_exist(device, wait->count, wait->fences);
    if (result != VK_SUCCESS)
        return result;
    for (uint32_t i = 0; i < wait->count; i++)
        count += (uint32_t)fence_of(device, wait->fences[i])->signaled;
    return (wait->all ? count == wait->count : count > 0) ? VK_SUCCESS : VK_NOT_READY;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetFenceStatus(VkDevice handle, VkFence fence)
{
    struct fences wait = {1, &fence, VK_TRUE};
    struct ls_icd_device *device = device_of(handle);
    VkResult result;
    pthread_mutex_lock(&device->lock);
    result = ls_icd_path_wait(device, 0, signaled, &wait);
    pthread_mutex_unlock(&device->lock);
    return result == VK_TIMEOUT ? VK_NOT_READY : result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_WaitForFences(VkDevice handle, uint32_t count, const VkFence *fences,
                                                    VkBool32 all, uint64_t timeout)
{
    struct fences wait = {count, fences, all};
    struct ls_icd_device *device = device_of(handle);
    VkResult result;
    if (count == 0 || fences == NULL)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    result = ls_icd_path_wait(device, timeout, signaled, &wait);
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* ---- events */

static struct ls_icd_event *event_of(struct ls_icd_device *device, VkEvent event)
{
    struct ls_icd_object *object = ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)event, LS_ICD_EVENT);
    return object ? &object->u.event : NULL;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateEvent(VkDevice handle, const VkEventCreateInfo *info,
                                                  const VkAllocationCallbacks *allocator, VkEvent *out)
{
    uint64_t event;
    VkResult result;
    (void)allocator;
    if (info->flags & ~(VkEventCreateFlags)VK_EVENT_CREATE_DEVICE_ONLY_BIT)
        return LS_ICD_INVALID;
    result = ls_icd_object_create(device_of(handle), LS_ICD_EVENT, NULL, 0, &event);
    if (result == VK_SUCCESS)
        *out = (VkEvent)(uintptr_t)event;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyEvent(VkDevice handle, VkEvent event, const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy(device_of(handle), (uint64_t)(uintptr_t)event, LS_ICD_EVENT);
}

void ls_icd_event_set(struct ls_icd_device *device, uint64_t handle, int value)
{
    struct ls_icd_event *event = event_of(device, (VkEvent)(uintptr_t)handle);
    if (event != NULL)
        event->set = value != 0;
}

/* Read (``value`` < 0) or change an event: VK_EVENT_SET/VK_EVENT_RESET, VK_SUCCESS, or LS_ICD_INVALID. */
static VkResult event_do(VkDevice handle, VkEvent event, int value)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_event *found;
    VkResult result = VK_SUCCESS;
    int lost;
    pthread_mutex_lock(&device->lock);
    lost = value < 0 && ls_icd_path_poll(device); /* answered submissions set theirs */
    found = event_of(device, event);
    if (found == NULL)
        result = LS_ICD_INVALID;
    else if (lost)
        result = VK_ERROR_DEVICE_LOST;
    else if (value < 0)
        result = found->set ? VK_EVENT_SET : VK_EVENT_RESET;
    else
        found->set = value;
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetEventStatus(VkDevice device, VkEvent event)
{
    return event_do(device, event, -1);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_SetEvent(VkDevice device, VkEvent event)
{
    return event_do(device, event, 1);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_ResetEvent(VkDevice device, VkEvent event)
{
    return event_do(device, event, 0);
}
