"""The instance: the Vulkan instance, the physical device it picks, and the VkDevice opened on it.

:class:`Instance` picks its physical device by ``selector``, checks that it can run
libshare (Vulkan 1.1, VK_KHR_push_descriptor, robustBufferAccess), and creates a VkDevice
with bounds checking, one compute queue and every optional feature the device has that is safe
to share and that real kernels' capabilities need (8/16-bit storage, Float16, Int8, Int16, Int64
and its atomics, Float64, float atomics, integer dot products, the Vulkan memory model, non-uniform
indexing of arrays of buffers; never
``bufferDeviceAddress``: see :func:`_create_device`). It asks the loader for the newest Vulkan
it knows (up to 1.3), so that a 1.2 or 1.3 device runs SPIR-V 1.5 or 1.6. It holds what the
device *is* (its facts: name, UUID, limits, Vulkan version, :attr:`Instance.features`, which
admission checks a module's capabilities against;
:class:`~libshare.arbiter.device.Device` copies them for its callers),
the handles and extension entry points every other part records and submits with, and
the device's lifetime: :attr:`Instance.closed` once closing began, when nothing new may
start, and :attr:`Instance.abandoned` when work that never ended kept it alive.
"""

from __future__ import annotations

import functools
import os
import uuid as _uuid
from typing import Any

from libshare.errors import InvalidSubmission, QuotaExceeded, VulkanUnavailable
from libshare._proc import thread_ids
from libshare.protocol.texels import TEXEL_FORMATS, TEXEL_STORAGE, TEXEL_UNIFORM

from libshare.arbiter.device._binding import (_INSTALL_HINT, _address, _create, _enumerate, _result_name, _struct, _text, _uses_binding)

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding


