"""The ``vulkan`` package and the helpers the device package calls it through.

Each module of the package that calls Vulkan keeps ``_vk``, ``_ffi`` and ``_lib`` as
globals of its own (the hot paths read them as plain globals) and registers them with
:func:`_uses_binding`; :func:`_load_binding`, which the first Device calls, sets them.
A failing VkResult becomes a libshare exception in one function, :func:`_error`.
"""

from __future__ import annotations

from typing import Any

from libshare.errors import InvalidSubmission, LibshareError, QuotaExceeded, ServerFault, VulkanUnavailable

_INSTALL_HINT = (
    "install a Vulkan loader and driver, e.g. `apt-get install libvulkan1 "
    "mesa-vulkan-drivers` (Mesa's lavapipe runs Vulkan on the CPU)"
)
_UINT64_MAX = (1 << 64) - 1

# The binding, loaded by the first Device (importing `vulkan` dlopens the loader and
# raises OSError when there is none, so it cannot happen at import time).
_vk: Any = None
_ffi: Any = None
_lib: Any = None
_users: list[dict[str, Any]] = [globals()]  # the globals of every module that calls Vulkan


def _uses_binding(namespace: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Have :func:`_load_binding` set ``_vk``, ``_ffi`` and ``_lib`` in a module's ``namespace``.

    Returns the three as they are now, for the module to define them:
    ``_vk, _ffi, _lib = _uses_binding(globals())``.
    """
    _users.append(namespace)
    return _vk, _ffi, _lib


def _load_binding() -> None:
    """Import the ``vulkan`` package, or raise VulkanUnavailable with a hint."""
    if _vk is not None:
        return
    try:
        import vulkan
    except (OSError, ImportError) as exc:
        raise VulkanUnavailable(f"cannot load Vulkan ({exc}); {_INSTALL_HINT}") from None
    for namespace in _users:
        namespace.update(_vk=vulkan, _ffi=vulkan.ffi, _lib=vulkan.lib)


# --------------------------------------------------------------------------- errors


def _result_name(result: int) -> str:
    """The VK_* name of a VkResult, for messages."""
    for name, value in vars(_vk).items():
        if isinstance(value, int) and value == result and name.startswith("VK_ERROR_"):
            return name
    return f"VkResult {result}"


def _error(result: int, what: str) -> LibshareError:
    """Map a failing VkResult to the libshare exception that says what it means."""
    message = f"{what} failed with {_result_name(result)}"
    if result == _vk.VK_ERROR_DEVICE_LOST:
        return ServerFault(f"{message}: the Vulkan device was lost; restart the arbiter")
    if result in (_vk.VK_ERROR_OUT_OF_HOST_MEMORY, _vk.VK_ERROR_OUT_OF_DEVICE_MEMORY):
        return QuotaExceeded(f"{message}: the device or host is out of memory")
    if result == _vk.VK_ERROR_INVALID_EXTERNAL_HANDLE:
        return InvalidSubmission(f"{message}: the driver refused the host memory")
    if result in (
        _vk.VK_ERROR_INITIALIZATION_FAILED,
        _vk.VK_ERROR_INCOMPATIBLE_DRIVER,
        _vk.VK_ERROR_EXTENSION_NOT_PRESENT,
        _vk.VK_ERROR_FEATURE_NOT_PRESENT,
        _vk.VK_ERROR_LAYER_NOT_PRESENT,
    ):
        return VulkanUnavailable(f"{message}; {_INSTALL_HINT}")
    return LibshareError(message)


def _check(result: Any, what: str) -> None:
    """Raise the mapped exception when a Vulkan call returned an error code."""
    if result is not None and result < 0:
        raise _error(result, what)


# ----------------------------------------------------------------- small ffi helpers


def _struct(ctype: str, stype: str, **fields: Any) -> Any:
    """A zeroed ``ctype*`` with ``sType`` set from ``VK_STRUCTURE_TYPE_<stype>``."""
    return _ffi.new(ctype + "*", dict(fields, sType=getattr(_vk, "VK_STRUCTURE_TYPE_" + stype)))


def _create(fn: Any, ctype: str, what: str, *args: Any) -> Any:
    """Call a vkCreate*/vkAllocate*-style function and return the handle it wrote."""
    out = _ffi.new(ctype + "*")
    _check(fn(*args, out), what)
    return out[0]


def _enumerate(fn: Any, ctype: str, *args: Any) -> Any:
    """The two-call idiom: ask for the count, then fill and return a ``ctype`` array.

    Keep the array itself: indexing it yields views that do not keep it alive.
    """
    count = _ffi.new("uint32_t*")
    _check(fn(*args, count, _ffi.NULL), "vkEnumerate*/vkGet*")
    items = _ffi.new(ctype + "[]", count[0])
    _check(fn(*args, count, items), "vkEnumerate*/vkGet*")
    return items


def _text(chars: Any) -> str:
    """A Python string from a fixed-size C char array."""
    return _ffi.string(chars).decode("utf-8", "replace")


def _address(handle: Any) -> int:
    """A Vulkan handle or struct pointer of the ``vulkan`` package as an integer (0 for NULL)."""
    return int(_ffi.cast("uintptr_t", handle))


def _timeout_ns(timeout: float | None) -> int:
    """Seconds (None: forever) as the uint64 nanoseconds vkWaitForFences takes."""
    if timeout is None:
        return _UINT64_MAX
    if 0 <= timeout < 1e10:
        return int(timeout * 1e9)
    return 0 if timeout < 0 else _UINT64_MAX


def _memory_barrier(src_access: int, dst_access: int) -> Any:
    """A prebuilt VkMemoryBarrier."""
    return _struct("VkMemoryBarrier", "MEMORY_BARRIER", srcAccessMask=src_access, dstAccessMask=dst_access)
