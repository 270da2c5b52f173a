"""An unmodified Vulkan program on the ``vulkan`` bindings: submissions, fences, semaphores and events.

``python _queue.py MODE`` prints one JSON line of what Vulkan answered (an error by its class name):

- ``honest``: a device with VK_KHR_timeline_semaphore; COUNT empty submissions, each with a fence,
  waited one by one; a binary semaphore signaled by one submission and waited by the next; a timeline
  semaphore whose wait holds a submission (its fence not signaled, vkWaitSemaphores timing out) until
  the host signals it; events. Then it waits for a line on stdin before it destroys the device (the
  test reads ``ps`` meanwhile).
- ``submit2``: the same fences and semaphores through vkQueueSubmit2KHR (VK_KHR_synchronization2
  enabled: the driver must offer it).
- ``lost``: one submission waited, then ``ready``; after a line on stdin (the test ended the session or
  the arbiter meanwhile), what a submission and every wait answer.
- ``leaks``: what the process holds (descriptors, ring mappings, threads) with its instance alone,
  with a device that submitted work, and after vkDestroyDevice.
- ``hostile``: wrong fence and semaphore handles, a pending fence submitted and reset again, a signaled
  fence submitted behind held work (taken as reset), a wait on a
  binary semaphore nothing signals, a timeline signal going back, vkDeviceWaitIdle and vkQueueWaitIdle
  of VK_NULL_HANDLE (Taichi's device destructor waits on a device it never made); then an honest
  submission still works.

It knows nothing of libshare.
"""

from __future__ import annotations

import json
import os
import sys

import vulkan as vk

COUNT = 6
WRONG = 0x4242424242
STAGE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT


def outcome(call, *args):
    """What ``call(*args)`` answered: "ok" (or its value), or its error's class name."""
    try:
        value = call(*args)
    except (vk.VkError, vk.VkException) as exc:  # errors, and VkNotReady, VkTimeout
        return type(exc).__name__
    return "ok" if value is None else value


def open_device(*extensions: str):
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
        queueCreateInfoCount=1, pQueueCreateInfos=[queue], enabledExtensionCount=len(extensions),
        ppEnabledExtensionNames=list(extensions)), None)
    return instance, device, vk.vkGetDeviceQueue(device, 0, 0)


class Timeline:
    """The timeline commands, by vkGetDeviceProcAddr as a 1.1 program finds them."""

    def __init__(self, device):
        self.device = device
        self.wait = vk.vkGetDeviceProcAddr(device, "vkWaitSemaphoresKHR")
        self.signal = vk.vkGetDeviceProcAddr(device, "vkSignalSemaphoreKHR")
        self.value = vk.vkGetDeviceProcAddr(device, "vkGetSemaphoreCounterValueKHR")

    def make(self, initial: int = 0):
        kind = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=initial)
        return vk.vkCreateSemaphore(self.device, vk.VkSemaphoreCreateInfo(pNext=kind), None)

    def wait_for(self, semaphore, value: int, timeout: int):
        return outcome(self.wait, self.device, vk.VkSemaphoreWaitInfo(
            semaphoreCount=1, pSemaphores=[semaphore], pValues=[value]), timeout)

    def signal_to(self, semaphore, value: int):
        return outcome(self.signal, self.device, vk.VkSemaphoreSignalInfo(semaphore=semaphore, value=value))


def fence(device, signaled: bool = False):
    return vk.vkCreateFence(device, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT if signaled else 0),
                            None)


def timed(waits=(), signals=()):
    """A VkSubmitInfo of no command buffer: ``waits`` and ``signals`` are (semaphore, value) pairs."""
    values = vk.VkTimelineSemaphoreSubmitInfo(
        waitSemaphoreValueCount=len(waits), pWaitSemaphoreValues=[v for _s, v in waits] or None,
        signalSemaphoreValueCount=len(signals), pSignalSemaphoreValues=[v for _s, v in signals] or None)
    return vk.VkSubmitInfo(pNext=values, waitSemaphoreCount=len(waits), pWaitSemaphores=[s for s, _v in waits] or None,
                           pWaitDstStageMask=[STAGE] * len(waits) or None, signalSemaphoreCount=len(signals),
                           pSignalSemaphores=[s for s, _v in signals] or None)


def signaled_fence_behind_held_work(device, queue, timeline) -> list:
    """A signaled fence submitted (Vulkan forbids it; lavapipe takes it) behind a submission a timeline
    semaphore holds: what it answers, its status while held, and its wait once released."""
    gate, first, signaled = timeline.make(0), fence(device), fence(device, signaled=True)
    vk.vkQueueSubmit(queue, 1, [timed([(gate, 1)])], first)  # held (with a fence: a submission of its own)
    seen = [outcome(vk.vkQueueSubmit, queue, 0, None, signaled), outcome(vk.vkGetFenceStatus, device, signaled)]
    timeline.signal_to(gate, 1)
    seen.append(outcome(vk.vkWaitForFences, device, 2, [first, signaled], vk.VK_TRUE, 10**10))
    for made in (first, signaled):
        vk.vkDestroyFence(device, made, None)
    vk.vkDestroySemaphore(device, gate, None)
    return seen