class Instance:
    """The VkInstance, the physical device, the VkDevice and its compute queue, with the
    device's facts and lifetime (a part of a Device, below every other part).

    ``handle`` is the VkDevice, ``queue`` the VkQueue of queue family ``family``.
    """

    def __init__(self, selector: str | None):
        self.closed = False
        """True once the Device began closing: nothing new starts (set under the compile guard,
        see :meth:`~libshare.arbiter.device._pipelines.Pipelines.stop_compiles`)."""
        self.abandoned = False
        """True when closing gave up on work that did not end (see Device.close)."""
        self.handle: Any = None
        self._instance, self._instance_version = _create_instance()
        try:
            self._open(selector)
        except BaseException:
            self.destroy()
            raise

    def _open(self, selector: str | None) -> None:
        """Pick the physical device, read its facts, create the device and get its queue."""
        handles = _enumerate(_lib.vkEnumeratePhysicalDevices, "VkPhysicalDevice", self._instance)
        devices = [_PhysicalInfo(handle) for handle in handles]
        info = _select(devices, selector)
        self.physical = info
        self.index: int = devices.index(info)
        self.name: str = info.name
        self.uuid: str = info.uuid
        self.max_group_count: tuple[int, int, int] = info.max_group_count
        self.max_push_constants_size: int = info.max_push_constants_size
        self.host_import_alignment: int = info.host_import_alignment
        self.storage_offset_alignment: int = info.storage_offset_alignment
        self.max_workgroup_size: tuple[int, int, int] = info.max_workgroup_size
        self.max_workgroup_invocations: int = info.max_workgroup_invocations
        self.max_shared_memory: int = info.max_shared_memory
        self.binding_limits: dict[str, int] = info.binding_limits
        """The device's limits on the buffers one kernel binds, by name (a program's admission)."""
        self.timestamp_period_ns: float = info.timestamp_period
        self.cpu: bool = info.cpu
        """True for a device that runs on the host's CPU (lavapipe): its memory is the host's."""
        self.local_heap_size: int = info.local_heap_size()
        """Bytes in the device's largest device-local memory heap."""
        self.family, valid_bits = info.compute_family()
        self.timestamp_mask = (1 << valid_bits) - 1 if valid_bits else 0
        """The valid bits of the queue's timestamps (0: the queue has none)."""
        self.ends_each_command: bool = info.ends_each_command()
        """True when the device ends each command before it begins the next (lavapipe): the engine's
        timestamps may then be written at the top of the pipe (see _PhysicalInfo.ends_each_command)."""
        self.api_version: tuple[int, int] = min(self._instance_version, _version(info.api_version))
        """(major, minor): the Vulkan version the device runs for libshare (its own, up to what the instance
        asked for); the SPIR-V it accepts follows (libshare/arbiter/programs/capabilities.py)."""
        before = thread_ids()
        self.handle, features = _create_device(info, self.family, self.api_version)
        self.features: frozenset[str] = features
        """The names of the features the device was created with, of the subgroup operations it supports in
        the compute stage and of its float controls (see :func:`_create_device`)."""
        self.zero_workgroup_memory: bool = "shaderZeroInitializeWorkgroupMemory" in features
        self.texel_formats: dict[str, int] = info.texel_formats()
        """The texel view formats (libshare.protocol.texels) the device supports in a buffer view, by name: a
        mask of TEXEL_STORAGE (a storage texel buffer) and TEXEL_UNIFORM (a uniform texel buffer); a format
        it supports for neither is left out."""
        self.texel_offset_alignment: int = info.texel_offset_alignment
        self.max_texel_elements: int = info.max_texel_elements
        """True when the device zeroes shared memory that a kernel's initializers say to
        (shaderZeroInitializeWorkgroupMemory; see libshare/arbiter/programs/spirv.py)."""
        self.driver_threads: frozenset[int] = frozenset(thread_ids() - before)
        """Ids of the threads of this process that appeared while the driver made the device (its
        queue thread, on lavapipe), maybe with a thread some other part of the process started
        meanwhile (see policy/placement.py, which tells the two apart)."""
        queue = _ffi.new("VkQueue*")
        _lib.vkGetDeviceQueue(self.handle, self.family, 0, queue)
        self.queue = queue[0]
        self.push_descriptor_set = self._device_function("vkCmdPushDescriptorSetKHR")
        self.host_pointer_properties = (
            self._device_function("vkGetMemoryHostPointerPropertiesEXT") if self.host_import_alignment else None
        )

    def _device_function(self, name: str) -> Any:
        """An extension function of this device, cast to its PFN type."""
        pointer = _lib.vkGetDeviceProcAddr(self.handle, name.encode())
        if pointer == _ffi.NULL:
            raise VulkanUnavailable(f"{self.name} does not provide {name}")
        return _ffi.cast("PFN_" + name, pointer)

    def require_open(self) -> None:
        """Raise when the device is closed."""
        if self.closed:
            raise InvalidSubmission("the device is closed")

    def native_handles(self) -> dict:
        """The raw handles and limits a native engine records and submits with, as integers.

        Keys: ``device`` (VkDevice), ``queue`` (VkQueue), ``family`` (its queue family),
        ``timestamp_mask`` (0: no timestamps), ``timestamp_period_ns``, ``stamp_at_top`` (1: the device
        ends each command before the next, so the engine's timestamps go at the top of the pipe), ``max_storage_range``,
        ``offset_alignment``, ``max_uniform_range``, ``uniform_offset_alignment``, ``max_group_count`` (three counts), ``host_memory_type`` (the first
        host-visible, coherent memory type: where timestamps are copied for the host to read).
        """
        self.require_open()
        return {
            "device": _address(self.handle), "queue": _address(self.queue), "family": self.family,
            "timestamp_mask": self.timestamp_mask, "timestamp_period_ns": self.timestamp_period_ns,
            "stamp_at_top": int(self.ends_each_command), "max_storage_range": self.physical.max_storage_range,
            "max_uniform_range": self.physical.max_uniform_range,
            "uniform_offset_alignment": self.physical.uniform_offset_alignment,
            "offset_alignment": self.storage_offset_alignment, "max_group_count": self.max_group_count,
            "host_memory_type": self.physical.memory_type(
                (1 << 32) - 1, _vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | _vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT),
        }

    def destroy(self) -> None:
        """Destroy the device and the instance (every other part has let go of them first)."""
        if self.handle is not None:
            _lib.vkDestroyDevice(self.handle, _ffi.NULL)
            self.handle = None
        _lib.vkDestroyInstance(self._instance, _ffi.NULL)


_API_VERSION = (1, 3)
"""The newest Vulkan the arbiter asks for (that of the ``vulkan`` package's headers): a device runs the lower
of its own version and this one."""


def _version(packed: int) -> tuple[int, int]:
    """(major, minor) of a packed Vulkan version."""
    return (packed >> 22) & 0x7F, (packed >> 12) & 0x3FF


