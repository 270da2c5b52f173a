"""Pipelines: compute pipelines whose buffers are pushed per dispatch.

Every module is compiled with its buffers renumbered 0..N-1 in set 0, in the order of their
(set, binding) (``libshare.arbiter.programs.spirv.bound_in_set_zero``), so that one push-descriptor
set binds them all whatever sets and bindings the kernel declared; each binding of the set
layout is a storage or a uniform buffer, or a storage or a uniform texel buffer, as the kernel declared it
(:attr:`Pipeline.uniform`, :attr:`Pipeline.texel`), one descriptor or, for an array of buffers, its
length of them (``buffer_layout``): the pipeline's buffers are its bindings' descriptors one after the
other (:attr:`Pipeline.continued`).
Its shared, private and function variables are zero-initialized
(``libshare.arbiter.programs.spirv.zero_initialized``): what a kernel did not write reads as zeros, never as
what another client's kernel left in that memory.

Compiles run on any thread (:meth:`Pipelines.create`), so that a long compile never holds up
the thread that submits: Vulkan lets pipeline creation run beside anything but the destruction
of the device. The compile guard counts the compiles under way, and the device is marked
closed under it (:meth:`Pipelines.stop_compiles`, which ``Device.close`` calls first), so a
compile either starts before closing began, and closing waits for it, or is refused.

:class:`Pipelines` does not know which commands name a pipeline (the recording cache does:
the Device asks it before a destroy, see ``Device.destroy_pipeline``).
"""

from __future__ import annotations

import threading
from typing import Any

from libshare.arbiter.programs.spirv import bound_in_set_zero, buffer_layout, zero_initialized
from libshare.errors import InvalidSubmission
from libshare.ring import C

from libshare.arbiter.device._binding import _address, _check, _create, _struct, _uses_binding
from libshare.arbiter.device._instance import Instance

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding
# VK_PIPELINE_CREATE_DISPATCH_BASE_BIT (core in Vulkan 1.1; the vulkan package's name for it is None): the
# engine may run a dispatch in pieces, each with vkCmdDispatchBase (policy/engine_policy.c, "Pieces")
_DISPATCH_BASE = 0x10
_DESCRIPTOR_TYPES = {(False, False): 7, (False, True): 6, (True, False): 5, (True, True): 4}
"""A binding's VkDescriptorType by (texel, uniform): STORAGE_BUFFER, UNIFORM_BUFFER, STORAGE_TEXEL_BUFFER,
UNIFORM_TEXEL_BUFFER."""


class Pipeline:
    """A compute pipeline: SPIR-V, ``binding_count`` buffers in set 0 (those in ``uniform`` uniform
    buffers, the others storage buffers; those in ``texel`` texel buffers of those kinds), push size."""

    __slots__ = ("binding_count", "push_size", "uniform", "texel", "continued", "_device", "_pipeline", "_layout",
                 "_set_layout")

    def __init__(self, device: Instance, binding_count: int, push_size: int, pipeline: Any, layout: Any,
                 set_layout: Any, uniform: frozenset[int] = frozenset(), texel: dict | None = None,
                 counts: tuple[int, ...] = ()):
        self.binding_count = binding_count
        self.push_size = push_size
        self.uniform = uniform
        """The buffers that are uniform buffers or uniform texel buffers."""
        self.texel: dict[int, tuple[str, ...]] = texel or {}
        """The buffers that are texel buffers, each with the view formats it takes (libshare.protocol.texels)."""
        firsts = {sum(counts[:k]) for k in range(len(counts))}
        self.continued = frozenset(k for k in range(sum(counts)) if k not in firsts)
        """The buffers that are the next element of an array of buffers (after buffer k - 1)."""
        self._device: Instance | None = device  # the device it lives on; None once destroyed
        self._pipeline, self._layout, self._set_layout = pipeline, layout, set_layout

    @property
    def alive(self) -> bool:
        """False once destroyed (or once its device closed)."""
        return self._device is not None

    @property
    def native(self) -> tuple[int, int]:
        """The (VkPipeline, VkPipelineLayout) handles as integers, for a native engine."""
        return _address(self._pipeline), _address(self._layout)

    def __repr__(self) -> str:
        return f"<Pipeline bindings={self.binding_count} push={self.push_size}{'' if self.alive else ', destroyed'}>"


