"""An unmodified program on the ``vulkan`` bindings whose kernel reads and writes texel buffers.

``python _texels.py SPV [again]`` (SPV: test_texels.py's KERNEL: ``dst[i] = texelFetch(src, i).x * 2 + 1``, src
a uniform texel buffer, dst a storage texel buffer of r32f) prints one JSON line:

- ``features``: the buffer features vkGetPhysicalDeviceFormatProperties reports for r32f, rgba8 and
  r8_unorm, as [storage texel buffer, uniform texel buffer];
- ``alignment``: the device's minTexelBufferOffsetAlignment;
- ``output``: dst's first N texels after one dispatch, src's view starting SRC_AT bytes into its buffer;
- ``beyond``: dst's texels past the first N, which the kernel does not write (the sentinel stays);
- ``template``: the output again, the set written through an update template this time;
- ``refused``: what vkCreateBufferView answers for a format no texel buffer has, a range past its
  buffer, an offset not aligned, and a buffer bound to no memory;
- ``destroyed``: vkEndCommandBuffer's answer for a dispatch whose set names a destroyed view;
- ``freed``: the same when the memory under the view was freed.

With ``again`` it then answers each line of standard input with ``{"again": dst's first N texels}`` after
one more dispatch over the first set, recorded anew (a test kills the arbiter between two lines). It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _memory import outcome  # noqa: E402

N = 256
SRC_AT = 256  # bytes into src's buffer where its view starts
SENTINEL = -7.0
PAGE = 4096
WHOLE = (1 << 64) - 1  # VK_WHOLE_SIZE (the bindings spell it -1)
FORMATS = {"r32f": vk.VK_FORMAT_R32_SFLOAT, "rgba8": vk.VK_FORMAT_R8G8B8A8_UNORM, "r8_unorm": vk.VK_FORMAT_R8_UNORM}
TYPES = (vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, vk.VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER)


class Texels:
    """A device, one host-visible memory of two pages (src's buffer, then dst's) and the kernel's pipeline."""

    def __init__(self, spv: bytes):
        self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(), None)
        self.physical = vk.vkEnumeratePhysicalDevices(self.instance)[0]
        queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
        self.device = vk.vkCreateDevice(self.physical, vk.VkDeviceCreateInfo(queueCreateInfoCount=1,
                                                                             pQueueCreateInfos=[queue]), None)
        types = vk.vkGetPhysicalDeviceMemoryProperties(self.physical).memoryTypes
        self.host = next(i for i in range(2) if types[i].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
        self.memory, self.words = self.mapped(2 * PAGE)
        self.src, self.dst = self.buffer(self.memory, 0), self.buffer(self.memory, PAGE)
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=k, descriptorType=TYPES[k], descriptorCount=1,
                                                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for k in range(2)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=2, pBindings=bindings), None)
        self.layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout]), None)
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
        self.pipeline = vk.vkCreateComputePipelines(self.device, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=self.layout)], None)[0]
        sizes = [vk.VkDescriptorPoolSize(type=t, descriptorCount=8) for t in TYPES]
        self.pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=4, poolSizeCount=2, pPoolSizes=sizes), None)
        self.commands = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=0), None)
        self.queue = vk.vkGetDeviceQueue(self.device, 0, 0)

    def mapped(self, size):
        memory = vk.vkAllocateMemory(self.device, vk.VkMemoryAllocateInfo(allocationSize=size,
                                                                          memoryTypeIndex=self.host), None)
        return memory, np.frombuffer(vk.vkMapMemory(self.device, memory, 0, size, 0), np.uint8)

    def buffer(self, memory, offset, size=PAGE):
        usage = vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT | vk.VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT
        made = vk.vkCreateBuffer(self.device, vk.VkBufferCreateInfo(size=size, usage=usage,
                                                                    sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        if memory is not None:
            vk.vkBindBufferMemory(self.device, made, memory, offset)
        return made

    def view(self, buffer, offset=0, size=WHOLE, format=vk.VK_FORMAT_R32_SFLOAT):
        return vk.vkCreateBufferView(self.device, vk.VkBufferViewCreateInfo(buffer=buffer, format=format,
                                                                            offset=offset, range=size), None)

    def new_set(self, views=None):
        made = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.pool, descriptorSetCount=1, pSetLayouts=[self.set_layout]))[0]
        if views is not None:
            vk.vkUpdateDescriptorSets(self.device, 2, [vk.VkWriteDescriptorSet(
                dstSet=made, dstBinding=k, descriptorCount=1, descriptorType=TYPES[k],
                pTexelBufferView=[views[k]]) for k in range(2)], 0, None)
        return made

    def written_by_template(self, views):
        """A set whose two views an update template writes, from one array of VkBufferView."""
        entries = [vk.VkDescriptorUpdateTemplateEntry(dstBinding=k, dstArrayElement=0, descriptorCount=1,
                                                      descriptorType=TYPES[k], offset=8 * k, stride=8)
                   for k in range(2)]
        template = vk.vkCreateDescriptorUpdateTemplate(self.device, vk.VkDescriptorUpdateTemplateCreateInfo(
                descriptorUpdateEntryCount=2, pDescriptorUpdateEntries=entries,
                templateType=vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET, descriptorSetLayout=self.set_layout),
            None)
        made = self.new_set()
        data = vk.ffi.new("VkBufferView[2]", list(views))
        vk.vkUpdateDescriptorSetWithTemplate(self.device, made, template, data)
        return made

    def record(self, descriptor_set):
        """A command buffer dispatching the kernel over ``descriptor_set``, ended: it, and vkEndCommandBuffer's answer."""
        cb = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
            commandPool=self.commands, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline)
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1, [descriptor_set], 0, None)
        vk.vkCmdDispatch(cb, N // 64, 1, 1)
        return cb, outcome(vk.vkEndCommandBuffer, cb)

    def run(self, descriptor_set) -> np.ndarray:
        """dst after one dispatch over ``descriptor_set``, src filled and dst set to the sentinel first."""
        self.words[:PAGE] = np.arange(PAGE // 4, dtype=np.float32).view(np.uint8)
        self.words[PAGE:] = np.full(PAGE // 4, SENTINEL, np.float32).view(np.uint8)
        cb, ended = self.record(descriptor_set)
        assert ended == "ok", ended
        vk.vkQueueSubmit(self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], None)
        vk.vkQueueWaitIdle(self.queue)
        return np.frombuffer(self.words[PAGE:].tobytes(), np.float32)


def main() -> None:
    texels = Texels(open(sys.argv[1], "rb").read())
    device, physical = texels.device, texels.physical
    seen = {"features": {}, "alignment": vk.vkGetPhysicalDeviceProperties(physical).limits.minTexelBufferOffsetAlignment}
    for name, format in FORMATS.items():
        features = vk.vkGetPhysicalDeviceFormatProperties(physical, format).bufferFeatures
        seen["features"][name] = [bool(features & vk.VK_FORMAT_FEATURE_STORAGE_TEXEL_BUFFER_BIT),
                                  bool(features & vk.VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT)]
    views = [texels.view(texels.src, SRC_AT, 4 * N), texels.view(texels.dst)]
    first_set = texels.new_set(views)
    dst = texels.run(first_set)
    seen["output"], seen["beyond"] = dst[:N].tolist(), sorted(set(dst[N:].tolist()))
    seen["template"] = texels.run(texels.written_by_template(views))[:N].tolist()
    alignment = seen["alignment"]
    seen["refused"] = {
        "format": outcome(texels.view, texels.src, 0, WHOLE, vk.VK_FORMAT_R8_UNORM),
        "range": outcome(texels.view, texels.src, PAGE - 16, 32),
        "offset": outcome(texels.view, texels.src, alignment // 2) if alignment > 1 else "aligned always",
        "unbound": outcome(texels.view, texels.buffer(None, 0))}
    doomed = texels.view(texels.src)
    doomed_set = texels.new_set([doomed, views[1]])
    vk.vkDestroyBufferView(device, doomed, None)
    seen["destroyed"] = texels.record(doomed_set)[1]
    memory, _words = texels.mapped(PAGE)
    orphan_set = texels.new_set([texels.view(texels.buffer(memory, 0)), views[1]])
    vk.vkUnmapMemory(device, memory)
    vk.vkFreeMemory(device, memory, None)
    seen["freed"] = texels.record(orphan_set)[1]
    print(json.dumps(seen), flush=True)
    if sys.argv[2:] == ["again"]:
        for _ in sys.stdin:
            print(json.dumps({"again": texels.run(first_set)[:N].tolist()}), flush=True)


if __name__ == "__main__":
    main()
