"""An unmodified Vulkan program on the ``vulkan`` bindings: what it sees of its devices, as JSON.

``python _probe.py [hold]`` creates an instance, enumerates the physical devices and prints one JSON
line: each device's name, Vulkan version, ids, every limit, its memory heaps and types, queue families,
features; or ``{"error": NAME}`` when the instance cannot be made. It says on stderr when it begins
creating its instance. With ``hold`` it then prints
``holding`` and keeps its instance until its standard input closes. It knows nothing of libshare.
"""

from __future__ import annotations

import json
import sys

import vulkan as vk


def plain(value):
    """A cffi value as JSON: numbers as they are, arrays as lists."""
    if isinstance(value, (int, float)):
        return value
    return [plain(item) for item in value]


def limits(props) -> dict:
    return {name: plain(getattr(props.limits, name)) for name, _ in vk.ffi.typeof("VkPhysicalDeviceLimits").fields}


def describe(device) -> dict:
    props = vk.vkGetPhysicalDeviceProperties(device)
    memory = vk.vkGetPhysicalDeviceMemoryProperties(device)
    features = vk.vkGetPhysicalDeviceFeatures(device)
    return {
        "name": vk.ffi.string(props.deviceName).decode() if not isinstance(props.deviceName, str) else props.deviceName,
        "api_version": props.apiVersion, "vendor_id": props.vendorID, "device_id": props.deviceID,
        "device_type": props.deviceType, "limits": limits(props),
        "heaps": [[memory.memoryHeaps[i].size, memory.memoryHeaps[i].flags] for i in range(memory.memoryHeapCount)],
        "types": [[memory.memoryTypes[i].propertyFlags, memory.memoryTypes[i].heapIndex]
                  for i in range(memory.memoryTypeCount)],
        "families": [[f.queueFlags, f.queueCount, f.timestampValidBits]
                     for f in vk.vkGetPhysicalDeviceQueueFamilyProperties(device)],
        "features": {name: getattr(features, name) for name, _ in vk.ffi.typeof("VkPhysicalDeviceFeatures").fields},
        "device_extensions": [e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(device, None)],
        **core11(device),
    }


def core11(device) -> dict:
    """Vulkan 1.1's structures chained to Properties2 and Features2 (filled with a canary first)."""
    subgroup = vk.VkPhysicalDeviceSubgroupProperties(subgroupSize=0xDEAD)
    bounds = vk.VkPhysicalDeviceMaintenance3Properties(pNext=subgroup)
    vk.vkGetPhysicalDeviceProperties2(device, vk.VkPhysicalDeviceProperties2(pNext=bounds))
    storage = vk.VkPhysicalDevice16BitStorageFeatures(storageInputOutput16=7)
    address = vk.VkPhysicalDeviceBufferDeviceAddressFeatures(bufferDeviceAddress=7, pNext=storage)
    pointers = vk.VkPhysicalDeviceVariablePointersFeatures(variablePointers=7, pNext=address)
    vk.vkGetPhysicalDeviceFeatures2(device, vk.VkPhysicalDeviceFeatures2(pNext=pointers))
    return {"subgroup": [subgroup.subgroupSize, subgroup.supportedOperations, subgroup.supportedStages],
            "max_per_set_descriptors": bounds.maxPerSetDescriptors,
            "max_allocation": bounds.maxMemoryAllocationSize,
            "storage16": [storage.storageBuffer16BitAccess, storage.uniformAndStorageBuffer16BitAccess,
                          storage.storagePushConstant16, storage.storageInputOutput16],
            "variable_pointers": pointers.variablePointers, "buffer_device_address": address.bufferDeviceAddress}


def main() -> None:
    info = vk.VkInstanceCreateInfo(pApplicationInfo=vk.VkApplicationInfo(
        pApplicationName="probe", apiVersion=vk.VK_MAKE_VERSION(1, 1, 0)))
    print("creating an instance", file=sys.stderr, flush=True)
    try:
        instance = vk.vkCreateInstance(info, None)
    except vk.VkError as exc:
        print(json.dumps({"error": type(exc).__name__}), flush=True)
        return
    print(json.dumps({"devices": [describe(d) for d in vk.vkEnumeratePhysicalDevices(instance)]}), flush=True)
    if sys.argv[1:] == ["hold"]:
        print("holding", flush=True)
        sys.stdin.read()
    vk.vkDestroyInstance(instance, None)


if __name__ == "__main__":
    main()