def honest() -> dict:
    _instance, device, queue = open_device("VK_KHR_timeline_semaphore")
    timeline = Timeline(device)
    seen = {"fences": []}
    for _ in range(COUNT):
        made = fence(device)
        seen["fences"].append([outcome(vk.vkQueueSubmit, queue, 0, None, made),
                               outcome(vk.vkWaitForFences, device, 1, [made], vk.VK_TRUE, 10**10),
                               outcome(vk.vkGetFenceStatus, device, made)])
        vk.vkDestroyFence(device, made, None)
    binary = vk.vkCreateSemaphore(device, vk.VkSemaphoreCreateInfo(), None)
    after = fence(device)
    seen["binary"] = [outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(signalSemaphoreCount=1,
                                                                            pSignalSemaphores=[binary])], None),
                      outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(
                          waitSemaphoreCount=1, pWaitSemaphores=[binary], pWaitDstStageMask=[STAGE])], after),
                      outcome(vk.vkWaitForFences, device, 1, [after], vk.VK_TRUE, 10**10)]
    semaphore, held = timeline.make(1), fence(device)
    seen["timeline"] = {
        "held": outcome(vk.vkQueueSubmit, queue, 1, [timed([(semaphore, 5)], [(semaphore, 7)])], held),
        "fence while held": outcome(vk.vkGetFenceStatus, device, held),
        "fence wait while held": outcome(vk.vkWaitForFences, device, 1, [held], vk.VK_TRUE, 20_000_000),
        "wait for 7": timeline.wait_for(semaphore, 7, 20_000_000),
        "value": outcome(timeline.value, device, semaphore),
        "signal 5": timeline.signal_to(semaphore, 5),
        "wait for 7 after": timeline.wait_for(semaphore, 7, 10**10),
        "fence": outcome(vk.vkWaitForFences, device, 1, [held], vk.VK_TRUE, 10**10),
        "value after": outcome(timeline.value, device, semaphore),
    }
    event = vk.vkCreateEvent(device, vk.VkEventCreateInfo(), None)
    seen["event"] = [outcome(vk.vkGetEventStatus, device, event), outcome(vk.vkSetEvent, device, event),
                     outcome(vk.vkGetEventStatus, device, event), outcome(vk.vkResetEvent, device, event),
                     outcome(vk.vkGetEventStatus, device, event)]
    seen["idle"] = [outcome(vk.vkQueueWaitIdle, queue), outcome(vk.vkDeviceWaitIdle, device)]
    print(json.dumps(seen), flush=True)
    sys.stdin.readline()
    vk.vkDestroyDevice(device, None)
    return {}


def submit2() -> dict:
    _instance, device, queue = open_device("VK_KHR_timeline_semaphore", "VK_KHR_synchronization2")
    submit = vk.vkGetDeviceProcAddr(device, "vkQueueSubmit2KHR")
    timeline = Timeline(device)
    semaphore, made, later = timeline.make(0), fence(device), fence(device)

    def info(semaphore_, value):
        return vk.VkSemaphoreSubmitInfo(semaphore=semaphore_, value=value, stageMask=STAGE)

    seen = {
        "empty": outcome(submit, queue, 0, None, made),
        "empty fence": outcome(vk.vkWaitForFences, device, 1, [made], vk.VK_TRUE, 10**10),
        "held": outcome(submit, queue, 1, [vk.VkSubmitInfo2(
            waitSemaphoreInfoCount=1, pWaitSemaphoreInfos=[info(semaphore, 2)], signalSemaphoreInfoCount=1,
            pSignalSemaphoreInfos=[info(semaphore, 3)])], later),
        "fence while held": outcome(vk.vkGetFenceStatus, device, later),
        "signal 2": timeline.signal_to(semaphore, 2),
        "fence": outcome(vk.vkWaitForFences, device, 1, [later], vk.VK_TRUE, 10**10),
        "value": outcome(timeline.value, device, semaphore),
    }
    vk.vkDestroyDevice(device, None)
    return seen


def lost() -> dict:
    _instance, device, queue = open_device("VK_KHR_timeline_semaphore")
    timeline = Timeline(device)
    semaphore, first, second = timeline.make(0), fence(device), fence(device)
    vk.vkQueueSubmit(queue, 0, None, first)
    vk.vkWaitForFences(device, 1, [first], vk.VK_TRUE, 10**10)
    print("ready", flush=True)
    sys.stdin.readline()
    seen = {
        "submit": outcome(vk.vkQueueSubmit, queue, 0, None, second),
        "wait": outcome(vk.vkWaitForFences, device, 1, [second], vk.VK_TRUE, 10**10),
        "status": outcome(vk.vkGetFenceStatus, device, second),
        "queue idle": outcome(vk.vkQueueWaitIdle, queue),
        "device idle": outcome(vk.vkDeviceWaitIdle, device),
        "semaphore wait": timeline.wait_for(semaphore, 1, 10**10),
        "submit again": outcome(vk.vkQueueSubmit, queue, 0, None, first),
    }
    vk.vkDestroyDevice(device, None)
    return seen


