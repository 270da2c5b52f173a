"""An unmodified Vulkan program on the ``vulkan`` bindings: shader modules, pipelines and descriptors.

``python _pipelines.py MODE KERNEL.spv IMAGE.spv`` prints JSON lines of what Vulkan answered (an error by its
class name):

- ``honest``: set layouts (gaps, several sets, uniform and storage, a sampler refused), a pipeline layout,
  a compute pipeline of KERNEL with specialization constants (its workgroup size among them); prints
  ``made``, then on a line from stdin a second pipeline while the first lives, prints ``second``; on the
  next line destroys the first and makes one again, prints ``again``; then a pipeline of IMAGE (an image
  kernel: refused), a pipeline cache's data, descriptor pools (their limit, freeing, resetting; one declaring
  every descriptor type, as Taichi's) and updates
  (good ones, plain and by template; misaligned, wrongly typed, past a binding: skipped), and a last line.
- ``widths``: a pipeline of KERNEL (tests/icd/test_pipelines.py's WIDE) with constants of every width, and
  with a float that is not a number or a constant of the wrong size.
- ``hostile``: wrong handles of every new kind, a specialization map entry past its data, a module of
  garbage, a pipeline with no layout for its buffers; then an honest pipeline is still made.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import vulkan as vk

from tests.icd._memory import open_device

STORAGE, UNIFORM = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER


def outcome(call, *args):
    """What ``call(*args)`` answered: "ok" (or its value), or its error's class name."""
    try:
        value = call(*args)
    except (vk.VkError, vk.VkException) as exc:
        return type(exc).__name__
    return "ok" if value is None else value


def named(value):
    return value if isinstance(value, str) else "ok"


def module(device, code: bytes):
    return outcome(vk.vkCreateShaderModule, device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code),
                   None)


def set_layout(device, *bindings):
    """A set layout of (binding, type, count) triples."""
    return outcome(vk.vkCreateDescriptorSetLayout, device, vk.VkDescriptorSetLayoutCreateInfo(
        bindingCount=len(bindings), pBindings=[vk.VkDescriptorSetLayoutBinding(
            binding=b, descriptorType=t, descriptorCount=c, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
            for b, t, c in bindings]), None)


def pipeline_layout(device, sets, push=4):
    ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push)] if push else []
    return outcome(vk.vkCreatePipelineLayout, device, vk.VkPipelineLayoutCreateInfo(
        setLayoutCount=len(sets), pSetLayouts=sets, pushConstantRangeCount=len(ranges),
        pPushConstantRanges=ranges or None), None)


SPEC = [(0, 0, 4), (1, 4, 4), (2, 8, 4), (3, 12, 4), (99, 16, 4)]
"""(constantID, offset, size): the workgroup's x, SCALE (float), FLIP (bool), SHIFT (int), one the module lacks."""


def pipeline(device, shader, layout, entries=SPEC, data=None, name="main", out=None):
    data = struct.pack("<Ifiii", 32, 2.5, 1, -3, 7) if data is None else data
    spec = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=[
        vk.VkSpecializationMapEntry(constantID=i, offset=o, size=s) for i, o, s in entries],
        dataSize=len(data), pData=vk.ffi.from_buffer(data))
    stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=shader, pName=name,
                                               pSpecializationInfo=spec)
    info = vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)
    made = outcome(vk.vkCreateComputePipelines, device, None, 1, [info], None, out)
    return made if isinstance(made, str) else made[0]


def wait_line():
    print(flush=True, end="")
    sys.stdin.readline()


def memory_and_buffer(device, size=4096):
    memory = vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(allocationSize=1 << 16, memoryTypeIndex=1), None)
    buffer = vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                                             sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    vk.vkBindBufferMemory(device, buffer, memory, 0)
    return memory, buffer


def write(device, dst, binding, kind, infos, element=0):
    vk.vkUpdateDescriptorSets(device, 1, [vk.VkWriteDescriptorSet(
        dstSet=dst, dstBinding=binding, dstArrayElement=element, descriptorCount=len(infos), descriptorType=kind,
        pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=b, offset=o, range=r) for b, o, r in infos])], 0, None)


