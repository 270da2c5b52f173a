/* VkFence, and vkQueueSubmit as far as it goes before command buffers exist.
 *
 * A fence is a flag: made signaled or not, reset by vkResetFences, set by a submission. With no
 * command buffers yet, the only submission is an empty one (no VkSubmitInfo), which signals its
 * fence at once; any other is VK_ERROR_FEATURE_NOT_PRESENT. So no work is ever pending: a wait
 * on fences that are signaled succeeds, and one on a fence nothing will signal can only end at
 * its timeout, which the driver answers at once with VK_TIMEOUT rather than sleep to it (an
 * infinite one would never return). A wrong fence handle is LS_ICD_INVALID (VK_ERROR_UNKNOWN),
 * with no fence reset or signaled. */
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
    struct ls_icd_device *device = device_of(handle);
    uint64_t made;
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    made = ls_icd_object_new(&device->objects, LS_ICD_FENCE);
    if (made)
        fence_of(device, (VkFence)(uintptr_t)made)->signaled = (info->flags & VK_FENCE_CREATE_SIGNALED_BIT) != 0;
    pthread_mutex_unlock(&device->lock);
    if (!made)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    *out = (VkFence)(uintptr_t)made;
    return VK_SUCCESS;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroyFence(VkDevice handle, VkFence fence, const VkAllocationCallbacks *allocator)
{
    struct ls_icd_device *device = device_of(handle);
    (void)allocator;
    pthread_mutex_lock(&device->lock);
    if (fence_of(device, fence) != NULL)
        ls_icd_object_drop(&device->objects, (uint64_t)(uintptr_t)fence);
    pthread_mutex_unlock(&device->lock);
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
    result = all_exist(device, count, fences);
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++)
        fence_of(device, fences[i])->signaled = 0;
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetFenceStatus(VkDevice handle, VkFence fence)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_fence *found;
    VkResult result;
    pthread_mutex_lock(&device->lock);
    found = fence_of(device, fence);
    result = found == NULL ? LS_ICD_INVALID : found->signaled ? VK_SUCCESS : VK_NOT_READY;
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_WaitForFences(VkDevice handle, uint32_t count, const VkFence *fences,
                                                    VkBool32 all, uint64_t timeout)
{
    struct ls_icd_device *device = device_of(handle);
    uint32_t signaled = 0;
    VkResult result;
    (void)timeout; /* nothing is pending: waiting longer changes nothing */
    pthread_mutex_lock(&device->lock);
    result = all_exist(device, count, fences);
    for (uint32_t i = 0; result == VK_SUCCESS && i < count; i++)
        signaled += (uint32_t)fence_of(device, fences[i])->signaled;
    pthread_mutex_unlock(&device->lock);
    if (result != VK_SUCCESS)
        return result;
    return (all ? signaled == count : signaled > 0) ? VK_SUCCESS : VK_TIMEOUT;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_QueueSubmit(VkQueue queue, uint32_t count, const VkSubmitInfo *submits,
                                                  VkFence fence)
{
    struct ls_icd_device *device = ((struct ls_icd_queue *)queue)->device;
    struct ls_icd_fence *found;
    VkResult result = VK_SUCCESS;
    (void)submits;
    if (count > 0)
        return VK_ERROR_FEATURE_NOT_PRESENT; /* command buffers are the next slice */
    if (fence == VK_NULL_HANDLE)
        return VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    found = fence_of(device, fence);
    if (found == NULL)
        result = LS_ICD_INVALID;
    else
        found->signaled = 1; /* the empty submission is done at once */
    pthread_mutex_unlock(&device->lock);
    return result;
}
