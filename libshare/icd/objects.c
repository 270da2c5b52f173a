/* A device's table of non-dispatchable handles: its memory, buffers, fences, semaphores, events and
 * compute objects.
 *
 * An application hands handles back as 64-bit numbers, and any number may come (a stale handle, a
 * handle of another kind or device, garbage): the driver never follows one. A handle is
 * (generation << 32 | kind << 24 | slot); ls_icd_object_find answers the slot only when the slot
 * exists, holds an object of that kind, and the generation matches (each reuse of a slot bumps it,
 * so a destroyed object's handle stays wrong). The table grows by doubling up to
 * LS_ICD_MOST_OBJECTS; a pointer into it lasts until the next ls_icd_object_new. The device's
 * lock is held around every call; ls_icd_object_create and ls_icd_object_destroy(_with), the shape of
 * the create and destroy commands (buffers, fences, semaphores, events, shader modules, pipeline caches,
 * command pools; the destroys of pipelines and their layouts and of query pools, whose release frees
 * what the object holds, under the lock, before its slot is dropped), take it. ls_icd_host_alloc and
 * ls_icd_host_free are the host memory of the instance and device structures: the application's
 * allocator when it gave one, else the C library's (docs/icd.md, "Host memory"). */
#include <stdlib.h>
#include <string.h>

#include "icd.h"

static uint64_t handle_of(const struct ls_icd_objects *objects, uint32_t slot)
{
    const struct ls_icd_object *object = &objects->slots[slot];
    return (uint64_t)object->generation << 32 | (uint64_t)object->kind << 24 | slot;
}

/* A new object of ``kind``, zeroed; its handle, or 0 when the table is full or memory is out. */
uint64_t ls_icd_object_new(struct ls_icd_objects *objects, uint32_t kind)
{
    uint32_t slot = 0;
    while (slot < objects->used && objects->slots[slot].kind != LS_ICD_FREE)
        slot++;
    if (slot == objects->capacity) {
        uint32_t capacity = objects->capacity ? objects->capacity * 2 : 64;
        struct ls_icd_object *grown;
        if (capacity > LS_ICD_MOST_OBJECTS)
            return 0;
        grown = realloc(objects->slots, (size_t)capacity * sizeof(*grown));
        if (grown == NULL)
            return 0;
        memset(grown + objects->capacity, 0, (size_t)(capacity - objects->capacity) * sizeof(*grown));
        objects->slots = grown;
        objects->capacity = capacity;
    }
    if (slot == objects->used)
        objects->used++;
    uint32_t generation = objects->slots[slot].generation + 1;
    memset(&objects->slots[slot], 0, sizeof(objects->slots[slot]));
    objects->slots[slot].kind = kind;
    objects->slots[slot].generation = generation ? generation : 1; /* never 0: a handle is never 0 */
    return handle_of(objects, slot);
}

struct ls_icd_object *ls_icd_object_find(struct ls_icd_objects *objects, uint64_t handle, uint32_t kind)
{
    uint32_t slot = (uint32_t)(handle & 0xFFFFFF);
    if (handle == 0 || slot >= objects->used || objects->slots[slot].kind != kind ||
        handle_of(objects, slot) != handle)
        return NULL;
    return &objects->slots[slot];
}

void ls_icd_object_drop(struct ls_icd_objects *objects, uint64_t handle)
{
    uint32_t slot = (uint32_t)(handle & 0xFFFFFF);
    if (slot < objects->used && objects->slots[slot].kind != LS_ICD_FREE && handle_of(objects, slot) == handle)
        objects->slots[slot].kind = LS_ICD_FREE; /* the generation stays: the next one bumps it */
}

void *ls_icd_host_alloc(const VkAllocationCallbacks *allocator, size_t size, VkSystemAllocationScope scope)
{
    void *memory = allocator ? allocator->pfnAllocation(allocator->pUserData, size, 16, scope) : malloc(size);
    if (memory != NULL)
        memset(memory, 0, size);
    return memory;
}

void ls_icd_host_free(const VkAllocationCallbacks *allocator, void *memory)
{
    if (allocator)
        allocator->pfnFree(allocator->pUserData, memory);
    else
        free(memory);
}

void ls_icd_objects_free(struct ls_icd_objects *objects)
{
    free(objects->slots);
    memset(objects, 0, sizeof(*objects));
}

VkResult ls_icd_object_create(struct ls_icd_device *device, uint32_t kind, const void *init, size_t size,
                              uint64_t *out)
{
    uint64_t made;
    pthread_mutex_lock(&device->lock);
    made = ls_icd_object_new(&device->objects, kind);
    if (made && init != NULL)
        memcpy(&ls_icd_object_find(&device->objects, made, kind)->u, init, size);
    pthread_mutex_unlock(&device->lock);
    if (!made)
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    *out = made;
    return VK_SUCCESS;
}

int ls_icd_object_destroy_with(struct ls_icd_device *device, uint64_t handle, uint32_t kind,
                               void (*release)(struct ls_icd_device *device, struct ls_icd_object *object))
{
    struct ls_icd_object *object;
    pthread_mutex_lock(&device->lock);
    object = ls_icd_object_find(&device->objects, handle, kind);
    if (object != NULL) {
        if (release != NULL)
            release(device, object);
        ls_icd_object_drop(&device->objects, handle);
    }
    pthread_mutex_unlock(&device->lock);
    return object != NULL;
}

int ls_icd_object_destroy(struct ls_icd_device *device, uint64_t handle, uint32_t kind)
{
    return ls_icd_object_destroy_with(device, handle, kind, NULL);
}