def honest(kernel: bytes, image: bytes) -> None:
    instance, device, _host = open_device()
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    seen = {}
    set0 = set_layout(device, (2, UNIFORM, 1), (0, STORAGE, 1))  # a gap at 1, given out of order
    set1 = set_layout(device, (0, STORAGE, 1), (1, STORAGE, 1), (5, STORAGE, 0))
    seen["sampler layout"] = named(set_layout(device, (0, vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER, 1)))
    seen["image layout"] = named(set_layout(device, (0, vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE, 1)))
    support = vk.VkDescriptorSetLayoutSupport()
    vk.vkGetDescriptorSetLayoutSupport(device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=1, pBindings=[
        vk.VkDescriptorSetLayoutBinding(binding=0, descriptorType=vk.VK_DESCRIPTOR_TYPE_SAMPLER, descriptorCount=1,
                                        stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)]), support)
    seen["sampler supported"] = bool(support.supported)
    layout = pipeline_layout(device, [set0, set1])
    shader = module(device, kernel)
    first = pipeline(device, shader, layout)
    seen["pipeline"] = named(first)
    print(json.dumps(seen), flush=True)
    print("made", flush=True)
    wait_line()
    print(json.dumps({"second": named(pipeline(device, shader, layout))}), flush=True)
    wait_line()
    vk.vkDestroyPipeline(device, first, None)
    again = pipeline(device, shader, layout)
    print(json.dumps({"again": named(again)}), flush=True)
    vk.vkDestroyPipeline(device, again, None)
    seen = {}
    out = vk.ffi.new("VkPipeline[1]")
    out[0] = vk.ffi.cast("VkPipeline", 0x1234)
    seen["image kernel"] = named(pipeline(device, module(device, image), pipeline_layout(device, [set0]), SPEC[:0],
                                          b"", out=out))
    seen["image pipeline handle"] = int(vk.ffi.cast("uintptr_t", out[0]))
    seen["wrong entry point"] = named(pipeline(device, shader, layout, name="other"))
    seen["too small a layout"] = named(pipeline(device, shader, pipeline_layout(device, [set0])))
    seen["no push constants"] = named(pipeline(device, shader, pipeline_layout(device, [set0, set1], push=0)))
    seen.update(caches(device, physical))
    seen.update(pools(device, set0, set1))
    print(json.dumps(seen), flush=True)


def caches(device, physical) -> dict:
    initial = vk.ffi.from_buffer(b"hello")  # any initial data: ignored
    cache = vk.vkCreatePipelineCache(device, vk.VkPipelineCacheCreateInfo(initialDataSize=5, pInitialData=initial),
                                     None)
    get = vk._vulkan.lib.vkGetPipelineCacheData  # (the bindings wrap no vkGetPipelineCacheData)
    size = vk.ffi.new("size_t *")
    assert get(device, cache, size, vk.ffi.NULL) == vk.VK_SUCCESS
    raw = vk.ffi.new("char[]", size[0])
    short = vk.ffi.new("size_t *", 8)
    incomplete = get(device, cache, short, raw)
    assert get(device, cache, size, raw) == vk.VK_SUCCESS
    data = vk.ffi.buffer(raw, size[0])[:]
    properties = vk.vkGetPhysicalDeviceProperties(physical)
    header = struct.unpack("<IIII", data[:16])
    uuid = bytes(properties.pipelineCacheUUID)
    merged = outcome(vk.vkMergePipelineCaches, device, cache, 1, [vk.vkCreatePipelineCache(
        device, vk.VkPipelineCacheCreateInfo(), None)])
    return {"cache header": list(header) == [32, 1, properties.vendorID, properties.deviceID] and data[16:] == uuid,
            "cache size": len(data), "cache too short": [incomplete, short[0]], "merged": merged}


