"""A worker of bench/test_icd_bench.py: a Vulkan application's start, timed in a process that stays.

``python -m bench._icd_workers`` reads a count per line on stdin and answers, per line, the median in
seconds of that many rounds of vkCreateInstance, vkEnumeratePhysicalDevices,
vkGetPhysicalDeviceProperties of the first device and vkDestroyInstance: what an application does
before it creates a device. Which driver it reaches is its environment's (VK_DRIVER_FILES).
"""

from __future__ import annotations

import statistics
import sys
import time

import vulkan as vk


def one_start(info) -> float:
    start = time.perf_counter()
    instance = vk.vkCreateInstance(info, None)
    vk.vkGetPhysicalDeviceProperties(vk.vkEnumeratePhysicalDevices(instance)[0])
    vk.vkDestroyInstance(instance, None)
    return time.perf_counter() - start


def main() -> None:
    info = vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(apiVersion=vk.VK_MAKE_VERSION(1, 1, 0)))
    one_start(info)  # the loader's first scan of its manifests, once
    for line in sys.stdin:
        print(statistics.median(one_start(info) for _ in range(int(line))), flush=True)


if __name__ == "__main__":
    main()