def _create_instance() -> tuple[Any, tuple[int, int]]:
    """A Vulkan instance of the newest version the loader and libshare know (1.1 to :data:`_API_VERSION`), and
    that version; VulkanUnavailable when no driver answers."""
    # lavapipe hands every dispatch to a thread pool and waits for it: for the small
    # dispatches an arbiter batches, that handoff costs more than the work (about 20 us
    # against 4 us a command on 2 cores). Inline unless the user chose a pool size;
    # other drivers ignore the variable. It must be set before the driver loads.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    loader = _ffi.new("uint32_t*")
    try:
        ask = _lib.vkEnumerateInstanceVersion(loader) >= 0
    except AttributeError:  # a Vulkan 1.0 loader, which lacks the call
        ask = False
    version = max((1, 1), min(_version(loader[0]) if ask else (1, 0), _API_VERSION))
    app = _struct(
        "VkApplicationInfo", "APPLICATION_INFO", pApplicationName=_ffi.new("char[]", b"libshare-arbiter"),
        pEngineName=_ffi.new("char[]", b"libshare"), apiVersion=_vk.VK_MAKE_VERSION(*version, 0),
    )
    info = _struct("VkInstanceCreateInfo", "INSTANCE_CREATE_INFO", pApplicationInfo=app)
    out = _ffi.new("VkInstance*")
    result = _lib.vkCreateInstance(info, _ffi.NULL, out)
    if result < 0:
        raise VulkanUnavailable(f"vkCreateInstance failed with {_result_name(result)}; {_INSTALL_HINT}")
    return out[0], version