def allocate(device, pool, layouts):
    """vkAllocateDescriptorSets' result (a number: the bindings know no VK_ERROR_OUT_OF_POOL_MEMORY) and sets."""
    out = vk.ffi.new("VkDescriptorSet[]", len(layouts) + 1)
    out[0] = vk.ffi.cast("VkDescriptorSet", 0x1234)
    info = vk.VkDescriptorSetAllocateInfo(descriptorPool=pool, descriptorSetCount=len(layouts), pSetLayouts=layouts)
    result = vk._vulkan.lib.vkAllocateDescriptorSets(device, vk.ffi.addressof(info), out)
    return result, [out[i] for i in range(len(layouts))]


def pools(device, set0, set1) -> dict:
    seen = {}
    sizes = [vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=8)]
    plain = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(maxSets=2, poolSizeCount=1,
                                                                            pPoolSizes=sizes), None)
    _, sets = allocate(device, plain, [set0, set1])
    result, refused = allocate(device, plain, [set0])
    seen["past max sets"] = [result, int(vk.ffi.cast("uintptr_t", refused[0]))]
    seen["free without the flag"] = outcome(vk.vkFreeDescriptorSets, device, plain, 1, [sets[0]])  # as lavapipe
    seen["after the free"] = allocate(device, plain, [set0])[0]  # its place in maxSets given back
    vk.vkResetDescriptorPool(device, plain, 0)
    seen["after reset"] = allocate(device, plain, [set1, set1])[0]
    freeing = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
        flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=1, poolSizeCount=1, pPoolSizes=sizes),
        None)
    _, one = allocate(device, freeing, [set0])
    seen["free with the flag"] = outcome(vk.vkFreeDescriptorSets, device, freeing, 1, [one[0]])
    seen["after free"] = allocate(device, freeing, [set0])[0]
    seen["free another pool's"] = outcome(vk.vkFreeDescriptorSets, device, freeing, 1, [sets[0]])
    # As Taichi's: every core descriptor type declared, freeing allowed; sizes are not counted per type. As
    # an older ncnn's (realesrgan-ncnn-py's): a size of 0 descriptors for a type it does not use (Vulkan
    # forbids it, lavapipe lets it by, and that ncnn runs on zeros when its pools are refused).
    every = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
        flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=4, poolSizeCount=11,
        pPoolSizes=[vk.VkDescriptorPoolSize(type=kind, descriptorCount=kind % 2) for kind in range(11)]), None)
    result, taken = allocate(device, every, [set0, set1])
    seen["every type"] = [result, outcome(vk.vkFreeDescriptorSets, device, every, 2, taken)]
    vk.vkDestroyDescriptorPool(device, every, None)
    _memory, buffer = memory_and_buffer(device)
    vk.vkResetDescriptorPool(device, plain, 0)
    s0, s1 = allocate(device, plain, [set0, set1])[1]
    write(device, s0, 0, STORAGE, [(buffer, 0, 256)])  # good
    write(device, s0, 2, UNIFORM, [(buffer, 256, (1 << 64) - 1)])  # good
    write(device, s1, 0, STORAGE, [(buffer, 0, 64), (buffer, 512, 64)])  # good: both elements
    write(device, s0, 0, STORAGE, [(buffer, 4, 64)])  # misaligned
    write(device, s0, 0, UNIFORM, [(buffer, 0, 64)])  # the binding is a storage one
    write(device, s1, 0, STORAGE, [(buffer, 0, 64)] * 3)  # past the binding (binding 5 holds none)
    write(device, s0, 0, STORAGE, [(buffer, 0, 8192)])  # past the buffer
    template = vk.vkCreateDescriptorUpdateTemplate(device, vk.VkDescriptorUpdateTemplateCreateInfo(
        descriptorUpdateEntryCount=1, pDescriptorUpdateEntries=[vk.VkDescriptorUpdateTemplateEntry(
            dstBinding=0, dstArrayElement=0, descriptorCount=2, descriptorType=STORAGE, offset=8, stride=24)],
        templateType=vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET, descriptorSetLayout=set1), None)
    raw = vk.ffi.new("char[64]")
    for i, (offset, size) in enumerate([(0, 64), (512, 64)]):
        info = vk.ffi.cast("VkDescriptorBufferInfo *", raw + 8 + 24 * i)
        info.buffer, info.offset, info.range = buffer, offset, size
    vk.vkUpdateDescriptorSetWithTemplate(device, s1, template, raw)
    seen["push template"] = outcome(vk.vkCreateDescriptorUpdateTemplate, device,
                                    vk.VkDescriptorUpdateTemplateCreateInfo(
                                        descriptorUpdateEntryCount=0, pDescriptorUpdateEntries=[],
                                        templateType=1, descriptorSetLayout=set1), None)
    vk.vkDestroyDescriptorUpdateTemplate(device, template, None)
    vk.vkDestroyDescriptorPool(device, plain, None)
    vk.vkDestroyDescriptorPool(device, freeing, None)
    return seen