class Pipelines:
    """Pipelines of a Device: creation on any thread, destruction (a part of a Device)."""

    def __init__(self, instance: Instance):
        self._instance = instance
        self._device = instance.handle  # the VkDevice
        self._compiles = 0  # create calls under way, on any thread
        self._compile_guard = threading.Condition()
        self._pipelines: set[Pipeline] = set()

    def create(self, spirv: bytes, binding_count: int, push_size: int, entry: str = "main") -> Pipeline:
        """A compute pipeline whose bindings 0..binding_count-1 of set 0 are storage
        buffers (pushed per dispatch with VK_KHR_push_descriptor, no descriptor pools)
        and whose push-constant block is ``push_size`` bytes. May run on any thread.
        """
        self._check_pipeline_args(spirv, binding_count, push_size)
        spirv = bound_in_set_zero(spirv)  # one push-descriptor set binds every buffer
        counts, uniform, texel = buffer_layout(spirv)
        if sum(counts) != binding_count:
            raise InvalidSubmission(f"the module binds {sum(counts)} buffers, not {binding_count}")
        # no kernel reads memory it did not write
        spirv = zero_initialized(spirv, self._instance.zero_workgroup_memory)
        with self._compile_guard:
            self._instance.require_open()
            self._compiles += 1
        result = None
        try:
            result = self._build_pipeline(spirv, counts, push_size, entry, uniform, texel)
        finally:
            with self._compile_guard:  # closing waits for this, so it destroys the new pipeline too
                if result is not None:
                    self._pipelines.add(result)
                self._compiles -= 1
                self._compile_guard.notify_all()
        return result

    def _build_pipeline(self, spirv: bytes, counts: tuple[int, ...], push_size: int, entry: str,
                        uniform: frozenset[int], texel: dict[int, tuple[str, ...]]) -> Pipeline:
        """Create the set layout, layout, module and pipeline; destroy the parts on failure."""
        set_layout = self._create_set_layout(counts, uniform, texel)
        layout = module = None
        try:
            layout = self._create_layout(set_layout, push_size)
            module = self._create_module(spirv)
            pipeline = self._create_compute(module, layout, entry)
        except BaseException:
            if layout is not None:
                _lib.vkDestroyPipelineLayout(self._device, layout, _ffi.NULL)
            _lib.vkDestroyDescriptorSetLayout(self._device, set_layout, _ffi.NULL)
            raise
        finally:
            if module is not None:
                _lib.vkDestroyShaderModule(self._device, module, _ffi.NULL)
        return Pipeline(self._instance, sum(counts), push_size, pipeline, layout, set_layout, uniform, texel, counts)

    def destroyable(self, p: Pipeline) -> bool:
        """Whether :meth:`destroy` would destroy ``p``: it is alive and the device open."""
        return p.alive and not self._instance.closed

    def destroy(self, p: Pipeline) -> None:
        """Destroy ``p``. Idempotent.

        The caller has made sure that no command names it (``Device.destroy_pipeline`` asks the
        recording cache, which refuses while an unreleased submission uses it).
        """
        if not self.destroyable(p):
            return
        self._pipelines.discard(p)
        _destroy_pipeline_handles(self._device, p)

    def stop_compiles(self, timeout: float | None) -> bool | None:
        """Mark the device closed, so that no compile starts, and wait up to ``timeout`` seconds
        (None: no limit) for those under way: True once none runs, False when one still does,
        None when the device was closed already."""
        with self._compile_guard:
            if self._instance.closed:
                return None
            self._instance.closed = True
            return self._compile_guard.wait_for(lambda: self._compiles == 0, timeout)

    def _check_pipeline_args(self, spirv: bytes, binding_count: int, push_size: int) -> None:
        """Reject what the driver would otherwise trip over."""
        if len(spirv) < 20 or len(spirv) % 4 or int.from_bytes(spirv[:4], "little") != 0x07230203:
            raise InvalidSubmission("not a SPIR-V module (bad length or magic number)")
        limit = self._instance.physical.max_push_descriptors
        if not 0 <= binding_count <= limit:
            raise InvalidSubmission(f"binding_count must be 0..{limit} (got {binding_count})")
        most = min(self._instance.max_push_constants_size, C.MAX_PUSH)  # what a descriptor carries
        if push_size < 0 or push_size % 4 or push_size > most:
            raise InvalidSubmission(f"push_size must be a multiple of 4 up to {most} bytes (got {push_size})")

    def _create_set_layout(self, counts: tuple[int, ...], uniform: frozenset[int], texel: dict) -> Any:
        """A push-descriptor set layout of ``len(counts)`` bindings, binding i ``counts[i]`` buffers:
        uniform ones at ``uniform`` (of the buffers, counted one after the other), storage ones elsewhere;
        texel buffers at ``texel``, buffers elsewhere."""
        binding_count = len(counts)
        bindings = _ffi.new("VkDescriptorSetLayoutBinding[]", max(binding_count, 1))
        for i in range(binding_count):
            first = sum(counts[:i])
            bindings[i].binding = i
            bindings[i].descriptorType = _DESCRIPTOR_TYPES[first in texel, first in uniform]
            bindings[i].descriptorCount = counts[i]
            bindings[i].stageFlags = _vk.VK_SHADER_STAGE_COMPUTE_BIT
        info = _struct(
            "VkDescriptorSetLayoutCreateInfo", "DESCRIPTOR_SET_LAYOUT_CREATE_INFO",
            flags=_vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
            bindingCount=binding_count, pBindings=bindings,
        )
        return _create(
            _lib.vkCreateDescriptorSetLayout, "VkDescriptorSetLayout", "vkCreateDescriptorSetLayout",
            self._device, info, _ffi.NULL,
        )

    def _create_layout(self, set_layout: Any, push_size: int) -> Any:
        """The pipeline layout: one set, one compute push-constant range."""
        ranges = _ffi.new("VkPushConstantRange*", {"stageFlags": _vk.VK_SHADER_STAGE_COMPUTE_BIT, "size": push_size})
        set_layouts = _ffi.new("VkDescriptorSetLayout[1]", [set_layout])
        info = _struct(
            "VkPipelineLayoutCreateInfo", "PIPELINE_LAYOUT_CREATE_INFO",
            setLayoutCount=1, pSetLayouts=set_layouts,
            pushConstantRangeCount=1 if push_size else 0, pPushConstantRanges=ranges,
        )
        return _create(
            _lib.vkCreatePipelineLayout, "VkPipelineLayout", "vkCreatePipelineLayout", self._device, info, _ffi.NULL
        )

    def _create_module(self, spirv: bytes) -> Any:
        """A shader module from SPIR-V bytes."""
        code = _ffi.new("uint32_t[]", len(spirv) // 4)
        _ffi.memmove(code, spirv, len(spirv))
        info = _struct("VkShaderModuleCreateInfo", "SHADER_MODULE_CREATE_INFO", codeSize=len(spirv), pCode=code)
        return _create(
            _lib.vkCreateShaderModule, "VkShaderModule", "vkCreateShaderModule", self._device, info, _ffi.NULL
        )

    def _create_compute(self, module: Any, layout: Any, entry: str) -> Any:
        """vkCreateComputePipelines for one stage."""
        name = _ffi.new("char[]", entry.encode())
        stage = {
            "sType": _vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
            "stage": _vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": module, "pName": name,
        }
        info = _struct("VkComputePipelineCreateInfo", "COMPUTE_PIPELINE_CREATE_INFO", stage=stage, layout=layout,
                       flags=_DISPATCH_BASE)
        out = _ffi.new("VkPipeline*")
        result = _lib.vkCreateComputePipelines(self._device, _ffi.NULL, 1, info, _ffi.NULL, out)
        _check(result, "vkCreateComputePipelines")
        return out[0]

    def close(self) -> None:
        """Destroy every pipeline (Device.close, once no compile runs)."""
        for pipeline in self._pipelines:
            _destroy_pipeline_handles(self._device, pipeline)
        self._pipelines.clear()


def _destroy_pipeline_handles(device: Any, p: Pipeline) -> None:
    """Destroy a pipeline with its layouts, and mark it dead."""
    _lib.vkDestroyPipeline(device, p._pipeline, _ffi.NULL)
    _lib.vkDestroyPipelineLayout(device, p._layout, _ffi.NULL)
    _lib.vkDestroyDescriptorSetLayout(device, p._set_layout, _ffi.NULL)
    p._device = None