class _PhysicalInfo:
    """What the device layer needs to know about one physical device."""

    def __init__(self, handle: Any):
        self.handle = handle
        found = _enumerate(_lib.vkEnumerateDeviceExtensionProperties, "VkExtensionProperties", handle, _ffi.NULL)
        self.extensions = {_text(e.extensionName) for e in found}
        self._read_properties()
        self.families = _enumerate(_lib.vkGetPhysicalDeviceQueueFamilyProperties, "VkQueueFamilyProperties", handle)
        self.memory = _ffi.new("VkPhysicalDeviceMemoryProperties*")
        _lib.vkGetPhysicalDeviceMemoryProperties(handle, self.memory)

    def _read_properties(self) -> None:
        """Name, UUID, limits, push-descriptor and host-import properties."""
        push = _struct("VkPhysicalDevicePushDescriptorPropertiesKHR", "PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR")
        ids = _struct("VkPhysicalDeviceIDProperties", "PHYSICAL_DEVICE_ID_PROPERTIES", pNext=push)
        host = _struct(
            "VkPhysicalDeviceExternalMemoryHostPropertiesEXT", "PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT",
            pNext=ids,
        )
        has_host = "VK_EXT_external_memory_host" in self.extensions
        props = _struct("VkPhysicalDeviceProperties2", "PHYSICAL_DEVICE_PROPERTIES_2", pNext=host if has_host else ids)
        if "VK_KHR_push_descriptor" not in self.extensions:
            ids.pNext = _ffi.NULL
        _lib.vkGetPhysicalDeviceProperties2(self.handle, props)
        p, limits = props.properties, props.properties.limits
        self.name = _text(p.deviceName)
        self.cpu = p.deviceType == _vk.VK_PHYSICAL_DEVICE_TYPE_CPU
        self.api_version = p.apiVersion
        self.uuid = str(_uuid.UUID(bytes=bytes(_ffi.buffer(ids.deviceUUID, 16))))
        self.max_group_count = tuple(limits.maxComputeWorkGroupCount)
        self.max_push_constants_size = limits.maxPushConstantsSize
        self.storage_offset_alignment = limits.minStorageBufferOffsetAlignment
        self.max_storage_range = limits.maxStorageBufferRange
        self.max_uniform_range = limits.maxUniformBufferRange
        self.uniform_offset_alignment = limits.minUniformBufferOffsetAlignment
        self.timestamp_period = float(limits.timestampPeriod)
        self.max_push_descriptors = push.maxPushDescriptors if ids.pNext != _ffi.NULL else 0
        self.host_import_alignment = host.minImportedHostPointerAlignment if has_host else 0
        self.max_workgroup_size = tuple(limits.maxComputeWorkGroupSize)
        self.max_workgroup_invocations = limits.maxComputeWorkGroupInvocations
        self.max_shared_memory = limits.maxComputeSharedMemorySize
        self.texel_offset_alignment = limits.minTexelBufferOffsetAlignment
        self.max_texel_elements = limits.maxTexelBufferElements
        self.binding_limits = {"push descriptors": self.max_push_descriptors,
                               "per-stage storage buffers": limits.maxPerStageDescriptorStorageBuffers,
                               "per-stage uniform buffers": limits.maxPerStageDescriptorUniformBuffers,
                               "per-stage resources": limits.maxPerStageResources}
        features = _ffi.new("VkPhysicalDeviceFeatures*")
        _lib.vkGetPhysicalDeviceFeatures(self.handle, features)
        self.robust_buffer_access = bool(features.robustBufferAccess)

    @functools.cached_property
    def _driver_properties(self):
        """The device's VkPhysicalDeviceDriverProperties, or None when it has none (Vulkan 1.1 without
        VK_KHR_driver_properties); asked once (each session's welcome reports it)."""
        if _version(self.api_version) < (1, 2) and "VK_KHR_driver_properties" not in self.extensions:
            return None
        driver = _struct("VkPhysicalDeviceDriverProperties", "PHYSICAL_DEVICE_DRIVER_PROPERTIES")
        _lib.vkGetPhysicalDeviceProperties2(self.handle, _struct(
            "VkPhysicalDeviceProperties2", "PHYSICAL_DEVICE_PROPERTIES_2", pNext=driver))
        return driver

    def driver_id(self) -> int:
        """The device's driver's VkDriverId, 0 when it cannot say."""
        driver = self._driver_properties
        return int(driver.driverID) if driver is not None else 0

    def conformance_version(self) -> list[int]:
        """The Vulkan conformance test suite version the device's driver passed, as
        ``[major, minor, subminor, patch]``; all 0 when it cannot say or passed none."""
        driver = self._driver_properties
        if driver is None:
            return [0, 0, 0, 0]
        version = driver.conformanceVersion
        return [int(version.major), int(version.minor), int(version.subminor), int(version.patch)]

    def ends_each_command(self) -> bool:
        """True for Mesa's lavapipe (its driver id): its queue thread runs each command to its end before
        it begins the next (llvmpipe's launch_grid waits for the grid), so a timestamp at the top of the
        pipe written after a command is that command's end, and costs no flush, where a timestamp at
        any other stage makes lavapipe flush first (about 2 us a command). The engine times commands
        so on it (engine/flights.c); on every other device at the bottom of the pipe, as Vulkan asks."""
        return self.driver_id() == _vk.VK_DRIVER_ID_MESA_LLVMPIPE

    def texel_formats(self) -> dict[str, int]:
        """Each texel view format the device supports in a buffer view (vkGetPhysicalDeviceFormatProperties'
        bufferFeatures): its TEXEL_STORAGE and TEXEL_UNIFORM bits."""
        found = {}
        for name, texel_format in TEXEL_FORMATS.items():
            props = _ffi.new("VkFormatProperties*")
            _lib.vkGetPhysicalDeviceFormatProperties(self.handle, texel_format.vk_format, props)
            uses = ((TEXEL_STORAGE if props.bufferFeatures & _vk.VK_FORMAT_FEATURE_STORAGE_TEXEL_BUFFER_BIT else 0)
                    | (TEXEL_UNIFORM if props.bufferFeatures & _vk.VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT else 0))
            if uses:
                found[name] = uses
        return found

    def properties_bytes(self) -> bytes:
        """The device's VkPhysicalDeviceProperties as the driver writes it, byte for byte: what the
        libshare Vulkan driver reports as its own (serve/device_info.py)."""
        props = _ffi.new("VkPhysicalDeviceProperties*")
        _lib.vkGetPhysicalDeviceProperties(self.handle, props)
        return bytes(_ffi.buffer(props))

    def core11_properties(self) -> dict:
        """The Vulkan 1.1 properties the libshare Vulkan driver reports beside :meth:`properties_bytes`:
        the subgroup size, and VkPhysicalDeviceMaintenance3Properties's bounds; and the smallest and
        largest subgroup size of the compute stage with the most subgroups a workgroup holds
        (VkPhysicalDeviceSubgroupSizeControlProperties), [0, 0, 0] where the device cannot say (no
        VK_EXT_subgroup_size_control, nor Vulkan 1.3)."""
        maintenance = _struct("VkPhysicalDeviceMaintenance3Properties", "PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES")
        sizes = _struct("VkPhysicalDeviceSubgroupSizeControlProperties",
                        "PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES", pNext=maintenance)
        controlled = _usable(self, _version(self.api_version), (1, 3), "VK_EXT_subgroup_size_control")
        subgroup = _struct("VkPhysicalDeviceSubgroupProperties", "PHYSICAL_DEVICE_SUBGROUP_PROPERTIES",
                           pNext=sizes if controlled else maintenance)
        _lib.vkGetPhysicalDeviceProperties2(self.handle, _struct(
            "VkPhysicalDeviceProperties2", "PHYSICAL_DEVICE_PROPERTIES_2", pNext=subgroup))
        compute = controlled and sizes.requiredSubgroupSizeStages & _vk.VK_SHADER_STAGE_COMPUTE_BIT
        return {"subgroup_size": subgroup.subgroupSize, "max_per_set_descriptors": maintenance.maxPerSetDescriptors,
                "max_memory_allocation_size": maintenance.maxMemoryAllocationSize,
                "subgroup_sizes": [sizes.minSubgroupSize, sizes.maxSubgroupSize, sizes.maxComputeWorkgroupSubgroups]
                if compute else [0, 0, 0]}

    def local_heap_size(self) -> int:
        """Bytes in the largest device-local memory heap (0 if none is marked device-local)."""
        heaps = self.memory.memoryHeaps
        return max((heaps[i].size for i in range(self.memory.memoryHeapCount)
                    if heaps[i].flags & _vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT), default=0)

    def compute_family(self) -> tuple[int, int]:
        """(index, timestampValidBits) of the best compute queue family.

        Prefers families with timestamps, then compute-only ones (async compute).
        """
        compute, graphics = _vk.VK_QUEUE_COMPUTE_BIT, _vk.VK_QUEUE_GRAPHICS_BIT
        candidates = [
            (f.timestampValidBits > 0, not f.queueFlags & graphics, -i, i)
            for i, f in enumerate(self.families)
            if f.queueFlags & compute and f.queueCount > 0
        ]
        if not candidates:
            raise VulkanUnavailable(f"{self.name} has no compute queue")
        index = max(candidates)[3]
        return index, self.families[index].timestampValidBits

    def memory_type(self, allowed_bits: int, preferred: int) -> int:
        """The first allowed memory type with all ``preferred`` flags, else the first allowed."""
        allowed = [i for i in range(self.memory.memoryTypeCount) if allowed_bits >> i & 1]
        if not allowed:
            raise QuotaExceeded("no memory type of the device fits this buffer")
        for i in allowed:
            if self.memory.memoryTypes[i].propertyFlags & preferred == preferred:
                return i
        return allowed[0]

    def describe(self, index: int) -> str:
        """One line for error messages."""
        return f"{index}: {self.name} (uuid {self.uuid})"