def held() -> dict:
    """This process's descriptors, ring mappings and threads."""
    with open("/proc/self/maps") as maps:
        rings = sum(1 for line in maps if "libshare-ring" in line)
    return {"fds": len(os.listdir("/proc/self/fd")), "rings": rings, "threads": len(os.listdir("/proc/self/task"))}


def leaks() -> dict:
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
    physical = vk.vkEnumeratePhysicalDevices(instance)[0]
    seen = {"instance": held()}
    queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
    device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[queue_info]),
                               None)
    made = fence(device)
    vk.vkQueueSubmit(vk.vkGetDeviceQueue(device, 0, 0), 0, None, made)
    vk.vkWaitForFences(device, 1, [made], vk.VK_TRUE, 10**10)
    seen["device"] = held()
    vk.vkDestroyDevice(device, None)
    seen["destroyed"] = held()
    vk.vkDestroyInstance(instance, None)
    return seen


def direct(device, name: str, *args) -> int:
    """The VkResult of the device-level command ``name`` called with ``args``, through the pointer
    vkGetDeviceProcAddr gives (the driver's own, no loader trampoline: as Taichi calls it)."""
    pointer = vk.lib.vkGetDeviceProcAddr(device, name.encode())
    return vk.ffi.cast(f"PFN_{name}", pointer)(*args)


def hostile() -> dict:
    _instance, device, queue = open_device("VK_KHR_timeline_semaphore")
    timeline = Timeline(device)
    wrong = vk.ffi.cast("VkFence", WRONG)
    wrong_semaphore = vk.ffi.cast("VkSemaphore", WRONG)
    semaphore, held, binary = timeline.make(0), fence(device), vk.vkCreateSemaphore(device, vk.VkSemaphoreCreateInfo(),
                                                                                    None)
    seen = {
        "wait wrong fence": outcome(vk.vkWaitForFences, device, 1, [wrong], vk.VK_TRUE, 0),
        "status of wrong fence": outcome(vk.vkGetFenceStatus, device, wrong),
        "submit wrong fence": outcome(vk.vkQueueSubmit, queue, 0, None, wrong),
        "wait wrong semaphore": outcome(vk.vkQueueSubmit, queue, 1, [timed([(wrong_semaphore, 1)])], None),
        "signal wrong semaphore": outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(
            signalSemaphoreCount=1, pSignalSemaphores=[wrong_semaphore])], None),
        "host signal wrong": timeline.signal_to(wrong_semaphore, 3),
        "binary never signaled": outcome(vk.vkQueueSubmit, queue, 1, [vk.VkSubmitInfo(
            waitSemaphoreCount=1, pWaitSemaphores=[binary], pWaitDstStageMask=[STAGE])], None),
        "binary as timeline": timeline.wait_for(binary, 1, 0),
        "held": outcome(vk.vkQueueSubmit, queue, 1, [timed([(semaphore, 4)])], held),
        "pending fence again": outcome(vk.vkQueueSubmit, queue, 0, None, held),
        "pending fence reset": outcome(vk.vkResetFences, device, 1, [held]),
        "signal 4": timeline.signal_to(semaphore, 4),
        "signal back to 2": timeline.signal_to(semaphore, 2),
        "signaled fence submitted": outcome(vk.vkQueueSubmit, queue, 0, None,
                                            held if vk.vkWaitForFences(device, 1, [held], vk.VK_TRUE, 10**10) is None
                                            else None),
        "signaled fence behind held work": signaled_fence_behind_held_work(device, queue, timeline),
        "wrong event": outcome(vk.vkSetEvent, device, vk.ffi.cast("VkEvent", WRONG)),
        "idle of no device": direct(device, "vkDeviceWaitIdle", vk.ffi.NULL),
        "idle of no queue": direct(device, "vkQueueWaitIdle", vk.ffi.NULL),
    }
    honest_fence = fence(device)
    seen["still works"] = [outcome(vk.vkQueueSubmit, queue, 0, None, honest_fence),
                           outcome(vk.vkWaitForFences, device, 1, [honest_fence], vk.VK_TRUE, 10**10)]
    vk.vkDestroyDevice(device, None)
    return seen


if __name__ == "__main__":
    mode = sys.argv[1]
    result = {"honest": honest, "submit2": submit2, "lost": lost, "leaks": leaks, "hostile": hostile}[mode]()
    if result:
        print(json.dumps(result), flush=True)