def hostile(kernel: bytes) -> None:
    _instance, device, _host = open_device()
    wrong = {kind: vk.ffi.cast(kind, 0x55000001) for kind in (
        "VkShaderModule", "VkPipelineLayout", "VkDescriptorSetLayout", "VkPipelineCache", "VkDescriptorPool",
        "VkDescriptorSet", "VkPipeline", "VkDescriptorUpdateTemplate", "VkBuffer")}
    seen = {"garbage module": named(module(device, b"\x00\x01\x02\x03" * 64)),
            "short module": named(module(device, struct.pack("<I", 0x07230203)))}
    junk = module(device, struct.pack("<5I", 0x07230203, 0x10000, 0, 9, 0) + b"\xff" * 64)
    set0 = set_layout(device, (0, STORAGE, 1), (2, UNIFORM, 1))
    set1 = set_layout(device, (0, STORAGE, 1), (1, STORAGE, 1))
    layout = pipeline_layout(device, [set0, set1])
    shader = module(device, kernel)
    seen["junk module pipeline"] = named(pipeline(device, junk, layout))
    seen["wrong module"] = named(pipeline(device, wrong["VkShaderModule"], layout))
    seen["wrong layout"] = named(pipeline(device, shader, wrong["VkPipelineLayout"]))
    seen["entry past its data"] = named(pipeline(device, shader, layout, entries=[(0, 18, 4)]))
    seen["constant given twice"] = named(pipeline(device, shader, layout, entries=[(0, 0, 4), (0, 4, 4)]))
    seen["wrong constant size"] = named(pipeline(device, shader, layout, entries=[(1, 0, 2)]))
    seen["wrong set layout"] = named(pipeline_layout(device, [set0, wrong["VkDescriptorSetLayout"]]))
    seen["wrong cache data"] = vk._vulkan.lib.vkGetPipelineCacheData(device, wrong["VkPipelineCache"],
                                                                     vk.ffi.new("size_t *"), vk.ffi.NULL)
    seen["wrong pool reset"] = outcome(vk.vkResetDescriptorPool, device, wrong["VkDescriptorPool"], 0)
    seen["wrong pool allocate"] = allocate(device, wrong["VkDescriptorPool"], [set0])[0]
    pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
        flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=4, poolSizeCount=1,
        pPoolSizes=[vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=4)]), None)
    seen["wrong layout allocate"] = allocate(device, pool, [wrong["VkDescriptorSetLayout"]])[0]
    seen["wrong set free"] = outcome(vk.vkFreeDescriptorSets, device, pool, 1, [wrong["VkDescriptorSet"]])
    seen["wrong template layout"] = outcome(vk.vkCreateDescriptorUpdateTemplate, device,
                                           vk.VkDescriptorUpdateTemplateCreateInfo(
                                               descriptorUpdateEntryCount=0, pDescriptorUpdateEntries=[],
                                               templateType=0, descriptorSetLayout=wrong["VkDescriptorSetLayout"]),
                                           None)
    write(device, wrong["VkDescriptorSet"], 0, STORAGE, [(wrong["VkBuffer"], 0, 64)])
    one = allocate(device, pool, [set0])[1][0]
    write(device, one, 0, STORAGE, [(wrong["VkBuffer"], 0, 64)])
    vk.vkUpdateDescriptorSetWithTemplate(device, one, wrong["VkDescriptorUpdateTemplate"], vk.ffi.NULL)
    vk.vkUpdateDescriptorSets(device, 0, None, 1, [vk.VkCopyDescriptorSet(
        srcSet=one, srcBinding=0, dstSet=one, dstBinding=0, descriptorCount=0xFFFFFFFF)])  # a count that wraps
    entry = vk.VkDescriptorUpdateTemplateEntry(dstBinding=0, descriptorCount=1, descriptorType=STORAGE, stride=16)
    huge = vk.VkDescriptorUpdateTemplateEntry(dstBinding=0, descriptorCount=0xFFFFFFFF, descriptorType=STORAGE,
                                              stride=16)
    seen["huge template"] = outcome(vk.vkCreateDescriptorUpdateTemplate, device,
                                    vk.VkDescriptorUpdateTemplateCreateInfo(
                                        descriptorUpdateEntryCount=1, pDescriptorUpdateEntries=[huge],
                                        templateType=0, descriptorSetLayout=set0), None)
    template = vk.vkCreateDescriptorUpdateTemplate(device, vk.VkDescriptorUpdateTemplateCreateInfo(
        descriptorUpdateEntryCount=1, pDescriptorUpdateEntries=[entry], templateType=0, descriptorSetLayout=set0),
        None)
    vk.vkUpdateDescriptorSetWithTemplate(device, one, template, vk.ffi.NULL)  # no data to read
    for kind, destroy in (("VkShaderModule", vk.vkDestroyShaderModule), ("VkPipeline", vk.vkDestroyPipeline),
                          ("VkPipelineLayout", vk.vkDestroyPipelineLayout),
                          ("VkDescriptorSetLayout", vk.vkDestroyDescriptorSetLayout),
                          ("VkPipelineCache", vk.vkDestroyPipelineCache),
                          ("VkDescriptorPool", vk.vkDestroyDescriptorPool),
                          ("VkDescriptorUpdateTemplate", vk.vkDestroyDescriptorUpdateTemplate)):
        destroy(device, wrong[kind], None)
    vk.vkDestroyPipelineLayout(device, vk.ffi.cast("VkPipelineLayout", shader), None)  # a module: another kind
    seen["still works"] = named(pipeline(device, shader, layout))
    print(json.dumps(seen), flush=True)