def _select(devices: list[_PhysicalInfo], selector: str | None) -> _PhysicalInfo:
    """Pick by selector, and check the pick can run libshare."""
    if not devices:
        raise VulkanUnavailable(f"the Vulkan loader found no device; {_INSTALL_HINT}")
    chosen = _match(devices, (selector or "").strip())
    if chosen is None:
        found = "; ".join(d.describe(i) for i, d in enumerate(devices))
        raise VulkanUnavailable(f"no Vulkan device matches {selector!r}; found: {found}")
    if chosen.api_version < _vk.VK_MAKE_VERSION(1, 1, 0):
        raise VulkanUnavailable(f"{chosen.name} supports only Vulkan 1.0; libshare needs 1.1")
    if "VK_KHR_push_descriptor" not in chosen.extensions:
        raise VulkanUnavailable(f"{chosen.name} lacks VK_KHR_push_descriptor, which libshare needs")
    if not chosen.robust_buffer_access:
        raise VulkanUnavailable(f"{chosen.name} lacks robustBufferAccess, which bounds client kernels")
    return chosen


def _match(devices: list[_PhysicalInfo], selector: str) -> _PhysicalInfo | None:
    """The device named by index or UUID, or None."""
    if not selector:
        return devices[0]
    if selector.isdecimal():
        index = int(selector)
        return devices[index] if index < len(devices) else None
    wanted = selector.replace("-", "").lower()
    for d in devices:
        if d.uuid.replace("-", "") == wanted:
            return d
    return None


