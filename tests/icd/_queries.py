"""An unmodified Vulkan program on the ``vulkan`` bindings: timestamp query pools.

``python _queries.py MODE`` prints one JSON line of what Vulkan answered (an error by its class name):

- ``pools``: pools of each query type made (timestamps alone offered); a new pool's results read
  without and with availability and partial results; command buffers that reset the pool, write
  timestamps around copies and copy the results (64- and 32-bit, with availability) ended (the
  arbiter loads their lists); then wrong use while recording (queries outside the pool, a wrong pool,
  a copy misaligned, past its buffer, or of several queries with a stride of 0, begin and end query)
  and while reading (a wrong pool, a stride or data too small, a destroyed pool); then an honest
  command buffer still ends.
- ``submitted``: a command buffer that resets the pool, writes timestamps around a chain of copies
  and copies the results (64-bit with availability, 32-bit with availability, 64-bit alone) into a
  buffer, submitted twice; the first time vkGetQueryPoolResults with WAIT_BIT at once (before the
  fence); each time, after the fence, with WAIT_BIT, without it, 64- and 32-bit, and the copied results
  read; then WAIT_BIT on queries never written.
- ``dispatches SPV``: timestamps around a chain of 40 dispatches (step.comp, as _dispatches.py's chain),
  one every 10, their results read and copied, and the buffers printed for numpy to check.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import vulkan as vk

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _commands import WHOLE_SIZE, begin, bound_buffers, command_buffers, end, make_pool, recorded  # noqa: E402
from _memory import open_device, outcome  # noqa: E402

QUERIES = 8
WIDE = vk.VK_QUERY_RESULT_64_BIT
AVAILABILITY = vk.VK_QUERY_RESULT_WITH_AVAILABILITY_BIT


def query_pool(device, kind=vk.VK_QUERY_TYPE_TIMESTAMP, count=QUERIES):
    return vk.vkCreateQueryPool(device, vk.VkQueryPoolCreateInfo(queryType=kind, queryCount=count), None)


def results(device, pool, first, count, flags, stride=16, size=None):
    """vkGetQueryPoolResults' answer and the words of its data (64-bit words, or 32-bit without WIDE), each
    0xab... where it wrote nothing."""
    size = stride * count if size is None else size
    data = vk.ffi.new("char[]", b"\xab" * max(size, 1))  # a byte no result is made of: what was left alone
    answer = outcome(vk.vkGetQueryPoolResults, device, pool, first, count, size, data, stride, flags)
    kind = "uint64_t *" if flags & WIDE else "uint32_t *"
    words = vk.ffi.cast(kind, data)
    return answer, [int(words[k]) for k in range(size // vk.ffi.sizeof(kind[:-2]))]


def stamps(cb, pool, a, b):
    """A reset, then timestamps around copies, then the results copied into ``b``: 64-bit with
    availability at 0, 32-bit with availability at 256."""
    vk.vkCmdResetQueryPool(cb, pool, 0, QUERIES)
    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0)
    vk.vkCmdCopyBuffer(cb, a, b, 1, [vk.VkBufferCopy(srcOffset=0, dstOffset=1024, size=1024)])
    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 1)
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 2, b, 0, 16, WIDE | AVAILABILITY | vk.VK_QUERY_RESULT_WAIT_BIT)
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 2, b, 256, 8, AVAILABILITY)


def pools() -> dict:
    instance, device, host = open_device()
    memory, (a, b) = bound_buffers(device, host, 2, 4096)
    seen = {
        "occlusion": outcome(query_pool, device, vk.VK_QUERY_TYPE_OCCLUSION),
        "pipeline statistics": outcome(query_pool, device, vk.VK_QUERY_TYPE_PIPELINE_STATISTICS),
        "no queries": outcome(query_pool, device, vk.VK_QUERY_TYPE_TIMESTAMP, 0),
    }
    pool = query_pool(device)
    seen["new, waiting for none"] = results(device, pool, 0, QUERIES, WIDE, 8)
    seen["new, with availability"] = results(device, pool, 0, 2, WIDE | AVAILABILITY)
    seen["new, partial"] = results(device, pool, 6, 2, AVAILABILITY | vk.VK_QUERY_RESULT_PARTIAL_BIT, 8)
    cpool = make_pool(device)
    seen["recorded"] = recorded(device, cpool, lambda cb: stamps(cb, pool, a, b))
    secondary, = command_buffers(device, cpool, 1, vk.VK_COMMAND_BUFFER_LEVEL_SECONDARY)
    begin(secondary, secondary=True)
    stamps(secondary, pool, a, b)
    seen["secondary"] = end(secondary)
    wrong = vk.ffi.cast("VkQueryPool", 0x0F00_0000_0000_0001)
    hostile = {
        "reset past the pool": lambda cb: vk.vkCmdResetQueryPool(cb, pool, 4, QUERIES),
        "reset of none": lambda cb: vk.vkCmdResetQueryPool(cb, pool, 0, 0),
        "timestamp past the pool": lambda cb: vk.vkCmdWriteTimestamp(
            cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, QUERIES),
        "timestamp into a wrong pool": lambda cb: vk.vkCmdWriteTimestamp(
            cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, wrong, 0),
        "copy of queries past the pool": lambda cb: vk.vkCmdCopyQueryPoolResults(cb, pool, 7, 2, b, 0, 16, WIDE),
        "copy past the buffer": lambda cb: vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 2, b, 4088, 16, WIDE),
        "copy misaligned": lambda cb: vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 1, b, 4, 8, WIDE),
        "copy with a stride of 0": lambda cb: vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 2, b, 0, 0, WIDE),
        "copy with a stride too small": lambda cb: vk.vkCmdCopyQueryPoolResults(
            cb, pool, 0, 2, b, 0, 8, WIDE | AVAILABILITY),
        "begin query": lambda cb: vk.vkCmdBeginQuery(cb, pool, 0, 0),
        "end query": lambda cb: vk.vkCmdEndQuery(cb, pool, 0),
    }
    for what, record in hostile.items():
        seen[what] = recorded(device, cpool, record)
    seen["results of a wrong pool"] = results(device, wrong, 0, 1, WIDE, 8)[0]
    seen["results past the pool"] = results(device, pool, 4, QUERIES, WIDE, 8)[0]
    seen["results into too little"] = results(device, pool, 0, 2, WIDE, 8, 12)[0]
    seen["results misaligned"] = results(device, pool, 0, 2, WIDE, 12)[0]
    vk.vkDestroyQueryPool(device, pool, None)
    seen["results of a destroyed pool"] = results(device, pool, 0, 1, WIDE, 8)[0]
    seen["timestamp into a destroyed pool"] = recorded(device, cpool, lambda cb: vk.vkCmdWriteTimestamp(
        cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 0))
    again = query_pool(device)
    seen["honest"] = recorded(device, cpool, lambda cb: stamps(cb, again, a, b))
    vk.vkDestroyQueryPool(device, again, None)
    vk.vkDestroyQueryPool(device, wrong, None)  # a wrong handle: nothing happens
    vk.vkDestroyCommandPool(device, cpool, None)
    for buffer in (a, b):
        vk.vkDestroyBuffer(device, buffer, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def words_of(device, memory, offset, count, kind="uint64_t *") -> list[int]:
    """``count`` words at ``offset`` of host-visible ``memory``, read through a mapping."""
    mapped = vk.vkMapMemory(device, memory, offset, count * 8, 0)
    words = vk.ffi.cast(kind, vk.ffi.from_buffer(mapped))
    size = vk.ffi.sizeof(kind[:-2])
    values = [int(words[k]) for k in range(count)]
    vk.vkUnmapMemory(device, memory)
    return values


def submitted() -> dict:
    instance, device, host = open_device()
    queue = vk.vkGetDeviceQueue(device, 0, 0)
    step = 1 << 20
    memory, (a, b, out) = bound_buffers(device, host, 3, step)
    pool = query_pool(device)
    cpool = make_pool(device)
    cb, = command_buffers(device, cpool)
    begin(cb, vk.VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT)
    vk.vkCmdResetQueryPool(cb, pool, 0, QUERIES)
    vk.vkCmdFillBuffer(cb, a, 0, WHOLE_SIZE, 0x01020304)
    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0)
    for k in range(1, 4):  # a chain: each copy reads what the one before wrote
        vk.vkCmdCopyBuffer(cb, a if k % 2 else b, b if k % 2 else a, 1, [vk.VkBufferCopy(size=step)])
        vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, pool, k)
    flags = WIDE | AVAILABILITY | vk.VK_QUERY_RESULT_WAIT_BIT
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 4, out, 0, 16, flags)  # 64-bit with availability, at 0
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 4, out, 256, 8, AVAILABILITY)  # 32-bit with availability, at 256
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 4, out, 512, 8, WIDE)  # 64-bit alone, at 512
    seen = {"ended": end(cb)}
    fence = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
    runs = []
    for k in range(2):  # the same command buffer twice: new stamps, later ones
        vk.vkResetFences(device, 1, [fence])
        submit = outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])],
                         fence)
        if k == 0:  # WAIT_BIT at once on a new pool's queries: it waits on the queue's completions (the
            seen["waited at once"] = results(device, pool, 0, 4, flags)  # second run's are the first's till reset)
        fenced = outcome(vk.vkWaitForFences, device, 1, [fence], vk.VK_TRUE, 60 * 10**9)
        runs.append({"submit": submit, "waited": results(device, pool, 0, 4, flags), "fence": fenced,
                     "64-bit": results(device, pool, 0, 4, WIDE, 8),
                     "32-bit": results(device, pool, 0, 4, AVAILABILITY, 8),
                     "copied 64-bit": words_of(device, memory, 2 * step, 8),
                     "copied 32-bit": words_of(device, memory, 2 * step + 256, 8, "uint32_t *"),
                     "copied alone": words_of(device, memory, 2 * step + 512, 4),
                     "chain": sorted(set(words_of(device, memory, step, step // 8)))})
    seen["runs"] = runs
    seen["never written"] = results(device, pool, 4, 4, flags)[0]  # nothing queued will write them
    vk.vkDestroyFence(device, fence, None)
    vk.vkDestroyCommandPool(device, cpool, None)
    vk.vkDestroyQueryPool(device, pool, None)
    for buffer in (a, b, out):
        vk.vkDestroyBuffer(device, buffer, None)
    vk.vkFreeMemory(device, memory, None)
    vk.vkDestroyDevice(device, None)
    vk.vkDestroyInstance(instance, None)
    return seen


def dispatches(spv_path: str) -> dict:
    """Timestamps around a chain of 40 dispatches (_dispatches.py's step.comp, ping-pong, push k), one
    every 10, and the results copied after them."""
    from _dispatches import N, Program  # noqa: E402 (the step program's device, buffers and pipeline)

    with open(spv_path, "rb") as f:
        p = Program(f.read(), 3)
    ab, ba = p.new_set({0: (0, 0), 1: (1, 0)}), p.new_set({0: (1, 0), 1: (0, 0)})
    p.buffer_words(0)[:] = range(N)
    pool = query_pool(p.device)
    cb, = command_buffers(p.device, p.pool)
    begin(cb)
    vk.vkCmdResetQueryPool(cb, pool, 0, QUERIES)
    vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
    vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 0)
    for k in range(40):
        p.bind(cb, ab if k % 2 == 0 else ba)
        p.push(cb, k)
        vk.vkCmdDispatch(cb, N // 64, 1, 1)
        if k % 10 == 9:
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, pool, 1 + k // 10)
    vk.vkCmdCopyQueryPoolResults(cb, pool, 0, 5, p.buffers[2], 0, 16, WIDE | AVAILABILITY | vk.VK_QUERY_RESULT_WAIT_BIT)
    seen = {"end": end(cb), "submit": p.submit([cb])[0], "read": results(p.device, pool, 0, 5, WIDE | AVAILABILITY),
            "copied": [int(w) for w in p.buffer_words(2)[:20].view("<u8")], "a": p.buffer_words(0).tolist(),
            "b": p.buffer_words(1).tolist()}
    vk.vkDestroyQueryPool(p.device, pool, None)
    p.close()
    return seen


if __name__ == "__main__":
    modes = {"pools": pools, "submitted": submitted, "dispatches": dispatches}
    print(json.dumps(modes[sys.argv[1]](*sys.argv[2:])), flush=True)