def widths(kernel: bytes) -> None:
    """A kernel's constants of every width: int64, double, int16, uint8, float16, uint64."""
    _instance, device, _host = open_device()
    layout = pipeline_layout(device, [set_layout(device, (0, STORAGE, 1))], push=0)
    shader = module(device, kernel)
    entries = [(0, 0, 8), (1, 8, 8), (2, 16, 2), (3, 18, 1), (4, 20, 2), (5, 22, 8)]
    data = struct.pack("<qdhBxeQ", -5_000_000_000, 0.1, -7, 200, 1.5, (1 << 64) - 1)
    seen = {"every width": named(pipeline(device, shader, layout, entries, data)),
            "not a number": named(pipeline(device, shader, layout, entries, struct.pack(
                "<qdhBxeQ", 1, float("nan"), 1, 1, 1.0, 1))),
            "infinities": named(pipeline(device, shader, layout, entries, struct.pack(
                "<qdhBxeQ", 1, float("-inf"), 1, 1, float("inf"), 1))),
            "int64 of 4 bytes": named(pipeline(device, shader, layout, [(0, 0, 4)], data))}
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    MODE, KERNEL, IMAGE = sys.argv[1], Path(sys.argv[2]).read_bytes(), Path(sys.argv[3]).read_bytes()
    {"honest": lambda: honest(KERNEL, IMAGE), "hostile": lambda: hostile(KERNEL), "widths": lambda: widths(KERNEL)}[MODE]()