# What the device is created with besides robustBufferAccess: each optional feature of these structs that the
# device has (struct, its sType, the Vulkan version it is core in or None, the extension that brings it
# otherwise, its features that are safe to share). Individual structs, never VkPhysicalDeviceVulkan1xFeatures,
# so that they chain on a 1.1 device as on a 1.3 one. bufferDeviceAddress is in none of them, and never will be:
# with it a kernel could turn any integer into a pointer.
_FEATURE_STRUCTS = (
    ("VkPhysicalDeviceRobustness2FeaturesEXT", "ROBUSTNESS_2_FEATURES_EXT", None, "VK_EXT_robustness2",
     ("robustBufferAccess2",)),
    ("VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures", "ZERO_INITIALIZE_WORKGROUP_MEMORY_FEATURES", (1, 3),
     "VK_KHR_zero_initialize_workgroup_memory", ("shaderZeroInitializeWorkgroupMemory",)),
    ("VkPhysicalDevice16BitStorageFeatures", "16BIT_STORAGE_FEATURES", (1, 1), "VK_KHR_16bit_storage",
     ("storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storagePushConstant16")),
    ("VkPhysicalDevice8BitStorageFeatures", "8BIT_STORAGE_FEATURES", (1, 2), "VK_KHR_8bit_storage",
     ("storageBuffer8BitAccess", "uniformAndStorageBuffer8BitAccess", "storagePushConstant8")),
    ("VkPhysicalDeviceShaderFloat16Int8Features", "SHADER_FLOAT16_INT8_FEATURES", (1, 2),
     "VK_KHR_shader_float16_int8", ("shaderFloat16", "shaderInt8")),
    ("VkPhysicalDeviceShaderAtomicInt64Features", "SHADER_ATOMIC_INT64_FEATURES", (1, 2),
     "VK_KHR_shader_atomic_int64", ("shaderBufferInt64Atomics", "shaderSharedInt64Atomics")),
    ("VkPhysicalDeviceVulkanMemoryModelFeatures", "VULKAN_MEMORY_MODEL_FEATURES", (1, 2), "VK_KHR_vulkan_memory_model",
     ("vulkanMemoryModel", "vulkanMemoryModelDeviceScope", "vulkanMemoryModelAvailabilityVisibilityChains")),
    ("VkPhysicalDeviceShaderSubgroupExtendedTypesFeatures", "SHADER_SUBGROUP_EXTENDED_TYPES_FEATURES", (1, 2),
     "VK_KHR_shader_subgroup_extended_types", ("shaderSubgroupExtendedTypes",)),
    ("VkPhysicalDeviceScalarBlockLayoutFeatures", "SCALAR_BLOCK_LAYOUT_FEATURES", (1, 2), "VK_EXT_scalar_block_layout",
     ("scalarBlockLayout",)),
    ("VkPhysicalDeviceUniformBufferStandardLayoutFeatures", "UNIFORM_BUFFER_STANDARD_LAYOUT_FEATURES", (1, 2),
     "VK_KHR_uniform_buffer_standard_layout", ("uniformBufferStandardLayout",)),
    ("VkPhysicalDeviceDescriptorIndexingFeatures", "DESCRIPTOR_INDEXING_FEATURES", (1, 2), "VK_EXT_descriptor_indexing",
     ("shaderUniformBufferArrayNonUniformIndexing", "shaderStorageBufferArrayNonUniformIndexing")),
    ("VkPhysicalDeviceSubgroupSizeControlFeatures", "SUBGROUP_SIZE_CONTROL_FEATURES", (1, 3),
     "VK_EXT_subgroup_size_control", ("subgroupSizeControl", "computeFullSubgroups")),
    ("VkPhysicalDeviceShaderIntegerDotProductFeatures", "SHADER_INTEGER_DOT_PRODUCT_FEATURES", (1, 3),
     "VK_KHR_shader_integer_dot_product", ("shaderIntegerDotProduct",)),
    ("VkPhysicalDeviceShaderAtomicFloatFeaturesEXT", "SHADER_ATOMIC_FLOAT_FEATURES_EXT", None,
     "VK_EXT_shader_atomic_float",
     ("shaderBufferFloat32Atomics", "shaderBufferFloat32AtomicAdd", "shaderBufferFloat64Atomics",
      "shaderBufferFloat64AtomicAdd", "shaderSharedFloat32Atomics", "shaderSharedFloat32AtomicAdd",
      "shaderSharedFloat64Atomics", "shaderSharedFloat64AtomicAdd")),
    ("VkPhysicalDeviceShaderAtomicFloat2FeaturesEXT", "SHADER_ATOMIC_FLOAT_2_FEATURES_EXT", None,
     "VK_EXT_shader_atomic_float2",
     ("shaderBufferFloat16Atomics", "shaderBufferFloat16AtomicAdd", "shaderBufferFloat16AtomicMinMax",
      "shaderBufferFloat32AtomicMinMax", "shaderBufferFloat64AtomicMinMax", "shaderSharedFloat16Atomics",
      "shaderSharedFloat16AtomicAdd", "shaderSharedFloat16AtomicMinMax", "shaderSharedFloat32AtomicMinMax",
      "shaderSharedFloat64AtomicMinMax")),
)
_CORE_FEATURES = ("robustBufferAccess", "shaderFloat64", "shaderInt64", "shaderInt16")  # of VkPhysicalDeviceFeatures
_NON_SEMANTIC = "VK_KHR_shader_non_semantic_info"
"""Listed in the features on a device of Vulkan 1.3 too, which absorbed it; on a device without it, a module's
non-semantic instructions are taken out before admission (programs/nonsemantic.py)."""
_FEATURE_EXTENSIONS = ("VK_EXT_shader_subgroup_ballot", "VK_EXT_shader_subgroup_vote", "VK_EXT_descriptor_indexing",
                       _NON_SEMANTIC)
