"""An unmodified Vulkan program on the ``vulkan`` bindings: push descriptors (VK_KHR_push_descriptor).

``python _pushed.py MODE SPV`` (SPV: test_commands.py's step.comp, dst = src * 3 + add) prints one JSON line.

``run``, for any driver that offers the extension:

- ``listed``: whether VK_KHR_push_descriptor is among the device extensions; ``most``: its
  maxPushDescriptors (VkPhysicalDevicePushDescriptorPropertiesKHR);
- ``end``, ``submit``: what vkEndCommandBuffer and the submission answered for one command buffer of
  four dispatches (add 1, 2, 3, 4) with barriers between: the first pushes both bindings (A -> B);
  the second pushes only binding 1 (C), so binding 0 keeps A, as pushes add up; the third pushes
  both through an update template of push descriptors (B -> D); the fourth binds a pipeline of an
  ordinary set layout and such a set (D -> E) at the same set number.
- ``again``: the same command buffer submitted a second time (the pushes are the recording's);
- ``buffers``: A..E after it, for numpy to check.

``refusals``, through libshare's driver (Vulkan leaves these undefined, so a driver may do anything):
what a descriptor set allocated of a push layout, a push layout with a dynamic buffer, a pipeline
layout of two push sets, and a command buffer that pushes into a set whose layout is not of push
descriptors answer.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import barrier, begin, bound_buffers, command_buffers, end, make_pool  # noqa: E402
from _memory import open_device, outcome  # noqa: E402

N = 1024
SIZE = N * 4
STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
PUSH_LAYOUT = vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR
EXTENSION = "VK_KHR_push_descriptor"


def answered(call, *args) -> str:
    """"ok", or the class name of the error ``call(*args)`` raised."""
    value = outcome(call, *args)
    return value if isinstance(value, str) else "ok"


def set_layout(device, flags=PUSH_LAYOUT, kinds=(STORAGE, STORAGE)):
    bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=kind, descriptorCount=1,
                                                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for b, kind in enumerate(kinds)]
    return vk.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(
        flags=flags, bindingCount=len(bindings), pBindings=bindings), None)


def pipeline_layout(device, set_layouts):
    push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=8)
    return vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(
        setLayoutCount=len(set_layouts), pSetLayouts=set_layouts, pushConstantRangeCount=1,
        pPushConstantRanges=[push]), None)


def pipeline(device, layout, spv: bytes):
    module = vk.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None)
    constants = vk.VkSpecializationInfo(
        mapEntryCount=1, pMapEntries=[vk.VkSpecializationMapEntry(constantID=0, offset=0, size=4)], dataSize=4,
        pData=vk.ffi.new("uint32_t[1]", [3]))
    stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
                                               pSpecializationInfo=constants)
    made = vk.vkCreateComputePipelines(device, None, 1, [vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)],
                                       None)[0]
    vk.vkDestroyShaderModule(device, module, None)
    return made


def write(binding: int, buffer) -> vk.VkWriteDescriptorSet:
    return vk.VkWriteDescriptorSet(dstBinding=binding, descriptorCount=1, descriptorType=STORAGE,
                                   pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buffer, offset=0, range=SIZE)])


def add(cb, layout, value: int) -> None:
    vk.vkCmdPushConstants(cb, layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 8, vk.ffi.new("uint32_t[2]", [value, N]))


def template_of(device, layout):
    """An update template of push descriptors for set 0 of ``layout``: two buffer infos, 24 bytes apart."""
    entry = vk.VkDescriptorUpdateTemplateEntry(dstBinding=0, dstArrayElement=0, descriptorCount=2,
                                               descriptorType=STORAGE, offset=0, stride=24)
    return vk.vkCreateDescriptorUpdateTemplate(device, vk.VkDescriptorUpdateTemplateCreateInfo(
        descriptorUpdateEntryCount=1, pDescriptorUpdateEntries=[entry],
        templateType=vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_PUSH_DESCRIPTORS_KHR,
        pipelineBindPoint=vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipelineLayout=layout, set=0), None)


def infos(*buffers):
    """pData for template_of's template: a VkDescriptorBufferInfo per buffer, 24 bytes apart."""
    raw = vk.ffi.new("char[]", 24 * len(buffers))
    for i, buffer in enumerate(buffers):
        info = vk.ffi.cast("VkDescriptorBufferInfo *", raw + 24 * i)
        info.buffer, info.offset, info.range = buffer, 0, SIZE
    return raw


