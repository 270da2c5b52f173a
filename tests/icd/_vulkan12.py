"""An unmodified Vulkan 1.2 program on the ``vulkan`` bindings: what a device of Vulkan 1.2 offers.

``python _vulkan12.py SPV`` (SPV: test_vulkan12.py's KERNEL, which reads int8 and float16 buffers)
prints one JSON line (``python _vulkan12.py --driver``: the first two only):

- ``version``: the physical device's apiVersion (major, minor);
- ``driver``: its driver's name and conformance version (VkPhysicalDeviceDriverProperties);
- ``features``: the Vulkan 1.2 features it reports that the kernel needs;
- ``refused``: what vkCreateDevice answers for a feature it does not report (bufferDeviceAddress,
  descriptorIndexing), each alone;
- ``device``: vkCreateDevice with apiVersion 1.2 and VkPhysicalDeviceVulkan11Features and
  Vulkan12Features asking for what the kernel uses;
- ``missing``: the Vulkan 1.2 core commands vkGetDeviceProcAddr answers NULL for;
- ``timeline``: a timeline semaphore on that device, whose Vulkan12Features turned timelineSemaphore
  on (no VK_KHR_timeline_semaphore enabled: Vulkan 1.2 needs none): its value as made (3), after
  vkSignalSemaphore (5), and after a submission that signals 7, waited for by vkWaitSemaphores;
- ``after bind``: maxPerStageDescriptorStorageBuffers, then the update-after-bind limit of storage
  buffers in VkPhysicalDeviceVulkan12Properties and in VkPhysicalDeviceDescriptorIndexingProperties;
- ``padded``: vkCreateDevice given a VkPhysicalDeviceShaderDrawParametersFeatures that asks for
  nothing but whose tail padding holds ones, as a Rust or C++ program may leave it (wgpu does);
- ``output``: the kernel's result, c[i] = a[i] * b[i] + 1 (a int8, b float16, c float32), and after
  those N, 8 sums of 1.0 the kernel's invocations added with a float atomic (VK_EXT_shader_atomic_float),
  then the largest invocation index by a float atomic max (VK_EXT_shader_atomic_float2);
- ``reset``: a timestamp query pool's results after vkCmdWriteTimestamp, then after vkResetQueryPool
  from the host (its availability, 1 then 0).

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

N = 256
CORE_12 = ["vkCmdDrawIndirectCount", "vkCmdDrawIndexedIndirectCount", "vkCreateRenderPass2", "vkCmdBeginRenderPass2",
           "vkCmdNextSubpass2", "vkCmdEndRenderPass2", "vkResetQueryPool", "vkGetSemaphoreCounterValue",
           "vkWaitSemaphores", "vkSignalSemaphore", "vkGetBufferDeviceAddress", "vkGetBufferOpaqueCaptureAddress",
           "vkGetDeviceMemoryOpaqueCaptureAddress"]
WANTED = ("shaderFloat16", "shaderInt8", "storageBuffer8BitAccess", "scalarBlockLayout", "uniformBufferStandardLayout")


def outcome(call, *args):
    try:
        call(*args)
    except (vk.VkError, vk.VkException) as exc:
        return type(exc).__name__
    return "ok"


def create(physical, features, extensions=()):
    """A device of ``physical`` with the chain of feature structures ``features`` and ``extensions``."""
    queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    return vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
        pNext=features, queueCreateInfoCount=1, pQueueCreateInfos=[queue], enabledExtensionCount=len(extensions),
        ppEnabledExtensionNames=list(extensions) or None), None)


def buffer_over(device, memory, offset, size):
    buffer = vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                                             sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    vk.vkBindBufferMemory(device, buffer, memory, offset)
    return buffer


def run_kernel(device, host, spv: bytes, a: np.ndarray, b: np.ndarray) -> list:
    step = 4096
    memory = vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(allocationSize=3 * step, memoryTypeIndex=host), None)
    words = np.frombuffer(vk.vkMapMemory(device, memory, 0, 3 * step, 0), np.uint8)
    words[:a.nbytes] = a.view(np.uint8)
    words[step:step + b.nbytes] = b.view(np.uint8)
    buffers = [buffer_over(device, memory, k * step, step) for k in range(3)]
    bindings = [vk.VkDescriptorSetLayoutBinding(binding=k, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for k in range(3)]
    set_layout = vk.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(
        bindingCount=3, pBindings=bindings), None)
    layout = vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(setLayoutCount=1,
                                                                             pSetLayouts=[set_layout]), None)
    module = vk.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None)
    stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main")
    pipeline = vk.vkCreateComputePipelines(device, None, 1, [vk.VkComputePipelineCreateInfo(
        stage=stage, layout=layout)], None)[0]
    pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(maxSets=1, poolSizeCount=1, pPoolSizes=[
        vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=3)]), None)
    made = vk.vkAllocateDescriptorSets(device, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[set_layout]))[0]
    vk.vkUpdateDescriptorSets(device, 3, [vk.VkWriteDescriptorSet(
        dstSet=made, dstBinding=k, descriptorCount=1, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buffers[k], offset=0, range=step)]) for k in range(3)], 0, None)
    commands = vk.vkCreateCommandPool(device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=0), None)
    cb = vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
        commandPool=commands, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
    vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, [made], 0, None)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    vk.vkEndCommandBuffer(cb)
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    vk.vkQueueSubmit(queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], None)
    vk.vkQueueWaitIdle(queue)
    return np.frombuffer(words[2 * step:2 * step + 4 * (N + 9)].tobytes(), np.float32).tolist()


def query_reset(device) -> list:
    """A timestamp query's availability after a written timestamp, then after vkResetQueryPool."""
    pool = vk.vkCreateQueryPool(device, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                                                 queryCount=1), None)
    commands = vk.vkCreateCommandPool(device, vk.VkCommandPoolCreateInfo(queueFamilyIndex=0), None)
    cb = vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
        commandPool=commands, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
    vk.vkCmdResetQueryPool(cb, pool, 0, 1)
    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 0)
    vk.vkEndCommandBuffer(cb)
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    vk.vkQueueSubmit(queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], None)
    vk.vkQueueWaitIdle(queue)
    seen = []
    data = vk.ffi.new("uint64_t[2]", [7, 7])
    for step in range(2):
        answer = outcome(vk.vkGetQueryPoolResults, device, pool, 0, 1, 16, data, 16,
                         vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WITH_AVAILABILITY_BIT)
        seen.append([answer, int(data[1])])  # (VK_NOT_READY once unavailable: its availability is written)
        if step == 0:
            vk.vkResetQueryPool(device, pool, 0, 1)  # (the loader's core 1.2 trampoline)
    return seen


