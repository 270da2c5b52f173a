"""An unmodified Vulkan program on the ``vulkan`` bindings: compute dispatches in command buffers, run.

``python _dispatches.py MODE SPV`` (SPV: step.comp compiled, see test_commands.py) prints one JSON line:

- ``chain``: one command buffer of 120 dependent dispatches (ping-pong between two buffers through two
  descriptor sets, each with its own push constant, the shader's scale a specialization constant),
  with barriers, copies, fills and updates between them, submitted three times; then a secondary
  command buffer executed twice by a primary, and a command buffer of more than 1024 commands; the
  buffers' contents after each are printed for numpy to check.
- ``extras``: an indirect dispatch (its counts in a buffer), VK_KHR_synchronization2's barrier, event set
  and wait, and an event reset; the events' states before and after, and the buffers; then a
  dispatch of workgroups 2..4 alone (vkCmdDispatchBase) and the buffer it wrote.
- ``dynamic``: one descriptor set whose output binding is a dynamic storage buffer, dispatched at two
  dynamic offsets with two push constants; the buffer printed.
- ``shared``: what the driver shares between recordings of the same content: 100 command buffers
  recorded alike, all held (more than a session's 64 lists) and submitted at once; a primary whose
  secondary is freed before the primary runs; a dispatch recorded again over memory allocated after
  the memory it named before was freed. What Vulkan answered, and the buffers.
- ``hostile``: a dispatch whose set holds a descriptor never written, one with no set bound, one whose
  base is past the device's limit, a command buffer submitted twice while pending (the first held by a
  timeline semaphore the host signals after), a pointer that is no command buffer submitted, and one
  whose buffer's memory was freed before its submission; what Vulkan answered for each.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import barrier, begin, command_buffers, make_pool, update  # noqa: E402
from _memory import allocate, make_buffer, open_device, outcome  # noqa: E402

N = 1024          # elements of each buffer (uint32)
SIZE = N * 4
SCALE = 3         # the specialization constant
STORAGE = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
DYNAMIC = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC


def open_device_with(extension: str):
    """open_device's, with ``extension`` (VK_KHR_synchronization2 or VK_KHR_timeline_semaphore) enabled."""
    features = vk.VkPhysicalDeviceSynchronization2Features(synchronization2=vk.VK_TRUE) \
        if extension == "VK_KHR_synchronization2" else vk.VkPhysicalDeviceTimelineSemaphoreFeatures(
            timelineSemaphore=vk.VK_TRUE)
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
        pNext=features, queueCreateInfoCount=1, pQueueCreateInfos=[queue], enabledExtensionCount=1,
        ppEnabledExtensionNames=[extension]), None)
    types = vk.vkGetPhysicalDeviceMemoryProperties(physical).memoryTypes
    host = next(i for i in range(2) if types[i].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    return instance, device, host


class Program:
    """A device, host-visible memory holding ``count`` buffers of SIZE bytes, and step.comp's pipeline."""

    def __init__(self, spv: bytes, count: int, output: int = STORAGE, extension: str | None = None):
        self.instance, self.device, host = open_device_with(extension) if extension else open_device()
        self.host = host
        self.queue = vk.vkGetDeviceQueue(self.device, 0, 0)
        self.buffers = [make_buffer(self.device, 2 * SIZE) for _ in range(count)]
        self.step = vk.vkGetBufferMemoryRequirements(self.device, self.buffers[0]).size
        self.memory = allocate(self.device, self.step * count, host)
        for k, buffer in enumerate(self.buffers):
            vk.vkBindBufferMemory(self.device, buffer, self.memory, k * self.step)
        mapped = vk.vkMapMemory(self.device, self.memory, 0, self.step * count, 0)
        self.words = np.frombuffer(mapped, dtype=np.uint32)
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=b, descriptorType=t, descriptorCount=1,
                                                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for b, t in ((0, STORAGE), (1, output))]
        self.set_layout = vk.vkCreateDescriptorSetLayout(self.device, vk.VkDescriptorSetLayoutCreateInfo(
            bindingCount=2, pBindings=bindings), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=8)
        self.layout = vk.vkCreatePipelineLayout(self.device, vk.VkPipelineLayoutCreateInfo(
            setLayoutCount=1, pSetLayouts=[self.set_layout], pushConstantRangeCount=1, pPushConstantRanges=[push]),
            None)
        module = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None)
        constants = vk.VkSpecializationInfo(
            mapEntryCount=1, pMapEntries=[vk.VkSpecializationMapEntry(constantID=0, offset=0, size=4)], dataSize=4,
            pData=vk.ffi.new("uint32_t[1]", [SCALE]))
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
                                                   pSpecializationInfo=constants)
        self.pipeline = vk.vkCreateComputePipelines(self.device, None, 1, [vk.VkComputePipelineCreateInfo(
            stage=stage, layout=self.layout)], None)[0]
        vk.vkDestroyShaderModule(self.device, module, None)
        sizes = [vk.VkDescriptorPoolSize(type=STORAGE, descriptorCount=16),
                 vk.VkDescriptorPoolSize(type=DYNAMIC, descriptorCount=16)]
        self.descriptor_pool = vk.vkCreateDescriptorPool(self.device, vk.VkDescriptorPoolCreateInfo(
            maxSets=8, poolSizeCount=2, pPoolSizes=sizes), None)
        self.pool = make_pool(self.device)

    def buffer_words(self, k: int) -> np.ndarray:
        first = k * self.step // 4
        return self.words[first:first + N]

    def new_set(self, written: dict[int, tuple[int, int]], output: int = STORAGE):
        """A descriptor set whose binding b (in ``written``) is buffers[k] from byte ``offset``, N words."""
        made = vk.vkAllocateDescriptorSets(self.device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self.descriptor_pool, descriptorSetCount=1, pSetLayouts=[self.set_layout]))[0]
        writes = [vk.VkWriteDescriptorSet(dstSet=made, dstBinding=b, descriptorCount=1,
                                          descriptorType=output if b == 1 else STORAGE,
                                          pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=self.buffers[k],
                                                                                 offset=offset, range=SIZE)])
                  for b, (k, offset) in written.items()]
        vk.vkUpdateDescriptorSets(self.device, len(writes), writes, 0, None)
        return made

    def bind(self, cb, made, offsets=()):
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1, [made], len(offsets),
                                   list(offsets) or None)

    def push(self, cb, add: int):
        vk.vkCmdPushConstants(cb, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                              vk.ffi.new("uint32_t[2]", [add, N]))

    def submit(self, cbs, wait=True):
        fence = vk.vkCreateFence(self.device, vk.VkFenceCreateInfo(), None)
        answer = outcome(vk.vkQueueSubmit, self.queue, 1, [vk.VkSubmitInfo(commandBufferCount=len(cbs),
                                                                            pCommandBuffers=cbs)], fence)
        if answer == "ok" and wait:
            answer = outcome(vk.vkWaitForFences, self.device, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)
        return answer, fence

    def close(self):
        outcome(vk.vkDeviceWaitIdle, self.device)  # (lost, after a hostile submission)
        vk.vkDestroyDevice(self.device, None)
        vk.vkDestroyInstance(self.instance, None)