"""Extensions that are themselves what a capability needs (SubgroupBallotKHR, SubgroupVoteKHR, ShaderNonUniform
on a Vulkan 1.1 device), or what a module's non-semantic instructions need, enabled where
the device has them and listed in the features by their names."""
_SUBGROUP_OPERATIONS = {
    "BASIC": "subgroupBasic", "VOTE": "subgroupVote", "ARITHMETIC": "subgroupArithmetic", "BALLOT": "subgroupBallot",
    "SHUFFLE": "subgroupShuffle", "SHUFFLE_RELATIVE": "subgroupShuffleRelative", "CLUSTERED": "subgroupClustered",
    "QUAD": "subgroupQuad",
}
"""VK_SUBGROUP_FEATURE_<key>_BIT: the name the features give it, when the compute stage supports it (the names
libshare/arbiter/programs/capabilities.py checks capabilities against)."""
_FLOAT_CONTROLS = tuple(f"shader{mode}Float{width}" for mode in (
    "DenormPreserve", "DenormFlushToZero", "SignedZeroInfNanPreserve", "RoundingModeRTE", "RoundingModeRTZ")
    for width in (16, 32, 64))
"""VkPhysicalDeviceFloatControlsProperties that say which float-controls execution modes a kernel may use."""


def _usable(info: _PhysicalInfo, version: tuple[int, int], since: tuple[int, int] | None, extension: str) -> bool:
    """Whether a struct (core in ``since``, else from ``extension``) may be chained on this device."""
    return (since is not None and version >= since) or extension in info.extensions


