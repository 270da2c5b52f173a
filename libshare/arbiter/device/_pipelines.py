"""Pipelines: compute pipelines whose storage buffers are pushed per dispatch.

Every module is compiled with its shared, private and function variables zero-initialized
(``libshare.arbiter.programs.spirv.zero_initialized``): what a kernel did not write reads as zeros, never as
what another client's kernel left in that memory.

:meth:`~libshare.arbiter.device.Device.create_pipeline` may run on any thread, so that a long
compile never holds up the thread that submits: the compile guard counts the compiles under
way, and :meth:`~libshare.arbiter.device.Device.close` waits for them and refuses new ones.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from libshare.arbiter.programs.spirv import zero_initialized
from libshare.errors import InvalidSubmission

from libshare.arbiter.device._binding import _address, _check, _create, _struct, _uses_binding

if TYPE_CHECKING:
    from libshare.arbiter.device._device import Device

_vk, _ffi, _lib = _uses_binding(globals())  # set when the first Device loads the binding
# VK_PIPELINE_CREATE_DISPATCH_BASE_BIT (core in Vulkan 1.1; the vulkan package's name for it is None): the
# engine may run a dispatch in pieces, each with vkCmdDispatchBase (engine.c, "Pieces")
_DISPATCH_BASE = 0x10


class Pipeline:
    """A compute pipeline: SPIR-V, ``binding_count`` storage buffers in set 0, push size."""

    __slots__ = ("binding_count", "push_size", "_device", "_pipeline", "_layout", "_set_layout")

    def __init__(self, device: Device, binding_count: int, push_size: int, pipeline: Any, layout: Any, set_layout: Any):
        self.binding_count = binding_count
        self.push_size = push_size
        self._device: Device | None = device
        self._pipeline = pipeline
        self._layout = layout
        self._set_layout = set_layout

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


class _Pipelines:
    """Pipelines of a Device: creation on any thread, destruction (one of its parts)."""

    def _init_pipelines(self) -> None:
        """The compile guard and the live pipelines."""
        self._compiles = 0  # create_pipeline calls under way, on any thread
        self._compile_guard = threading.Condition()
        self._pipelines: set[Pipeline] = set()

    def create_pipeline(self, spirv: bytes, binding_count: int, push_size: int, entry: str = "main") -> Pipeline:
        """A compute pipeline whose bindings 0..binding_count-1 of set 0 are storage
        buffers (pushed per dispatch with VK_KHR_push_descriptor, no descriptor pools)
        and whose push-constant block is ``push_size`` bytes.
        """
        self._check_pipeline_args(spirv, binding_count, push_size)
        spirv = zero_initialized(spirv, self.zero_workgroup_memory)  # no kernel reads memory it did not write
        with self._compile_guard:
            self._require_open()
            self._compiles += 1
        result = None
        try:
            result = self._build_pipeline(spirv, binding_count, push_size, entry)
        finally:
            with self._compile_guard:  # close() waits for this, so it destroys the new pipeline too
                if result is not None:
                    self._pipelines.add(result)
                self._compiles -= 1
                self._compile_guard.notify_all()
        return result

    def _build_pipeline(self, spirv: bytes, binding_count: int, push_size: int, entry: str) -> Pipeline:
        """Create the set layout, layout, module and pipeline; destroy the parts on failure."""
        set_layout = self._create_set_layout(binding_count)
        layout = module = None
        try:
            layout = self._create_layout(set_layout, push_size)
            module = self._create_module(spirv)
            pipeline = self._create_compute(module, layout, entry)
        except BaseException:
            if layout is not None:
                _lib.vkDestroyPipelineLayout(self._handle, layout, _ffi.NULL)
            _lib.vkDestroyDescriptorSetLayout(self._handle, set_layout, _ffi.NULL)
            raise
        finally:
            if module is not None:
                _lib.vkDestroyShaderModule(self._handle, module, _ffi.NULL)
        return Pipeline(self, binding_count, push_size, pipeline, layout, set_layout)

    def destroy_pipeline(self, p: Pipeline) -> None:
        """Destroy ``p``. Idempotent; raises InvalidSubmission while work using it is unreleased."""
        if not p.alive or self._closed:
            return
        self._drop_users(p, "pipeline")
        self._pipelines.discard(p)
        _destroy_pipeline_handles(self._handle, p)

    def _check_pipeline_args(self, spirv: bytes, binding_count: int, push_size: int) -> None:
        """Reject what the driver would otherwise trip over."""
        if len(spirv) < 20 or len(spirv) % 4 or int.from_bytes(spirv[:4], "little") != 0x07230203:
            raise InvalidSubmission("not a SPIR-V module (bad length or magic number)")
        limit = self._physical.max_push_descriptors
        if not 0 <= binding_count <= limit:
            raise InvalidSubmission(f"binding_count must be 0..{limit} (got {binding_count})")
        if push_size < 0 or push_size % 4 or push_size > self.max_push_constants_size:
            raise InvalidSubmission(
                f"push_size must be a multiple of 4 up to {self.max_push_constants_size} bytes (got {push_size})"
            )

    def _create_set_layout(self, binding_count: int) -> Any:
        """A push-descriptor set layout of ``binding_count`` storage buffers."""
        bindings = _ffi.new("VkDescriptorSetLayoutBinding[]", max(binding_count, 1))
        for i in range(binding_count):
            bindings[i].binding = i
            bindings[i].descriptorType = _vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            bindings[i].descriptorCount = 1
            bindings[i].stageFlags = _vk.VK_SHADER_STAGE_COMPUTE_BIT
        info = _struct(
            "VkDescriptorSetLayoutCreateInfo", "DESCRIPTOR_SET_LAYOUT_CREATE_INFO",
            flags=_vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
            bindingCount=binding_count, pBindings=bindings,
        )
        return _create(
            _lib.vkCreateDescriptorSetLayout, "VkDescriptorSetLayout", "vkCreateDescriptorSetLayout",
            self._handle, info, _ffi.NULL,
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
            _lib.vkCreatePipelineLayout, "VkPipelineLayout", "vkCreatePipelineLayout", self._handle, info, _ffi.NULL
        )

    def _create_module(self, spirv: bytes) -> Any:
        """A shader module from SPIR-V bytes."""
        code = _ffi.new("uint32_t[]", len(spirv) // 4)
        _ffi.memmove(code, spirv, len(spirv))
        info = _struct("VkShaderModuleCreateInfo", "SHADER_MODULE_CREATE_INFO", codeSize=len(spirv), pCode=code)
        return _create(
            _lib.vkCreateShaderModule, "VkShaderModule", "vkCreateShaderModule", self._handle, info, _ffi.NULL
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
        result = _lib.vkCreateComputePipelines(self._handle, _ffi.NULL, 1, info, _ffi.NULL, out)
        _check(result, "vkCreateComputePipelines")
        return out[0]

    def _close_pipelines(self) -> None:
        """Destroy every pipeline (close(), once no compile runs)."""
        for pipeline in self._pipelines:
            _destroy_pipeline_handles(self._handle, pipeline)
        self._pipelines.clear()


def _destroy_pipeline_handles(device: Any, p: Pipeline) -> None:
    """Destroy a pipeline with its layouts, and mark it dead."""
    _lib.vkDestroyPipeline(device, p._pipeline, _ffi.NULL)
    _lib.vkDestroyPipelineLayout(device, p._layout, _ffi.NULL)
    _lib.vkDestroyDescriptorSetLayout(device, p._set_layout, _ffi.NULL)
    p._device = None
