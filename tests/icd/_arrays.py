"""An unmodified Vulkan program on the ``vulkan`` bindings: a runtime-sized array of buffers (``b[]``).

``python _arrays.py SPV`` (SPV: PICK of tests/arbiter/test_runtime_arrays.py compiled) makes a set layout
whose binding 0 is an array of 3 storage buffers (descriptorCount 3: the array's length, as Vulkan has it)
and binding 1 one storage buffer holding n = 3, a pipeline of SPV over it, a descriptor set with the three
buffers written in one update, and runs N workgroups; then tries pipelines over layouts whose binding 0
holds 0 and 40 descriptors. Prints one JSON line: what Vulkan answered, and the buffers.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import begin, command_buffers, end, make_pool  # noqa: E402
from _memory import allocate, make_buffer, open_device, outcome  # noqa: E402

N, LENGTH = 60, 3  # workgroups (one invocation each), the array's length
SIZE = N * 4
STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER


def layouts(device, count: int):
    """A set layout of binding 0: ``count`` storage buffers, binding 1: one, and its pipeline layout."""
    bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=STORAGE, descriptorCount=c,
                                                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for b, c in ((0, count), (1, 1))]
    set_layout = vk.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(
        bindingCount=2, pBindings=bindings), None)
    return set_layout, vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(
        setLayoutCount=1, pSetLayouts=[set_layout]), None)


def pipeline(device, module, layout):
    stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
    made = outcome(vk.vkCreateComputePipelines, device, None, 1, [vk.VkComputePipelineCreateInfo(
        stage=stage, layout=layout)], None)
    return made if isinstance(made, str) else made[0]


def main() -> None:
    spv = open(sys.argv[1], "rb").read()
    instance, device, host = open_device()
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    buffers = [make_buffer(device, SIZE) for _ in range(LENGTH + 1)]
    step = vk.vkGetBufferMemoryRequirements(device, buffers[0]).size
    memory = allocate(device, step * len(buffers), host)
    for k, buffer in enumerate(buffers):
        vk.vkBindBufferMemory(device, buffer, memory, k * step)
    words = np.frombuffer(vk.vkMapMemory(device, memory, 0, step * len(buffers), 0), dtype=np.uint32)
    words[:] = 0
    words[LENGTH * step // 4] = LENGTH  # P.n
    module = vk.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None)
    set_layout, layout = layouts(device, LENGTH)
    made = pipeline(device, module, layout)
    seen = {"pipeline": made if isinstance(made, str) else "ok",
            "no descriptors": pipeline(device, module, layouts(device, 0)[1]),
            "40 descriptors": pipeline(device, module, layouts(device, 40)[1])}
    pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(maxSets=1, poolSizeCount=1, pPoolSizes=[
        vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=LENGTH + 1)]), None)
    descriptors = vk.vkAllocateDescriptorSets(device, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[set_layout]))[0]
    info = [vk.VkDescriptorBufferInfo(buffer=b, offset=0, range=SIZE) for b in buffers]
    vk.vkUpdateDescriptorSets(device, 2, [
        vk.VkWriteDescriptorSet(dstSet=descriptors, dstBinding=0, descriptorCount=LENGTH, descriptorType=STORAGE,
                                pBufferInfo=info[:LENGTH]),
        vk.VkWriteDescriptorSet(dstSet=descriptors, dstBinding=1, descriptorCount=1, descriptorType=STORAGE,
                                pBufferInfo=info[LENGTH:])], 0, None)
    cb, = command_buffers(device, make_pool(device))
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, made)
    vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, [descriptors], 0, None)
    vk.vkCmdDispatch(cb, N, 1, 1)
    seen["end"] = end(cb)
    fence = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
    seen["submit"] = outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(commandBufferCount=1,
                                                                           pCommandBuffers=[cb])], fence)
    seen["wait"] = outcome(vk.vkWaitForFences, device, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)
    seen["buffers"] = [words[k * step // 4:k * step // 4 + N].tolist() for k in range(LENGTH + 1)]
    print(json.dumps(seen), flush=True)
    outcome(vk.vkDeviceWaitIdle, device)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)


if __name__ == "__main__":
    main()