def core(device, name: str):
    """Vulkan 1.2 core command ``name`` as vkGetDeviceProcAddr answers it (the bindings look up only
    extension commands by name)."""
    found = vk.lib.vkGetDeviceProcAddr(device, name.encode())
    assert found != vk.ffi.NULL, name
    return vk.ffi.cast(f"PFN_{name}", found)


def timeline(device) -> list:
    """A timeline semaphore's values: as made, after a host signal, after a submission's signal."""
    made = vk.vkCreateSemaphore(device, vk.VkSemaphoreCreateInfo(pNext=vk.VkSemaphoreTypeCreateInfo(
        semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=3)), None)
    value = vk.ffi.new("uint64_t *")
    seen = []

    def read() -> None:
        assert core(device, "vkGetSemaphoreCounterValue")(device, made, value) == vk.VK_SUCCESS
        seen.append(int(value[0]))

    read()
    signal_info = vk.ffi.new("VkSemaphoreSignalInfo *", {"sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO,
                                                          "semaphore": made, "value": 5})
    assert core(device, "vkSignalSemaphore")(device, signal_info) == vk.VK_SUCCESS
    read()
    signal = vk.VkTimelineSemaphoreSubmitInfo(signalSemaphoreValueCount=1, pSignalSemaphoreValues=[7])
    vk.vkQueueSubmit(vk.vkGetDeviceQueue(device, 0, 0), 1, [vk.VkSubmitInfo(
        pNext=signal, signalSemaphoreCount=1, pSignalSemaphores=[made])], None)
    semaphores, values = vk.ffi.new("VkSemaphore[1]", [made]), vk.ffi.new("uint64_t[1]", [7])
    wait_info = vk.ffi.new("VkSemaphoreWaitInfo *", {"sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                                                      "semaphoreCount": 1, "pSemaphores": semaphores,
                                                      "pValues": values})
    assert core(device, "vkWaitSemaphores")(device, wait_info, 10 ** 10) == vk.VK_SUCCESS
    read()
    return seen


def padded(physical) -> str:
    """vkCreateDevice with a feature structure asking for nothing, its tail padding all ones."""
    draw = vk.VkPhysicalDeviceShaderDrawParametersFeatures(shaderDrawParameters=vk.VK_FALSE)
    end = vk.ffi.offsetof("VkPhysicalDeviceShaderDrawParametersFeatures", "shaderDrawParameters") + 4
    raw = vk.ffi.buffer(vk.ffi.addressof(draw))
    assert len(raw) > end, "the structure has no tail padding here"
    raw[end:] = b"\xff" * (len(raw) - end)
    answer = outcome(create, physical, draw)
    return answer


