"""An unmodified Vulkan program on the ``vulkan`` bindings: extensions Vulkan 1.1 absorbed, by their own names.

``python _promoted.py`` makes a device enabling VK_KHR_get_memory_requirements2, VK_KHR_bind_memory2,
VK_KHR_dedicated_allocation, VK_KHR_maintenance1, _maintenance2 and _maintenance3, VK_KHR_spirv_1_4 (which
Vulkan 1.2 absorbed) and VK_EXT_robustness2 (its robustBufferAccess2 on), as programs do that enable
what a device lists (Taichi enables the first three, ncnn all but spirv_1_4), calls the KHR-named
commands, and prints one JSON line:

- ``device``: what vkCreateDevice answered;
- ``requirements``: a 1000-byte buffer's size and alignment by vkGetBufferMemoryRequirements, then by
  vkGetBufferMemoryRequirements2KHR, with VkMemoryDedicatedRequirements's two answers;
- ``bound``: what vkBindBufferMemory2KHR answered for that buffer at offset 0 of its memory;
- ``trimmed``: whether vkTrimCommandPoolKHR returned;
- ``supported``: vkGetDescriptorSetLayoutSupportKHR's answer for a layout of two storage buffers;
- ``robustness2``: robustBufferAccess2 as reported, and the two access size alignments.

It knows nothing of libshare.
"""

from __future__ import annotations

import json

import vulkan as vk

EXTENSIONS = ["VK_KHR_get_memory_requirements2", "VK_KHR_bind_memory2", "VK_KHR_dedicated_allocation",
              "VK_KHR_maintenance1", "VK_KHR_maintenance2", "VK_KHR_maintenance3", "VK_KHR_spirv_1_4",
              "VK_EXT_robustness2"]


def main() -> None:
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    robust = vk.VkPhysicalDeviceRobustness2FeaturesEXT()
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(pNext=robust))
    alignments = vk.VkPhysicalDeviceRobustness2PropertiesEXT()
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=alignments))
    seen = {"robustness2": [bool(robust.robustBufferAccess2), alignments.robustStorageBufferAccessSizeAlignment,
                            alignments.robustUniformBufferAccessSizeAlignment]}
    queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    try:
        device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
            pNext=vk.VkPhysicalDeviceRobustness2FeaturesEXT(robustBufferAccess2=vk.VK_TRUE), queueCreateInfoCount=1,
            pQueueCreateInfos=[queue], enabledExtensionCount=len(EXTENSIONS), ppEnabledExtensionNames=EXTENSIONS), None)
    except (vk.VkError, vk.VkException) as exc:
        print(json.dumps({**seen, "device": type(exc).__name__}), flush=True)
        return
    seen["device"] = "ok"
    buffer = vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(size=1000, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT),
                               None)
    plain = vk.vkGetBufferMemoryRequirements(device, buffer)
    dedicated = vk.VkMemoryDedicatedRequirements()
    asked = vk.VkMemoryRequirements2(pNext=dedicated)
    vk.vkGetDeviceProcAddr(device, "vkGetBufferMemoryRequirements2KHR")(
        device, vk.VkBufferMemoryRequirementsInfo2(buffer=buffer), asked)
    seen["requirements"] = [plain.size, plain.alignment, asked.memoryRequirements.size,
                            asked.memoryRequirements.alignment, bool(dedicated.prefersDedicatedAllocation),
                            bool(dedicated.requiresDedicatedAllocation)]
    kind = next(i for i in range(32) if plain.memoryTypeBits >> i & 1)
    memory = vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(allocationSize=plain.size, memoryTypeIndex=kind),
                                 None)
    try:
        vk.vkGetDeviceProcAddr(device, "vkBindBufferMemory2KHR")(
            device, 1, [vk.VkBindBufferMemoryInfo(buffer=buffer, memory=memory, memoryOffset=0)])
        seen["bound"] = "ok"
    except (vk.VkError, vk.VkException) as exc:
        seen["bound"] = type(exc).__name__
    pool = vk.vkCreateCommandPool(device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=0), None)
    vk.vkGetDeviceProcAddr(device, "vkTrimCommandPoolKHR")(device, pool, 0)
    seen["trimmed"] = True
    support = vk.VkDescriptorSetLayoutSupport()
    bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for b in range(2)]
    vk.vkGetDeviceProcAddr(device, "vkGetDescriptorSetLayoutSupportKHR")(
        device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=2, pBindings=bindings), support)
    seen["supported"] = bool(support.supported)
    vk.vkDestroyCommandPool(device, pool, None)
    vk.vkDestroyBuffer(device, buffer, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