def _create_device(info: _PhysicalInfo, family: int, version: tuple[int, int]) -> tuple[Any, frozenset[str]]:
    """A VkDevice of Vulkan ``version`` with one queue of ``family``, the extensions libshare uses, bounds
    checking and every optional feature of :data:`_FEATURE_STRUCTS` that the device has; and the names of
    what it enabled, with the device's subgroup operations in the compute stage and float controls.

    ``robustBufferAccess`` (and ``robustBufferAccess2`` where the device has VK_EXT_robustness2) is enabled
    so that a client's kernel cannot read or write past the buffers bound to it, and
    ``shaderZeroInitializeWorkgroupMemory`` where the device has it, so that shared memory can start as
    zeros, not as another client's data. The others are what the capabilities of real kernels need
    (libshare/arbiter/programs/capabilities.py): a module is admitted only when the device has them.
    """
    names = ["VK_KHR_push_descriptor"]
    for optional in ("VK_EXT_external_memory_host", "VK_KHR_portability_subset", *_FEATURE_EXTENSIONS):
        if optional in info.extensions:
            names.append(optional)
    enabled = {name for name in _FEATURE_EXTENSIONS if name in info.extensions}
    if version >= (1, 3):
        enabled.add(_NON_SEMANTIC)
    core = _ffi.new("VkPhysicalDeviceFeatures*")
    supported_core = _ffi.new("VkPhysicalDeviceFeatures*")
    _lib.vkGetPhysicalDeviceFeatures(info.handle, supported_core)
    for feature in _CORE_FEATURES:
        if getattr(supported_core, feature):
            setattr(core, feature, 1)
            enabled.add(feature)
    chain, keep = _ffi.NULL, []  # (cffi keeps no struct alive through another's pNext)
    for kind, stype, since, extension, features in _FEATURE_STRUCTS:
        if not _usable(info, version, since, extension):
            continue
        supported = _struct(kind, "PHYSICAL_DEVICE_" + stype)
        _lib.vkGetPhysicalDeviceFeatures2(info.handle, _struct(
            "VkPhysicalDeviceFeatures2", "PHYSICAL_DEVICE_FEATURES_2", pNext=supported))
        wanted = [feature for feature in features if getattr(supported, feature)]
        if not wanted:
            continue
        chain = _struct(kind, "PHYSICAL_DEVICE_" + stype, pNext=chain, **{feature: 1 for feature in wanted})
        keep.append(chain)
        enabled.update(wanted)
        if not (since is not None and version >= since) and extension not in names:
            names.append(extension)
    enabled |= _shader_properties(info, version, names)
    c_names = [_ffi.new("char[]", n.encode()) for n in names]
    name_array = _ffi.new("char*[]", c_names)
    priority = _ffi.new("float[1]", [1.0])
    queue = _struct(
        "VkDeviceQueueCreateInfo", "DEVICE_QUEUE_CREATE_INFO", queueFamilyIndex=family, queueCount=1,
        pQueuePriorities=priority,
    )
    create = _struct(
        "VkDeviceCreateInfo", "DEVICE_CREATE_INFO", queueCreateInfoCount=1, pQueueCreateInfos=queue,
        enabledExtensionCount=len(names), ppEnabledExtensionNames=name_array, pEnabledFeatures=core, pNext=chain,
    )
    device = _create(_lib.vkCreateDevice, "VkDevice", "vkCreateDevice", info.handle, create, _ffi.NULL)
    return device, frozenset(enabled)


def _shader_properties(info: _PhysicalInfo, version: tuple[int, int], names: list[str]) -> set[str]:
    """The subgroup operations the device supports in the compute stage and its float controls, by the names
    of :data:`_SUBGROUP_OPERATIONS` and :data:`_FLOAT_CONTROLS`; appends VK_KHR_shader_float_controls to the
    extension ``names`` where a device older than Vulkan 1.2 needs it for kernels to use them."""
    subgroup = _struct("VkPhysicalDeviceSubgroupProperties", "PHYSICAL_DEVICE_SUBGROUP_PROPERTIES")
    controls = _struct("VkPhysicalDeviceFloatControlsProperties", "PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES")
    has_controls = _usable(info, version, (1, 2), "VK_KHR_shader_float_controls")
    subgroup.pNext = controls if has_controls else _ffi.NULL
    _lib.vkGetPhysicalDeviceProperties2(info.handle, _struct(
        "VkPhysicalDeviceProperties2", "PHYSICAL_DEVICE_PROPERTIES_2", pNext=subgroup))
    found = set()
    if subgroup.supportedStages & _vk.VK_SHADER_STAGE_COMPUTE_BIT:
        found = {name for key, name in _SUBGROUP_OPERATIONS.items()
                 if subgroup.supportedOperations & getattr(_vk, f"VK_SUBGROUP_FEATURE_{key}_BIT")}
    if has_controls:
        found |= {name for name in _FLOAT_CONTROLS if getattr(controls, name)}
        if version < (1, 2) and any(name in found for name in _FLOAT_CONTROLS):
            names.append("VK_KHR_shader_float_controls")
    return found