def driver(physical) -> list:
    """The driver's name and the conformance version it reports."""
    properties = vk.VkPhysicalDeviceDriverProperties()
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=properties))
    version = properties.conformanceVersion
    return [vk.ffi.string(properties.driverName).decode(),
            [version.major, version.minor, version.subminor, version.patch]]


def after_bind(physical) -> list:
    """The storage-buffer limits that count every set layout's descriptors, update-after-bind or not:
    maxPerStageDescriptorStorageBuffers, then the update-after-bind one of Vulkan12Properties and of
    VkPhysicalDeviceDescriptorIndexingProperties (each at least the first, or no pipeline layout with a
    storage buffer is within them)."""
    indexing = vk.VkPhysicalDeviceDescriptorIndexingProperties()
    vulkan12 = vk.VkPhysicalDeviceVulkan12Properties(pNext=indexing)
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=vulkan12))
    plain = vk.vkGetPhysicalDeviceProperties(physical).limits.maxPerStageDescriptorStorageBuffers
    return [plain, vulkan12.maxPerStageDescriptorUpdateAfterBindStorageBuffers,
            indexing.maxPerStageDescriptorUpdateAfterBindStorageBuffers]


def main() -> None:
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    version = vk.vkGetPhysicalDeviceProperties(physical).apiVersion
    if sys.argv[1] == "--driver":
        print(json.dumps({"version": [version >> 22, (version >> 12) & 0x3FF], "driver": driver(physical)}))
        return
    spv = open(sys.argv[1], "rb").read()
    dots = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
    zeroed = vk.VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures(pNext=dots)
    minmax = vk.VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT(pNext=zeroed)
    atomics = vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT(pNext=minmax)
    reported = vk.VkPhysicalDeviceVulkan12Features(pNext=atomics)
    vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(pNext=reported))
    seen = {"version": [version >> 22, (version >> 12) & 0x3FF], "driver": driver(physical),
            "features": {**{name: bool(getattr(reported, name)) for name in WANTED + ("bufferDeviceAddress",)},
                         "shaderBufferFloat32AtomicAdd": bool(atomics.shaderBufferFloat32AtomicAdd),
                         "shaderBufferFloat32AtomicMinMax": bool(minmax.shaderBufferFloat32AtomicMinMax),
                         "shaderIntegerDotProduct": bool(dots.shaderIntegerDotProduct),
                         "shaderZeroInitializeWorkgroupMemory": bool(zeroed.shaderZeroInitializeWorkgroupMemory)},
            "refused": {name: outcome(create, physical, vk.VkPhysicalDeviceVulkan12Features(**{name: vk.VK_TRUE}))
                        for name in ("bufferDeviceAddress", "descriptorIndexing")}}
    types = vk.vkGetPhysicalDeviceMemoryProperties(physical).memoryTypes
    host = next(i for i in range(2) if types[i].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    later = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(  # extensions of Vulkan 1.3's
        pNext=vk.VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures(
            pNext=vk.VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT(shaderBufferFloat32AtomicMinMax=vk.VK_TRUE),
            shaderZeroInitializeWorkgroupMemory=vk.VK_TRUE),
        shaderIntegerDotProduct=vk.VK_TRUE)
    features11 = vk.VkPhysicalDeviceVulkan11Features(
        pNext=vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT(pNext=later, shaderBufferFloat32AtomicAdd=vk.VK_TRUE),
        storageBuffer16BitAccess=vk.VK_TRUE)
    seen["padded"] = padded(physical)
    seen["after bind"] = after_bind(physical)
    device = create(physical, vk.VkPhysicalDeviceVulkan12Features(
        pNext=features11, shaderFloat16=vk.VK_TRUE, shaderInt8=vk.VK_TRUE, storageBuffer8BitAccess=vk.VK_TRUE,
        timelineSemaphore=vk.VK_TRUE, scalarBlockLayout=vk.VK_TRUE),
        ["VK_EXT_shader_atomic_float", "VK_EXT_shader_atomic_float2", "VK_KHR_shader_integer_dot_product",
         "VK_KHR_zero_initialize_workgroup_memory", "VK_KHR_shader_non_semantic_info"])
    seen["device"] = "ok"
    seen["missing"] = [name for name in CORE_12 if vk.lib.vkGetDeviceProcAddr(device, name.encode()) == vk.ffi.NULL]
    a = (np.arange(N) % 16 - 8).astype(np.int8)
    b = ((np.arange(N) % 8) / 4).astype(np.float16)
    seen["output"] = run_kernel(device, host, spv, a, b)
    seen["reset"] = query_reset(device)
    seen["timeline"] = timeline(device)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
