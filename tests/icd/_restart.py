"""An unmodified Vulkan program on the ``vulkan`` bindings that lives through its arbiter's death.

``python _restart.py MODE SPV`` (SPV: step.comp compiled, see test_commands.py): a device, host-visible
memory holding three buffers A, B, C, step.comp's pipeline (B = A * SCALE + add), and one command
buffer of one dispatch. It submits it and waits, writes a new A and a pattern in C, and prints one
JSON line (B after the first submission); then it waits for a line on stdin (the test kills the
arbiter meanwhile) and submits the same command buffer again, and prints a second JSON line: what
the submission and its fence's wait answered, B and C. MODE ``survive``: that alone; ``device``:
it holds device-local memory too, filled before the kill and copied to host-visible memory after it
(``D``: on a CPU device the same pages, on a GPU lost); ``flight``: after the first line it submits without waiting (the
test stopped the arbiter), prints what vkQueueSubmit answered, and after a second line on stdin (the
arbiter killed) waits on that submission's fence before going on; ``taken``: the same, but what it
submits is a long command buffer (FILLS fills of a 64 MiB buffer) that the arbiter takes and is
killed running (or hands over running: ``libshare-control restart``), then the command buffer behind it. Last, a new command buffer (B to C,
add 8) is recorded and submitted; C after it is printed too. ``control``: as ``survive``, but that
command buffer is recorded (vkEndCommandBuffer: a control request) before the first submission after
the restart. It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import begin, command_buffers, end  # noqa: E402
from _dispatches import N, Program  # noqa: E402
from _memory import allocate, make_buffer, outcome  # noqa: E402

ADD = 7
FILL = 0x0D0D0D0D
FILLS = 256


def bound(p: Program, host: bool):
    """A 4096-byte buffer in memory of its own, host-visible or device-local."""
    buffer = make_buffer(p.device, 4096)
    memory = allocate(p.device, 4096, p.host if host else 1 - p.host)
    vk.vkBindBufferMemory(p.device, buffer, memory, 0)
    return buffer, memory


def transfer(p: Program, record) -> str:
    """A one-time command buffer ``record(cb)`` recorded, submitted and waited on."""
    cb = command_buffers(p.device, p.pool)[0]
    begin(cb)
    record(cb)
    ended = end(cb)
    return ended if ended != "ok" else p.submit([cb])[0]


def record_later(p: Program):
    """A command buffer recorded after the restart (B to C, add 8): new ids above the kept ones."""
    later = command_buffers(p.device, p.pool)[0]
    begin(later)
    vk.vkCmdBindPipeline(later, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(later, p.new_set({0: (1, 0), 1: (2, 0)}))
    p.push(later, ADD + 1)
    vk.vkCmdDispatch(later, N // 64, 1, 1)
    return later, end(later)


def filling(p: Program):
    """A command buffer of FILLS fills of a 64 MiB host-visible buffer: long enough to be killed in."""
    buffer = make_buffer(p.device, 64 << 20)
    memory = allocate(p.device, 64 << 20, p.host)
    vk.vkBindBufferMemory(p.device, buffer, memory, 0)
    cb = command_buffers(p.device, p.pool)[0]
    begin(cb)
    for k in range(FILLS):
        vk.vkCmdFillBuffer(cb, buffer, 0, 64 << 20, k)
    end(cb)
    return cb


def main() -> None:
    mode, spv = sys.argv[1], open(sys.argv[2], "rb").read()
    p = Program(spv, 3)
    if mode == "device":
        local, _ = bound(p, host=False)
        transfer(p, lambda cb: vk.vkCmdFillBuffer(cb, local, 0, 4096, FILL))
    made = p.new_set({0: (0, 0), 1: (1, 0)})
    cb = command_buffers(p.device, p.pool)[0]
    begin(cb)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    p.bind(cb, made)
    p.push(cb, ADD)
    vk.vkCmdDispatch(cb, N // 64, 1, 1)
    first = {"end": end(cb)}
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32)
    first["submit"], _ = p.submit([cb])
    first["B"] = p.buffer_words(1).tolist()
    p.buffer_words(0)[:] = np.arange(N, dtype=np.uint32) * 5 + 1  # written before the restart
    p.buffer_words(2)[:] = np.arange(N, dtype=np.uint32) ^ 0x5A5A
    print(json.dumps(first), flush=True)
    sys.stdin.readline()  # the arbiter is killed (and replaced, under a control daemon), or stopped
    second = {}
    if mode in ("flight", "taken"):  # never taken (the arbiter stopped), or taken and running at the kill
        long = cb if mode == "flight" else filling(p)
        fence = vk.vkCreateFence(p.device, vk.VkFenceCreateInfo(), None)
        answers = [outcome(vk.vkQueueSubmit, p.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1,
                                                                            pCommandBuffers=[long])], fence)]
        if mode == "taken":  # and the dispatch behind it, which waits for it
            answers.append(outcome(vk.vkQueueSubmit, p.queue, 1, [vk.VkSubmitInfo(
                commandBufferCount=1, pCommandBuffers=[cb])], None))
        print(json.dumps({"submit": answers}), flush=True)
        sys.stdin.readline()  # killed now
        second["wait"] = outcome(vk.vkWaitForFences, p.device, 1, [fence], vk.VK_TRUE, 60 * 10 ** 9)
    if mode == "control":  # a control request (vkEndCommandBuffer's load_list) meets the restart first
        later, second["later end"] = record_later(p)
    started = time.monotonic()
    second["submit"], fence = p.submit([cb])
    second["seconds"] = time.monotonic() - started  # (reported, for a reader: the move included)
    second["again"], _ = p.submit([cb])  # (lost stays lost; moved goes on)
    second["B"], second["C"] = p.buffer_words(1).tolist(), p.buffer_words(2).tolist()
    if mode == "device":
        readback, memory = bound(p, host=True)
        second["copy"] = transfer(p, lambda cb: vk.vkCmdCopyBuffer(cb, local, readback, 1, [vk.VkBufferCopy(
            srcOffset=0, dstOffset=0, size=4096)]))
        second["D"] = np.frombuffer(vk.vkMapMemory(p.device, memory, 0, 4096, 0), np.uint32).tolist()
    if mode != "control":
        later, second["later end"] = record_later(p)
    second["later"] = p.submit([later])[0]
    second["C later"] = p.buffer_words(2).tolist()
    print(json.dumps(second), flush=True)
    p.close()


if __name__ == "__main__":
    main()