def chain(spv: bytes) -> dict:
    p = Program(spv, 3)
    a, b, c = p.buffers
    ab, ba = p.new_set({0: (0, 0), 1: (1, 0)}), p.new_set({0: (1, 0), 1: (0, 0)})
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32)
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    for k in range(120):
        p.bind(cb, ab if k % 2 == 0 else ba)
        p.push(cb, k)
        vk.vkCmdDispatch(cb, N // 64, 1, 1)
        barrier(cb)
        if k % 10 == 9:  # the buffer just written (A after odd k): a copy of it, a fill and an update
            vk.vkCmdCopyBuffer(cb, a, c, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=4 * (k // 10), size=64)])
            vk.vkCmdFillBuffer(cb, c, 4 * (100 + k), 16, k)
            update(cb, a, 8 * k, np.full(4, k, dtype=np.uint32).tobytes())
            barrier(cb)
    seen = {"end": outcome(vk.vkEndCommandBuffer, cb), "rounds": []}
    for _ in range(3):
        seen["submit"] = p.submit([cb])[0]
        seen["rounds"].append([p.buffer_words(k).tolist() for k in range(3)])
    secondary, = command_buffers(p.device, p.pool, 1, vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
    begin(secondary, secondary=True)
    vk.vkCmdBindPipeline(secondary, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(secondary, ab)
    p.push(secondary, 5)
    vk.vkCmdDispatch(secondary, N // 64, 1, 1)
    vk.vkCmdCopyBuffer(secondary, b, a, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=SIZE)])
    seen["secondary end"] = outcome(vk.vkEndCommandBuffer, secondary)
    primary, = command_buffers(p.device, p.pool)
    begin(primary)
    vk.vkCmdExecuteCommands(primary, 1, [secondary])
    vk.vkCmdExecuteCommands(primary, 1, [secondary])
    seen["primary end"] = outcome(vk.vkEndCommandBuffer, primary)
    seen["primary submit"] = p.submit([primary])[0]
    seen["after secondary"] = [p.buffer_words(k).tolist() for k in range(2)]
    long, = command_buffers(p.device, p.pool)
    begin(long)
    vk.vkCmdBindPipeline(long, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    for k in range(1100):  # two lists: 1024 and 76 dispatches
        p.bind(long, ab if k % 2 == 0 else ba)
        p.push(long, k)
        vk.vkCmdDispatch(long, N // 64, 1, 1)
    seen["long end"] = outcome(vk.vkEndCommandBuffer, long)
    seen["long submit"] = p.submit([long])[0]
    seen["after long"] = [p.buffer_words(k).tolist() for k in range(2)]
    p.close()
    return seen


def dynamic(spv: bytes) -> dict:
    p = Program(spv, 2, DYNAMIC)
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32)
    made = p.new_set({0: (0, 0), 1: (1, 0)}, DYNAMIC)
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    for offset, add in ((0, 7), (SIZE, 11)):
        p.bind(cb, made, [offset])
        p.push(cb, add)
        vk.vkCmdDispatch(cb, N // 64, 1, 1)
    seen = {"end": outcome(vk.vkEndCommandBuffer, cb), "submit": p.submit([cb])[0]}
    first = p.step // 4 * 1
    seen["output"] = p.words[first:first + 2 * N].tolist()
    p.close()
    return seen


def extras(spv: bytes) -> dict:
    """An indirect dispatch, VK_KHR_synchronization2's barrier and events, and vkCmdSetEvent/ResetEvent."""
    p = Program(spv, 3, extension="VK_KHR_synchronization2")
    barrier2 = vk.vkGetDeviceProcAddr(p.device, "vkCmdPipelineBarrier2KHR")
    set_event2 = vk.vkGetDeviceProcAddr(p.device, "vkCmdSetEvent2KHR")
    wait_events2 = vk.vkGetDeviceProcAddr(p.device, "vkCmdWaitEvents2KHR")
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32)
    p.buffer_words(2)[4:7] = [N // 64, 1, 1]  # the indirect dispatch's counts, at byte 16
    ab = p.new_set({0: (0, 0), 1: (1, 0)})
    first, second = vk.vkCreateEvent(p.device, vk.VkEventCreateInfo(), None), \
        vk.vkCreateEvent(p.device, vk.VkEventCreateInfo(), None)
    vk.vkSetEvent(p.device, second)
    dependency = vk.VkDependencyInfo(memoryBarrierCount=1, pMemoryBarriers=[vk.VkMemoryBarrier2(
        srcStageMask=vk.VK_PIPELINE_STAGE_2_ALL_COMMANDS_BIT, dstStageMask=vk.VK_PIPELINE_STAGE_2_ALL_COMMANDS_BIT)])
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(cb, ab)
    p.push(cb, 9)
    vk.vkCmdDispatchIndirect(cb, p.buffers[2], 16)
    barrier2(cb, dependency)
    vk.vkCmdCopyBuffer(cb, p.buffers[1], p.buffers[0], 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=SIZE)])
    set_event2(cb, first, dependency)
    wait_events2(cb, 1, [first], [dependency])
    vk.vkCmdResetEvent(cb, second, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT)
    seen = {"end": outcome(vk.vkEndCommandBuffer, cb), "events before": [
        outcome(vk.vkGetEventStatus, p.device, first), outcome(vk.vkGetEventStatus, p.device, second)]}
    seen["submit"] = p.submit([cb])[0]
    seen["events after"] = [outcome(vk.vkGetEventStatus, p.device, e) for e in (first, second)]
    seen["output"] = [p.buffer_words(k).tolist() for k in range(2)]
    p.buffer_words(2)[:] = 0
    based, = command_buffers(p.device, p.pool)  # workgroups 2..4 alone: A to C
    begin(based)
    vk.vkCmdBindPipeline(based, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(based, p.new_set({0: (0, 0), 1: (2, 0)}))
    p.push(based, 4)
    vk.vkCmdDispatchBase(based, 2, 0, 0, 3, 1, 1)
    seen["base end"] = outcome(vk.vkEndCommandBuffer, based)
    seen["base submit"] = p.submit([based])[0]
    seen["based"] = p.buffer_words(2).tolist()
    p.close()
    return seen


def one_dispatch(p: Program, cb, made, add: int) -> None:
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(cb, made)
    p.push(cb, add)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)


def shared(spv: bytes) -> dict:
    p = Program(spv, 3)
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32)
    ab = p.new_set({0: (0, 0), 1: (1, 0)})
    alike = command_buffers(p.device, p.pool, 100)
    for cb in alike:
        begin(cb)
        one_dispatch(p, cb, ab, 1)
    seen = {"alike ended": [outcome(vk.vkEndCommandBuffer, cb) for cb in alike].count("ok"),
            "alike submitted": p.submit(alike)[0], "alike": p.buffer_words(1).tolist()}
    secondary, = command_buffers(p.device, p.pool, 1, vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
    begin(secondary, secondary=True)
    one_dispatch(p, secondary, p.new_set({0: (0, 0), 1: (2, 0)}), 5)  # its own group: A -> C
    vk.vkEndCommandBuffer(secondary)
    primary, = command_buffers(p.device, p.pool)
    begin(primary)
    vk.vkCmdExecuteCommands(primary, 1, [secondary])
    seen["primary end"] = outcome(vk.vkEndCommandBuffer, primary)
    vk.vkFreeCommandBuffers(p.device, p.pool, 1, [secondary])
    seen["primary submitted"] = p.submit([primary])[0]
    seen["primary"] = p.buffer_words(2).tolist()
    seen["again"] = []
    for add in (7, 9):  # the same recording over a fresh memory each time, the last one freed first
        buffer, memory = make_buffer(p.device, SIZE), allocate(p.device, p.step, p.host)
        vk.vkBindBufferMemory(p.device, buffer, memory, 0)
        made = p.new_set({0: (0, 0), 1: (0, 0)})
        vk.vkUpdateDescriptorSets(p.device, 1, [vk.VkWriteDescriptorSet(
            dstSet=made, dstBinding=1, descriptorCount=1, descriptorType=STORAGE,
            pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=buffer, offset=0, range=SIZE)])], 0, None)
        cb, = command_buffers(p.device, p.pool)
        begin(cb)
        one_dispatch(p, cb, made, add)
        answers = [outcome(vk.vkEndCommandBuffer, cb), p.submit([cb])[0]]
        words = vk.vkMapMemory(p.device, memory, 0, SIZE, 0)
        seen["again"].append([answers, np.frombuffer(words, np.uint32).tolist()])
        vk.vkUnmapMemory(p.device, memory)
        vk.vkFreeCommandBuffers(p.device, p.pool, 1, [cb])
        vk.vkDestroyBuffer(p.device, buffer, None)
        vk.vkFreeMemory(p.device, memory, None)
    p.close()
    return seen


def recorded(p: Program, record) -> str:
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    record(cb)
    return outcome(vk.vkEndCommandBuffer, cb)


def gated(p: Program, cb, gate):
    """Submit ``cb`` to wait until timeline semaphore ``gate`` reaches 1 (the host signals it): pending until
    then, whatever the device's speed. What vkQueueSubmit answered, and the submission's fence."""
    fence = vk.vkCreateFence(p.device, vk.VkFenceCreateInfo(), None)
    values = vk.VkTimelineSemaphoreSubmitInfo(waitSemaphoreValueCount=1, pWaitSemaphoreValues=[1])
    info = vk.VkSubmitInfo(pNext=values, waitSemaphoreCount=1, pWaitSemaphores=[gate],
                           pWaitDstStageMask=[vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT], commandBufferCount=1,
                           pCommandBuffers=[cb])
    return outcome(vk.vkQueueSubmit, p.queue, 1, [info], fence), fence


def hostile(spv: bytes) -> dict:
    p = Program(spv, 3, extension="VK_KHR_timeline_semaphore")
    half = p.new_set({0: (0, 0)})  # binding 1 never written
    ab = p.new_set({0: (0, 0), 1: (1, 0)})
    seen = {
        "unwritten descriptor": recorded(p, lambda cb: (p.bind(cb, half), vk.vkCmdDispatch(cb, 1, 1, 1))),
        "no set bound": recorded(p, lambda cb: vk.vkCmdDispatch(cb, 1, 1, 1)),
        "dispatch base past the limit": recorded(p, lambda cb: (p.bind(cb, ab),
                                                                vk.vkCmdDispatchBase(cb, 0xFFFFFFFF, 0, 0, 1, 1, 1))),
    }
    busy, = command_buffers(p.device, p.pool)
    begin(busy)
    vk.vkCmdBindPipeline(busy, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(busy, ab)
    for k in range(200):
        p.push(busy, k)
        vk.vkCmdDispatch(busy, N // 64, 1, 1)
    vk.vkEndCommandBuffer(busy)
    gate = vk.vkCreateSemaphore(p.device, vk.VkSemaphoreCreateInfo(pNext=vk.VkSemaphoreTypeCreateInfo(
        semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=0)), None)
    first, fence = gated(p, busy, gate)
    seen["submitted"] = first
    seen["submitted again while pending"] = p.submit([busy], wait=False)[0]
    vk.vkGetDeviceProcAddr(p.device, "vkSignalSemaphoreKHR")(p.device, vk.VkSemaphoreSignalInfo(semaphore=gate,
                                                                                                value=1))
    seen["first waited"] = outcome(vk.vkWaitForFences, p.device, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)
    unmapped = vk.ffi.cast("VkCommandBuffer", 0x1000)  # no command buffer: following it would crash
    seen["not a command buffer"] = p.submit([unmapped])[0]
    # A buffer whose memory is freed while a recorded command buffer still names it.
    doomed_buffer = make_buffer(p.device, SIZE)
    doomed = allocate(p.device, p.step, p.host)
    vk.vkBindBufferMemory(p.device, doomed_buffer, doomed, 0)
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdFillBuffer(cb, doomed_buffer, 0, SIZE, 9)
    vk.vkCmdFillBuffer(cb, p.buffers[2], 0, SIZE, 9)
    seen["freed end"] = outcome(vk.vkEndCommandBuffer, cb)
    vk.vkDestroyBuffer(p.device, doomed_buffer, None)
    vk.vkFreeMemory(p.device, doomed, None)
    seen["freed submit"] = p.submit([cb])[0]
    p.close()
    return seen


def main() -> None:
    with open(sys.argv[2], "rb") as spv:
        code = spv.read()
    mode = {"chain": chain, "dynamic": dynamic, "extras": extras, "shared": shared, "hostile": hostile}[sys.argv[1]]
    print(json.dumps(mode(code)), flush=True)


if __name__ == "__main__":
    main()
