"""An unmodified Vulkan program on the ``vulkan`` bindings: a device, its queue, memory and buffers.

``python _memory.py MODE`` prints one JSON line of what Vulkan answered (an error by its class name):

- ``honest``: creates a device and gets its queue; allocates host-visible memory, maps it (saying what
  /proc/self/maps shows there), writes a pattern, unmaps, maps again and reads it back; binds two buffers side by side in it (their
  requirements, then vkBindBufferMemory and vkBindBufferMemory2); a device-local allocation; fences
  (made signaled or not, reset, waited, signaled by an empty submission); idle waits.
- ``limit SIZE``: allocates SIZE bytes of host-visible memory twice, as long as it is given any.
- ``churn SIZE``: allocates SIZE bytes and frees them, 200 times; then 100 allocations of one page
  freed one after the other, and SIZE once more (each allocation's outcome, counted).
- ``hostile``: wrong handles, a buffer bound past its memory or bound twice, memory mapped twice (the same pages) or not
  host-visible, memory freed while a buffer is bound to it; then an honest allocation still works.
- ``hold``: creates a device, prints ``device``, destroys it when a line comes on stdin, prints
  ``destroyed``, and keeps its instance until stdin closes.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import vulkan as vk

HOST_VISIBLE = 0x2
WHOLE_SIZE = (1 << 64) - 1  # VK_WHOLE_SIZE (the bindings spell it -1)


def outcome(call, *args):
    """What ``call(*args)`` answered: "ok" (or its value), or its error's class name."""
    try:
        value = call(*args)
    except (vk.VkError, vk.VkException) as exc:  # errors, and VkNotReady, VkTimeout
        return type(exc).__name__
    return "ok" if value is None else value


def open_device(*extensions: str):
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
        queueCreateInfoCount=1, pQueueCreateInfos=[queue], enabledExtensionCount=len(extensions),
        ppEnabledExtensionNames=list(extensions) or None), None)
    types = vk.vkGetPhysicalDeviceMemoryProperties(physical).memoryTypes
    host = next(i for i in range(2) if types[i].propertyFlags & HOST_VISIBLE)
    return instance, device, host


def allocate(device, size, kind):
    return vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(allocationSize=size, memoryTypeIndex=kind), None)


