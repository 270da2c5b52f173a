"""An unmodified Vulkan program on the ``vulkan`` bindings: command pools and command buffers.

``python _commands.py MODE`` prints one JSON line of what Vulkan answered (an error by its class name):

- ``lists``: command buffers of copies, fills, updates and barriers ended (the arbiter loads their
  lists); one of 1500 commands (two lists); a secondary command buffer executed by a primary; pools
  reset, trimmed and destroyed with their command buffers.
- ``quota``: command buffers of 1024 fills each (each a different value) ended until the arbiter's bound
  on a session's list commands refuses one; then one freed, and another ended; then, the pool
  destroyed, 300 command buffers of one fill each, all held at once.
- ``rerecord``: Kompute's way of recording again: one command buffer of a pool without
  ``RESET_COMMAND_BUFFER_BIT`` begun again after each submission (an implicit reset Vulkan forbids and
  drivers allow), a fill of another value each time, submitted and read back; then reset explicitly
  and recorded again for one submission, and submitted twice; a fill of 10 bytes, and an update and
  a copy region of 0 bytes (rounded and skipped, as lavapipe does); and begun while pending (a
  timeline semaphore holds its submission): refused.
- ``hostile``: wrong use while recording (a copy past a buffer, a fill at an offset not of words, an
  update past 65536 bytes, a wrong buffer, a dispatch with no pipeline, a graphics bind point, a buffer destroyed
  before its command, a secondary that is not executable), an end twice; then an honest command
  buffer still ends.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _memory import allocate, make_buffer, open_device, outcome  # noqa: E402
from _queue import STAGE, Timeline  # noqa: E402

WHOLE_SIZE = (1 << 64) - 1  # VK_WHOLE_SIZE (the bindings spell it -1)
RESETTABLE = vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT


def make_pool(device, flags=RESETTABLE):
    return vk.vkCreateCommandPool(device, vk.VkCommandPoolCreateInfo(flags=flags, queueFamilyIndex=0), None)


def command_buffers(device, pool, count=1, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY):
    return vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
        commandPool=pool, level=level, commandBufferCount=count))


def begin(cb, flags=0, secondary=False):
    inheritance = vk.VkCommandBufferInheritanceInfo() if secondary else None
    vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(flags=flags, pInheritanceInfo=inheritance))


def end(cb):
    return outcome(vk.vkEndCommandBuffer, cb)


def bound_buffers(device, host, count, size):
    """``count`` buffers of ``size`` bytes bound side by side in one host-visible memory."""
    buffers = [make_buffer(device, size) for _ in range(count)]
    step = vk.vkGetBufferMemoryRequirements(device, buffers[0]).size
    memory = allocate(device, step * count, host)
    for k, buffer in enumerate(buffers):
        vk.vkBindBufferMemory(device, buffer, memory, k * step)
    return memory, buffers


def barrier(cb):
    vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0,
                            0, None, 0, None, 0, None)


def update(cb, buffer, offset, data: bytes):
    vk.vkCmdUpdateBuffer(cb, buffer, offset, len(data), vk.ffi.from_buffer(data))


def transfers(cb, a, b):
    vk.vkCmdFillBuffer(cb, a, 0, WHOLE_SIZE, 7)
    barrier(cb)
    update(cb, a, 16, bytes(range(200)))
    vk.vkCmdCopyBuffer(cb, a, b, 2, [vk.VkBufferCopy(srcOffset=0, dstOffset=64, size=256),
                                     vk.VkBufferCopy(srcOffset=512, dstOffset=0, size=4)])


def lists() -> dict:
    instance, device, host = open_device()
    memory, (a, b) = bound_buffers(device, host, 2, 4096)
    pool = make_pool(device)
    seen = {}
    first, big = command_buffers(device, pool, 2)
    begin(first)
    transfers(first, a, b)
    seen["transfers"] = end(first)
    begin(big, vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
    for k in range(1500):
        vk.vkCmdFillBuffer(big, a, 4 * (k % 1024), 4, k)
    seen["1500 commands"] = end(big)
    seen["empty"] = (begin(first), end(first))[1]  # an implicit reset: the pool allows it
    secondary, = command_buffers(device, pool, 1, vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
    begin(secondary, secondary=True)
    transfers(secondary, a, b)
    seen["secondary"] = end(secondary)
    primary, = command_buffers(device, pool)
    begin(primary)
    vk.vkCmdExecuteCommands(primary, 1, [secondary])
    vk.vkCmdExecuteCommands(primary, 1, [secondary])
    seen["executes"] = end(primary)
    seen["reset"] = outcome(vk.vkResetCommandBuffer, big, 0)
    seen["pool reset"] = outcome(vk.vkResetCommandPool, device, pool, 0)
    vk.vkTrimCommandPool(device, pool, 0)
    begin(first)
    transfers(first, a, b)
    seen["after pool reset"] = end(first)
    vk.vkFreeCommandBuffers(device, pool, 2, [first, big])
    vk.vkDestroyCommandPool(device, pool, None)  # with the secondary and the primary still in it
    for buffer in (a, b):
        vk.vkDestroyBuffer(device, buffer, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def close(instance, device, pool, buffer, memory) -> None:
    """Destroy ``pool``, ``buffer``, ``memory``, the device and the instance."""
    vk.vkDestroyCommandPool(device, pool, None)
    vk.vkDestroyBuffer(device, buffer, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)


def held_until_refused(device, pool, a, count: int, fills: int) -> tuple[list, list]:
    """``count`` command buffers of ``fills`` fills each, every one of its own content (the driver shares
    identical lists), ended and held: them, and what vkEndCommandBuffer answered each."""
    held, answers = [], []
    for k in range(count):
        cb, = command_buffers(device, pool)
        begin(cb)
        for j in range(fills):
            vk.vkCmdFillBuffer(cb, a, 0, 4, k * fills + j)
        answers.append(end(cb))
        held.append(cb)
    return held, answers


def quota() -> dict:
    instance, device, host = open_device()
    memory, (a,) = bound_buffers(device, host, 1, 4096)
    pool = make_pool(device)
    held, answers = held_until_refused(device, pool, a, 68, 1024)  # lists of the longest
    refused = answers.index("VkErrorOutOfDeviceMemory") if "VkErrorOutOfDeviceMemory" in answers else None
    vk.vkFreeCommandBuffers(device, pool, 1, [held[0]])
    again, = command_buffers(device, pool)
    begin(again)
    vk.vkCmdFillBuffer(again, a, 0, 4, 1 << 20)
    seen = {"ended": answers.count("ok"), "first refused": refused, "after a free": end(again)}
    vk.vkResetCommandPool(device, pool, vk.VK_COMMAND_POOL_RESET_RELEASE_RESOURCES_BIT)
    vk.vkDestroyCommandPool(device, pool, None)
    pool = make_pool(device)
    short = held_until_refused(device, pool, a, 300, 1)[1]  # lists of one command: more than 64 live at once
    seen["short ended"] = short.count("ok")
    close(instance, device, pool, a, memory)
    return seen


def recorded(device, pool, record) -> str:
    """What vkEndCommandBuffer answers for a command buffer ``record(cb)`` recorded."""
    cb, = command_buffers(device, pool)
    begin(cb)
    record(cb)
    return end(cb)


def hostile() -> dict:
    instance, device, host = open_device()
    memory, (a, b) = bound_buffers(device, host, 2, 4096)
    doomed = make_buffer(device, 4096)  # never bound
    pool = make_pool(device)
    wrong_buffer = vk.ffi.cast("VkBuffer", 0x0100_0000_0000_0001)
    wrong_pipeline = vk.ffi.cast("VkPipeline", 0x0900_0000_0000_0001)
    secondary, = command_buffers(device, pool, 1, vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)  # never recorded
    seen = {
        "copy past a buffer": recorded(device, pool, lambda cb: vk.vkCmdCopyBuffer(
            cb, a, b, 1, [vk.VkBufferCopy(srcOffset=4000, dstOffset=0, size=200)])),
        "copy of size 0": recorded(device, pool, lambda cb: vk.vkCmdCopyBuffer(
            cb, a, b, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=0)])),
        "fill not of words": recorded(device, pool, lambda cb: vk.vkCmdFillBuffer(cb, a, 2, 8, 0)),
        "fill past a buffer": recorded(device, pool, lambda cb: vk.vkCmdFillBuffer(cb, a, 4092, 8, 0)),
        "update past 65536 bytes": recorded(device, pool, lambda cb: update(cb, a, 0, bytes(65540))),
        "wrong buffer": recorded(device, pool, lambda cb: vk.vkCmdFillBuffer(cb, wrong_buffer, 0, 4, 0)),
        "unbound buffer": recorded(device, pool, lambda cb: vk.vkCmdFillBuffer(cb, doomed, 0, 4, 0)),
        "dispatch with no pipeline": recorded(device, pool, lambda cb: vk.vkCmdDispatch(cb, 1, 1, 1)),
        "indirect dispatch with no pipeline": recorded(device, pool, lambda cb: vk.vkCmdDispatchIndirect(cb, a, 0)),
        "wrong pipeline": recorded(device, pool, lambda cb: vk.vkCmdBindPipeline(
            cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, wrong_pipeline)),
        "graphics bind point": recorded(device, pool, lambda cb: vk.vkCmdBindPipeline(
            cb, vk.VK_PIPELINE_BIND_POINT_GRAPHICS, wrong_pipeline)),
        "push constants past 128 bytes": recorded(device, pool, lambda cb: vk.vkCmdPushConstants(
            cb, vk.ffi.cast("VkPipelineLayout", 0), vk.VK_SHADER_STAGE_COMPUTE_BIT, 124, 8, vk.ffi.new("char[8]"))),
        "secondary not executable": recorded(device, pool, lambda cb: vk.vkCmdExecuteCommands(cb, 1, [secondary])),
    }
    destroyed = make_buffer(device, 4096)
    vk.vkBindBufferMemory(device, destroyed, memory, 0)
    vk.vkDestroyBuffer(device, destroyed, None)
    seen["destroyed buffer"] = recorded(device, pool, lambda cb: vk.vkCmdFillBuffer(cb, destroyed, 0, 4, 0))
    fixed = make_pool(device, 0)  # no RESET_COMMAND_BUFFER_BIT
    cb, = command_buffers(device, fixed)
    begin(cb)
    vk.vkCmdFillBuffer(cb, a, 0, 4, 0)
    seen["ended"] = end(cb)
    seen["ended twice"] = end(cb)
    seen["pool reset"] = outcome(vk.vkResetCommandPool, device, fixed, 0)  # allowed: the pool's own reset
    seen["begin after the pool reset"] = outcome(begin, cb)
    vk.vkFreeCommandBuffers(device, pool, 1, [cb])  # not this pool's: nothing happens
    seen["still there"] = end(cb)
    honest, = command_buffers(device, pool)
    begin(honest)
    transfers(honest, a, b)
    seen["honest"] = end(honest)
    vk.vkDestroyCommandPool(device, fixed, None)
    vk.vkDestroyCommandPool(device, pool, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def submitted(device, queue, cb, memory) -> list:
    """What ``cb``'s submission left in the first 4 words of host-visible ``memory``, once its fence
    signaled."""
    done = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
    vk.vkQueueSubmit(queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], done)
    vk.vkWaitForFences(device, 1, [done], vk.VK_TRUE, 60 * 10**9)
    vk.vkDestroyFence(device, done, None)
    mapped = vk.vkMapMemory(device, memory, 0, 16, 0)
    words = list(memoryview(bytes(mapped[:16])).cast("I"))
    vk.vkUnmapMemory(device, memory)
    return words


def rerecord() -> dict:
    instance, device, host = open_device("VK_KHR_timeline_semaphore")
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    memory, (a,) = bound_buffers(device, host, 1, 4096)
    fixed = make_pool(device, 0)  # no RESET_COMMAND_BUFFER_BIT, as Kompute's sequences
    cb, = command_buffers(device, fixed)
    seen = {"begun again": [], "filled": []}
    for value in (5, 9, 13):
        seen["begun again"].append(outcome(begin, cb))  # the first from initial, the others implicit resets
        vk.vkCmdFillBuffer(cb, a, 0, WHOLE_SIZE, value)
        end(cb)
        seen["filled"].append(submitted(device, queue, cb, memory))
    seen["reset"] = outcome(vk.vkResetCommandBuffer, cb, 0)
    begin(cb, vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
    vk.vkCmdFillBuffer(cb, a, 4, 8, 21)
    end(cb)
    seen["after the reset"] = submitted(device, queue, cb, memory)
    # a one-time command buffer submitted again (Vulkan forbids it, lavapipe runs it): its fill again
    mapped = vk.vkMapMemory(device, memory, 0, 16, 0)
    mapped[:16] = bytes(16)
    vk.vkUnmapMemory(device, memory)
    seen["one-time again"] = submitted(device, queue, cb, memory)
    begin(cb)  # a fill of 10 bytes, empty update and copy (Vulkan forbids them; lavapipe fills 2 words, no more)
    vk.vkCmdFillBuffer(cb, a, 0, 16, 0)
    vk.vkCmdFillBuffer(cb, a, 0, 10, 0x33)
    update(cb, a, 8, b"")  # 0 bytes: nothing written
    vk.vkCmdCopyBuffer(cb, a, a, 2, [vk.VkBufferCopy(srcOffset=0, dstOffset=8, size=0),
                                     vk.VkBufferCopy(srcOffset=0, dstOffset=12, size=4)])
    end(cb)
    seen["rounded fill and empty region"] = submitted(device, queue, cb, memory)
    timeline = Timeline(device)
    gate = timeline.make(0)
    done = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
    values = vk.VkTimelineSemaphoreSubmitInfo(waitSemaphoreValueCount=1, pWaitSemaphoreValues=[1])
    vk.vkQueueSubmit(queue, 1, [vk.VkSubmitInfo(
        pNext=values, waitSemaphoreCount=1, pWaitSemaphores=[gate], pWaitDstStageMask=[STAGE],
        commandBufferCount=1, pCommandBuffers=[cb])], done)
    seen["begun while pending"] = outcome(begin, cb)
    seen["reset while pending"] = outcome(vk.vkResetCommandBuffer, cb, 0)
    timeline.signal_to(gate, 1)
    vk.vkWaitForFences(device, 1, [done], vk.VK_TRUE, 60 * 10**9)
    seen["begun once done"] = outcome(begin, cb)
    vk.vkDestroyFence(device, done, None)
    vk.vkDestroySemaphore(device, gate, None)
    close(instance, device, fixed, a, memory)
    return seen


def main() -> None:
    modes = {"lists": lists, "quota": quota, "rerecord": rerecord, "hostile": hostile}
    print(json.dumps(modes[sys.argv[1]]()), flush=True)


if __name__ == "__main__":
    main()
