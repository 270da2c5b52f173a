"""What the libshare Vulkan driver reports as its physical device: one definition, sent in the welcome.

A hello that says ``"device_info": true`` (the driver's, libshare/icd/hello.c) gets this in its
welcome (hello.py): the JSON object :func:`physical_device` under ``"physical_device"``, and as the
frame's payload the real device's ``VkPhysicalDeviceProperties``, byte for byte as the arbiter's
Vulkan driver wrote it (the limits, sparse properties, vendor and device ids, pipeline cache UUID).
Driver and arbiter run on one host under one Vulkan ABI, so the struct needs no translation; the
driver checks its size and overwrites what it reports differently (the name, the Vulkan version).

The object carries what the struct does not:

* ``name``: the arbiter's device name (the driver reports ``libshare: NAME``);
* ``uuid``: the device's UUID (``VkPhysicalDeviceIDProperties``);
* ``features``: the names of what the arbiter's VkDevice was created with and of the subgroup
  operations it supports in the compute stage (device/_instance.py: never ``bufferDeviceAddress``;
  ``robustBufferAccess`` always), which the driver reports and no more;
* ``subgroup_size``, ``max_per_set_descriptors``, ``max_memory_allocation_size``: the device's
  Vulkan 1.1 properties (VkPhysicalDeviceSubgroupProperties, ...Maintenance3Properties);
* ``subgroup_sizes``: ``[min, max, most]``, the subgroup sizes the compute stage may run at and the
  most subgroups a workgroup holds (VkPhysicalDeviceSubgroupSizeControlProperties; ``[0, 0, 0]``
  where the device cannot say): the
  driver offers subgroup size control only where they are one size, so that the size a pipeline
  requires is the size every pipeline runs at;
* ``timestamp_valid_bits``: the valid bits of the arbiter's queue's timestamps;
* ``driver_id``: the arbiter's Vulkan driver's ``VkDriverId`` (0 when it cannot say), which the
  driver reports as its own in Vulkan 1.2's properties: the shaders run on that driver;
* ``conformance``: the conformance version the arbiter's driver passed, ``[major, minor,
  subminor, patch]`` (all 0 when it cannot say), which the driver reports as its own: every command
  runs on that driver (docs/icd.md, "Who the driver says it is");
* ``texel_formats``: each texel view format the device supports in a buffer view
  (libshare.protocol.texels), as ``[name, VkFormat, bytes per texel, uses]`` (uses: TEXEL_STORAGE
  and TEXEL_UNIFORM bits), which the driver reports as the formats' buffer features and names in
  its ``view`` requests;
* ``memory``: the bytes this session may hold: the lowest of its own limit, its group's and the
  arbiter's total (policy/limits.py), which the driver reports as the size of its device-local
  heap, so that an application sizes itself to its share.
"""

from __future__ import annotations

from libshare.arbiter.serve.clients import Client
from libshare.protocol.texels import TEXEL_FORMATS

__all__ = ["physical_device", "session_memory"]


def session_memory(arbiter, client: Client) -> int:
    """The bytes ``client`` may hold on ``arbiter``: the lowest limit that binds it (its own, its group's,
    the total), else the device's device-local heap."""
    limits = arbiter.limits
    found = [limit.value for limit in (limits.client_limit(client), limits.group_limit(client.group), limits.total)
             if limit is not None]
    return min(found) if found else arbiter.device.local_heap_size


def physical_device(arbiter, client: Client) -> tuple[dict, bytes]:
    """The welcome's ``physical_device`` object for ``client``, and its payload (see the module's essay)."""
    device = arbiter.device
    fields = {"name": device.name, "uuid": device.uuid, "features": sorted(device.features),
              "timestamp_valid_bits": device.instance.timestamp_mask.bit_length(),
              "driver_id": device.instance.physical.driver_id(),
              "conformance": device.instance.physical.conformance_version(),
              "texel_formats": [[name, TEXEL_FORMATS[name].vk_format, TEXEL_FORMATS[name].texel_bytes, uses]
                                for name, uses in device.texel_formats.items()],
              "memory": session_memory(arbiter, client), **device.instance.physical.core11_properties()}
    return fields, device.instance.physical.properties_bytes()