def mapping_of(address: int) -> str:
    """What /proc/self/maps says is mapped at ``address`` (its path, or "" for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    return "unmapped"


def make_buffer(device, size):
    return vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                                           sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)


def honest() -> dict:
    instance, device, host = open_device()
    seen = {"queue": vk.vkGetDeviceQueue(device, 0, 0) is not None}
    size = 1 << 20
    memory = allocate(device, size, host)
    pattern = bytes((i * 7) % 251 for i in range(size))
    mapped = vk.vkMapMemory(device, memory, 0, size, 0)
    mapped[:size] = pattern
    seen["mapping"] = mapping_of(int(vk.ffi.cast("uintptr_t", vk.ffi.from_buffer(mapped))))
    vk.vkFlushMappedMemoryRanges(device, 1, [vk.VkMappedMemoryRange(memory=memory, offset=0, size=size)])
    vk.vkUnmapMemory(device, memory)
    again = vk.vkMapMemory(device, memory, 4096, size - 4096, 0)
    vk.vkInvalidateMappedMemoryRanges(device, 1, [vk.VkMappedMemoryRange(memory=memory, offset=0,
                                                                           size=WHOLE_SIZE)])
    seen["read_back"] = bytes(again[:size - 4096]) == pattern[4096:]
    vk.vkUnmapMemory(device, memory)
    first, second = make_buffer(device, 1000), make_buffer(device, 4096)
    needs = vk.vkGetBufferMemoryRequirements(device, first)
    seen["requirements"] = [needs.size, needs.alignment, needs.memoryTypeBits]
    vk.vkBindBufferMemory(device, first, memory, 0)
    vk.vkBindBufferMemory2(device, 1, [vk.VkBindBufferMemoryInfo(buffer=second, memory=memory, memoryOffset=needs.size)])
    seen["bound"] = True
    local = allocate(device, 64 << 10, 1 - host)
    seen["device_local_map"] = outcome(vk.vkMapMemory, device, local, 0, 16, 0)
    fence = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
    done = vk.vkCreateFence(device, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)
    seen["fences"] = [outcome(vk.vkGetFenceStatus, device, fence), outcome(vk.vkGetFenceStatus, device, done),
                      outcome(vk.vkWaitForFences, device, 1, [done], vk.VK_TRUE, 10 ** 9),
                      outcome(vk.vkWaitForFences, device, 2, [fence, done], vk.VK_TRUE, 0),
                      outcome(vk.vkWaitForFences, device, 2, [fence, done], vk.VK_FALSE, 0)]
    vk.vkResetFences(device, 1, [done])
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    vk.vkQueueSubmit(queue, 0, None, fence)  # an empty submission signals its fence once the ring answers it
    seen["fences"] += [outcome(vk.vkGetFenceStatus, device, done),
                       outcome(vk.vkWaitForFences, device, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)]
    vk.vkQueueWaitIdle(queue)
    vk.vkDeviceWaitIdle(device)
    for made in (first, second):
        vk.vkDestroyBuffer(device, made, None)
    for made in (fence, done):
        vk.vkDestroyFence(device, made, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkFreeMemory(device, local, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def limit(size: int) -> dict:
    instance, device, host = open_device()
    seen = [outcome(lambda: allocate(device, size, host) and "ok") for _ in range(2)]
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return {"allocations": seen}


def churn(size: int) -> dict:
    instance, device, host = open_device()
    seen = []
    for _ in range(200):
        seen.append(outcome(lambda: vk.vkFreeMemory(device, allocate(device, size, host), None)))
    pages = [allocate(device, 4096, host) for _ in range(100)]
    for page in pages:
        vk.vkFreeMemory(device, page, None)
    seen.append(outcome(lambda: vk.vkFreeMemory(device, allocate(device, size, host), None)))
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return {"allocations": {answer: seen.count(answer) for answer in set(seen)}}


def hostile() -> dict:
    instance, device, host = open_device()
    wrong_memory = vk.ffi.cast("VkDeviceMemory", 0x1234_5678_9ABC)
    wrong_buffer = vk.ffi.cast("VkBuffer", 0x0100_0000_0000_0001)
    wrong_fence = vk.ffi.cast("VkFence", 0xDEAD_BEEF)
    memory = allocate(device, 8192, host)
    buffer, twice = make_buffer(device, 4096), make_buffer(device, 4096)
    seen = {
        "map wrong memory": outcome(vk.vkMapMemory, device, wrong_memory, 0, 16, 0),
        "bind wrong buffer": outcome(vk.vkBindBufferMemory, device, wrong_buffer, memory, 0),
        "bind to wrong memory": outcome(vk.vkBindBufferMemory, device, buffer, wrong_memory, 0),
        "wrong fence status": outcome(vk.vkGetFenceStatus, device, wrong_fence),
        "reset wrong fence": outcome(vk.vkResetFences, device, 1, [wrong_fence]),
        "bound past its memory": outcome(vk.vkBindBufferMemory, device, buffer, memory, 8192 - 256),
        "bind misaligned": outcome(vk.vkBindBufferMemory, device, buffer, memory, 3),
        "map past its memory": outcome(vk.vkMapMemory, device, memory, 8192, 16, 0),
        "memory type 7": outcome(vk.vkAllocateMemory, device,
                                 vk.VkMemoryAllocateInfo(allocationSize=4096, memoryTypeIndex=7), None),
    }
    vk.vkBindBufferMemory(device, buffer, memory, 0)
    seen["bound twice"] = outcome(vk.vkBindBufferMemory, device, buffer, memory, 4096)
    first = vk.vkMapMemory(device, memory, 0, 16, 0)
    again = outcome(vk.vkMapMemory, device, memory, 8, 8, 0)  # Vulkan forbids it; lavapipe maps it
    if not isinstance(again, str):
        again[0:4] = b"\x01\x02\x03\x04"
        again = bytes(first[8:12]).hex()  # the same pages
    seen["mapped twice"] = again
    vk.vkFreeMemory(device, memory, None)  # while the buffer is bound to it
    seen["map freed memory"] = outcome(vk.vkMapMemory, device, memory, 0, 16, 0)
    seen["bind to freed memory"] = outcome(vk.vkBindBufferMemory, device, twice, memory, 0)
    vk.vkFreeMemory(device, wrong_memory, None)  # nothing to free: no crash
    vk.vkDestroyBuffer(device, wrong_buffer, None)
    vk.vkDestroyBuffer(device, buffer, None)
    vk.vkDestroyBuffer(device, buffer, None)  # twice: the second finds nothing
    still = allocate(device, 4096, host)
    mapped = vk.vkMapMemory(device, still, 0, 4, 0)
    mapped[:4] = b"live"
    seen["still works"] = bytes(mapped[:4]) == b"live"
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def hold() -> None:
    instance, device, _host = open_device()
    print("device", flush=True)
    sys.stdin.readline()
    vk.vkDestroyDevice(device, None)
    print("destroyed", flush=True)
    sys.stdin.read()
    vk.vkDestroyInstance(instance, None)


def main() -> None:
    mode = sys.argv[1]
    if mode == "hold":
        hold()
        return
    seen = {"honest": honest, "hostile": hostile}.get(mode)
    if seen is None:
        seen = {"limit": limit, "churn": churn}[mode]
        print(json.dumps(seen(int(sys.argv[2]))), flush=True)
        return
    print(json.dumps(seen()), flush=True)


if __name__ == "__main__":
    main()