def properties(device_physical) -> int:
    seen = vk.VkPhysicalDevicePushDescriptorPropertiesKHR()
    vk.vkGetPhysicalDeviceProperties2(device_physical, vk.VkPhysicalDeviceProperties2(pNext=seen))
    return seen.maxPushDescriptors


def run(spv: bytes) -> dict:
    instance, device, host = open_device(EXTENSION)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    names = [e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)]
    seen = {"listed": EXTENSION in names, "most": properties(physical)}
    push_cmd = vk.vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR")
    push_template = vk.vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetWithTemplateKHR")
    pushed, plain = set_layout(device), set_layout(device, flags=0)
    layout, plain_layout = pipeline_layout(device, [pushed]), pipeline_layout(device, [plain])
    compute, plain_compute = pipeline(device, layout, spv), pipeline(device, plain_layout, spv)
    memory, (a, b, c, d, e) = bound_buffers(device, host, 5, SIZE)
    step = vk.vkGetBufferMemoryRequirements(device, a).size
    words = np.frombuffer(vk.vkMapMemory(device, memory, 0, step * 5, 0), dtype=np.uint32)
    words[:] = 0
    words[:N] = np.arange(N, dtype=np.uint32)
    descriptor_pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
        maxSets=1, poolSizeCount=1, pPoolSizes=[vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=2)]), None)
    ordinary = vk.vkAllocateDescriptorSets(device, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=descriptor_pool, descriptorSetCount=1, pSetLayouts=[plain]))[0]
    writes = [write(0, d), write(1, e)]
    for w in writes:
        w.dstSet = ordinary
    vk.vkUpdateDescriptorSets(device, 2, writes, 0, None)
    template = template_of(device, layout)
    pool = make_pool(device)
    cb, = command_buffers(device, pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, compute)
    push_cmd(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 2, [write(0, a), write(1, b)])
    add(cb, layout, 1)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    barrier(cb)
    push_cmd(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, [write(1, c)])  # binding 0 keeps A
    add(cb, layout, 2)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    barrier(cb)
    push_template(cb, template, layout, 0, infos(b, d))
    add(cb, layout, 3)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    barrier(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, plain_compute)
    vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, plain_layout, 0, 1, [ordinary], 0, None)
    add(cb, plain_layout, 4)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    seen["end"] = end(cb)
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    for key in ("submit", "again"):
        words[N:] = 0
        seen[key] = outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])],
                            None)
        if seen[key] == "ok":
            seen[key] = outcome(vk.vkQueueWaitIdle, queue)
        seen["buffers"] = [words[k * step // 4:k * step // 4 + N].tolist() for k in range(5)]
    vk.vkDeviceWaitIdle(device)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def refusals(spv: bytes) -> dict:
    instance, device, host = open_device(EXTENSION)
    push_cmd = vk.vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR")
    pushed, plain = set_layout(device), set_layout(device, flags=0)
    descriptor_pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
        maxSets=1, poolSizeCount=1, pPoolSizes=[vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=2)]), None)
    seen = {"allocate": answered(vk.vkAllocateDescriptorSets, device, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=descriptor_pool, descriptorSetCount=1, pSetLayouts=[pushed])),
            "dynamic": answered(set_layout, device, PUSH_LAYOUT,
                                (STORAGE, vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC)),
            "two push sets": answered(pipeline_layout, device, [pushed, pushed])}
    plain_layout = pipeline_layout(device, [plain])
    memory, (a, b) = bound_buffers(device, host, 2, SIZE)
    pool = make_pool(device)
    cb, = command_buffers(device, pool)
    begin(cb)
    push_cmd(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, plain_layout, 0, 2, [write(0, a), write(1, b)])
    seen["push into a plain set"] = end(cb)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def main() -> None:
    mode, spv = sys.argv[1], open(sys.argv[2], "rb").read()
    print(json.dumps({"run": run, "refusals": refusals}[mode](spv)))


if __name__ == "__main__":
    main()
