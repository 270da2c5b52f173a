"""An unmodified Vulkan program on the ``vulkan`` bindings: subgroup size control (VK_EXT_subgroup_size_control).

``python _subgroups.py MODE SPV`` (SPV: test_pipelines.py's SUBGROUPS kernel, whose workgroup's x is
specialization constant 0 and which writes each invocation's subgroup size and the sum of 1 over its
subgroup) prints one JSON line.

``run``, for any driver that offers the extension:

- ``listed``, ``features``: whether the extension is listed, and subgroupSizeControl and
  computeFullSubgroups as reported; ``sizes``: minSubgroupSize, maxSubgroupSize and
  requiredSubgroupSizeStages;
- ``made``: what vkCreateComputePipelines answered for a workgroup of 64 in x with
  REQUIRE_FULL_SUBGROUPS and the required size maxSubgroupSize;
- ``output``: what that pipeline wrote for 64 invocations (subgroup size, subgroup sum of 1, each).

``refusals``, through libshare's driver (Vulkan leaves these undefined): a required size twice the
largest, REQUIRE_FULL with a workgroup of half a subgroup in x, and a required size with
ALLOW_VARYING_SUBGROUP_SIZE.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import begin, bound_buffers, command_buffers, end, make_pool  # noqa: E402
from _memory import outcome  # noqa: E402

EXTENSION = "VK_EXT_subgroup_size_control"
FULL = 0x2  # VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT (the bindings leave its name None)
VARYING = 0x1  # VK_PIPELINE_SHADER_STAGE_CREATE_ALLOW_VARYING_SUBGROUP_SIZE_BIT
N = 64


class Device:
    """A device with subgroup size control's features on, a set layout of one storage buffer, and the kernel."""

    def __init__(self, spv: bytes):
        self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
            apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))), None)
        self.physical = vk.vkEnumeratePhysicalDevices(self.instance)[0]
        names = [e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(self.physical, None)]
        self.listed = EXTENSION in names
        self.features = vk.VkPhysicalDeviceSubgroupSizeControlFeatures()
        vk.vkGetPhysicalDeviceFeatures2(self.physical, vk.VkPhysicalDeviceFeatures2(pNext=self.features))
        self.properties = vk.VkPhysicalDeviceSubgroupSizeControlProperties()
        vk.vkGetPhysicalDeviceProperties2(self.physical, vk.VkPhysicalDeviceProperties2(pNext=self.properties))
        asked = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(subgroupSizeControl=vk.VK_TRUE,
                                                                   computeFullSubgroups=vk.VK_TRUE)
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(
            pNext=asked, queueCreateInfoCount=1, pQueueCreateInfos=[queue], enabledExtensionCount=1,
            ppEnabledExtensionNames=[EXTENSION]), None)
        binding = vk.VkDescriptorSetLayoutBinding(binding=0, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                  descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
        self.set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=1, pBindings=[binding]), None)
        self.layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout]), None)
        self.module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv),
                                              None)

    def pipeline(self, width: int, flags: int, required: int | None):
        """What vkCreateComputePipelines answers, and the pipeline, for a workgroup ``width`` wide."""
        constants = vk.VkSpecializationInfo(
            mapEntryCount=1, pMapEntries=[vk.VkSpecializationMapEntry(constantID=0, offset=0, size=4)], dataSize=4,
            pData=vk.ffi.new("uint32_t[1]", [width]))
        size = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(requiredSubgroupSize=required) \
            if required is not None else None
        stage = vk.VkPipelineShaderStageCreateInfo(pNext=size, flags=flags, stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                                   module=self.module, pName="main", pSpecializationInfo=constants)
        try:
            return "ok", vk.vkCreateComputePipelines(self.device, None, 1, [vk.VkComputePipelineCreateInfo(
                stage=stage, layout=self.layout)], None)[0]
        except (vk.VkError, vk.VkException) as exc:
            return type(exc).__name__, None

    def close(self):
        vk.vkDeviceWaitIdle(self.device)
        vk.vkDestroyDevice(self.device, None)
        vk.vkDestroyInstance(self.instance, None)


def dispatch(d: Device, pipeline) -> list[int]:
    """Run ``pipeline`` once over one workgroup; the buffer it wrote."""
    types = vk.vkGetPhysicalDeviceMemoryProperties(d.physical).memoryTypes
    host = next(i for i in range(2) if types[i].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    memory, (buffer,) = bound_buffers(d.device, host, 1, 2 * N * 4)
    words = np.frombuffer(vk.vkMapMemory(d.device, memory, 0, 2 * N * 4, 0), dtype=np.uint32)
    words[:] = 0
    descriptor_pool = vk.vkCreateDescriptorPool(d.device, vk.VkDescriptorPoolCreateInfo(
        maxSets=1, poolSizeCount=1, pPoolSizes=[vk.VkDescriptorPoolSize(
            type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1)]), None)
    made = vk.vkAllocateDescriptorSets(d.device, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=descriptor_pool, descriptorSetCount=1, pSetLayouts=[d.set_layout]))[0]
    vk.vkUpdateDescriptorSets(d.device, 1, [vk.VkWriteDescriptorSet(
        dstSet=made, dstBinding=0, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buffer, offset=0, range=2 * N * 4)])], 0, None)
    pool = make_pool(d.device)
    cb, = command_buffers(d.device, pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
    vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, d.layout, 0, 1, [made], 0, None)
    vk.vkCmdDispatch(cb, 1, 1, 1)
    end(cb)
    queue = vk.vkGetDeviceQueue(d.device, 0, 0)
    vk.vkQueueSubmit(queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], None)
    vk.vkQueueWaitIdle(queue)
    return words.tolist()


def run(spv: bytes) -> dict:
    d = Device(spv)
    largest = d.properties.maxSubgroupSize
    seen = {"listed": d.listed,
            "features": [bool(d.features.subgroupSizeControl), bool(d.features.computeFullSubgroups)],
            "sizes": [d.properties.minSubgroupSize, largest, d.properties.requiredSubgroupSizeStages]}
    seen["made"], pipeline = d.pipeline(N, FULL, largest)
    if pipeline is not None:
        seen["output"] = dispatch(d, pipeline)
    d.close()
    return seen


def refusals(spv: bytes) -> dict:
    d = Device(spv)
    largest = d.properties.maxSubgroupSize
    seen = {"twice the size": d.pipeline(N, FULL, 2 * largest)[0],
            "half a subgroup": d.pipeline(largest // 2, FULL, None)[0],
            "varying and required": d.pipeline(N, VARYING, largest)[0],
            "varying alone": d.pipeline(N, VARYING, None)[0]}
    d.close()
    return seen


def main() -> None:
    mode, spv = sys.argv[1], open(sys.argv[2], "rb").read()
    print(json.dumps({"run": run, "refusals": refusals}[mode](spv)), flush=True)


if __name__ == "__main__":
    main()
