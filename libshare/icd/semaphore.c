/* VkSemaphore: binary, and timeline (VK_KHR_timeline_semaphore) with the host's value, wait and signal.
 *
 * A binary semaphore orders submissions on the device's one queue, where submission order already
 * orders them: submit.c checks that a wait has a signal submitted before it (value 1) and consumes
 * it (value 0). A timeline semaphore (VkSemaphoreTypeCreateInfo, the extension enabled) has the
 * value it reached (its initial value, a host signal, or a submission's signal once that submission
 * is answered) and the largest value a queued submission promises. vkGetSemaphoreCounterValue reads
 * the answers there are, then the value; vkWaitSemaphores sleeps in queue.c's wait until all (or,
 * with VK_SEMAPHORE_WAIT_ANY_BIT, any) values are reached, VK_TIMEOUT at its timeout (an infinite
 * one that nothing queued can end answers VK_TIMEOUT at once); vkSignalSemaphore sets a value
 * greater than the one reached and pushes the submissions held for it (queue.c). A wrong handle, a
 * binary semaphore where a timeline one is needed, a value that goes back: LS_ICD_INVALID. Once the
 * device is lost, the value and the waits answer VK_ERROR_DEVICE_LOST. No external handle types. */
#include "icd.h"

static struct ls_icd_device *device_of(VkDevice handle)
{
    return (struct ls_icd_device *)handle;
}

static struct ls_icd_semaphore *timeline_of(struct ls_icd_device *device, VkSemaphore semaphore)
{
    struct ls_icd_object *object =
        ls_icd_object_find(&device->objects, (uint64_t)(uintptr_t)semaphore, LS_ICD_SEMAPHORE);
    return object && object->u.semaphore.timeline ? &object->u.semaphore : NULL;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_CreateSemaphore(VkDevice handle, const VkSemaphoreCreateInfo *info,
                                                      const VkAllocationCallbacks *allocator, VkSemaphore *out)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_semaphore made = {0};
    uint64_t semaphore;
    VkResult result;
    (void)allocator;
    if (info->flags != 0)
        return LS_ICD_INVALID;
    for (const VkBaseInStructure *next = info->pNext; next != NULL; next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO) {
            const VkSemaphoreTypeCreateInfo *type = (const VkSemaphoreTypeCreateInfo *)next;
            if (type->semaphoreType == VK_SEMAPHORE_TYPE_TIMELINE) {
                if (!(device->extensions & LS_ICD_EXT_TIMELINE))
                    return LS_ICD_INVALID; /* VK_KHR_timeline_semaphore was not enabled */
                made.timeline = 1;
                made.value = made.promised = type->initialValue;
            } else if (type->semaphoreType != VK_SEMAPHORE_TYPE_BINARY) {
                return LS_ICD_INVALID;
            }
        } else if (next->sType == VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO) {
            return LS_ICD_INVALID; /* no external handle type is offered */
        }
    }
    result = ls_icd_object_create(device, LS_ICD_SEMAPHORE, &made, sizeof(made), &semaphore);
    if (result == VK_SUCCESS)
        *out = (VkSemaphore)(uintptr_t)semaphore;
    return result;
}

VKAPI_ATTR void VKAPI_CALL ls_icd_DestroySemaphore(VkDevice handle, VkSemaphore semaphore,
                                                   const VkAllocationCallbacks *allocator)
{
    (void)allocator;
    ls_icd_object_destroy(device_of(handle), (uint64_t)(uintptr_t)semaphore, LS_ICD_SEMAPHORE);
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_GetSemaphoreCounterValue(VkDevice handle, VkSemaphore semaphore, uint64_t *value)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_semaphore *found;
    VkResult result = VK_SUCCESS;
    pthread_mutex_lock(&device->lock);
    if (ls_icd_path_poll(device))
        result = VK_ERROR_DEVICE_LOST;
    else if ((found = timeline_of(device, semaphore)) == NULL)
        result = LS_ICD_INVALID;
    else
        *value = found->value;
    pthread_mutex_unlock(&device->lock);
    return result;
}

/* The wait's condition: VK_SUCCESS when all (or any) values are reached. */
static VkResult reached(struct ls_icd_device *device, const void *arg)
{
    const VkSemaphoreWaitInfo *info = arg;
    uint32_t count = 0;
    for (uint32_t i = 0; i < info->semaphoreCount; i++) {
        struct ls_icd_semaphore *found = timeline_of(device, info->pSemaphores[i]);
        if (found == NULL)
            return LS_ICD_INVALID;
        count += found->value >= info->pValues[i];
    }
    if (info->flags & VK_SEMAPHORE_WAIT_ANY_BIT)
        return count > 0 ? VK_SUCCESS : VK_NOT_READY;
    return count == info->semaphoreCount ? VK_SUCCESS : VK_NOT_READY;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_WaitSemaphores(VkDevice handle, const VkSemaphoreWaitInfo *info,
                                                     uint64_t timeout)
{
    struct ls_icd_device *device = device_of(handle);
    VkResult result;
    if (info == NULL || info->semaphoreCount == 0 || info->pSemaphores == NULL || info->pValues == NULL)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    result = ls_icd_path_wait(device, timeout, reached, info);
    pthread_mutex_unlock(&device->lock);
    return result;
}

VKAPI_ATTR VkResult VKAPI_CALL ls_icd_SignalSemaphore(VkDevice handle, const VkSemaphoreSignalInfo *info)
{
    struct ls_icd_device *device = device_of(handle);
    struct ls_icd_semaphore *found;
    VkResult result = VK_SUCCESS;
    if (info == NULL)
        return LS_ICD_INVALID;
    pthread_mutex_lock(&device->lock);
    if (ls_icd_path_poll(device))
        result = VK_ERROR_DEVICE_LOST;
    else if ((found = timeline_of(device, info->semaphore)) == NULL || info->value <= found->value)
        result = LS_ICD_INVALID;
    else {
        found->value = info->value;
        if (found->promised < info->value)
            found->promised = info->value;
        ls_icd_path_release(device); /* the submissions held for it */
    }
    pthread_mutex_unlock(&device->lock);
    return result;
}
