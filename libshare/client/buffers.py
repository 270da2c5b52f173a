"""Client-side buffers: shared ones are memfds this process maps itself, device ones are ids.

A shared buffer's memory is mapped by the client and by the arbiter; the
arbiter imported its own mapping into Vulkan, so numpy arrays over the
client's mapping are read and written by the device with no copy anywhere.
Arrays are plain ``np.ndarray`` views whose ``.base`` chain ends in the
buffer's mmap; a dispatch finds the buffer (and the byte offset of a slice)
by walking that chain.

A shared buffer keeps its memfd open (one descriptor per buffer) and a program keeps
its SPIR-V, its specialization constants and its runtime arrays' lengths: that is what a session hands a new arbiter when it reattaches after a
restart, so that the same memory and the same programs carry on under new ids. A
device buffer's contents live only on the device: after a restart it is ``lost``.

A :class:`TexelView` (``Session.texel_view``) is part of a buffer seen as texels of a format
(libshare/protocol/texels.py), which a dispatch binds at a kernel's texel buffer; it keeps what
a new arbiter needs to make it again (its buffer, format, offset and size).
"""

from __future__ import annotations

import math
import mmap
import os

import numpy as np

from libshare import errors
from libshare.ring import C

__all__ = ["Buffer", "Program", "TOO_BIG", "TexelView", "array_triples", "byte_size", "constant_pairs", "workgroups"]

TOO_BIG = (f"at most {C.MAX_BUFFERS} buffers, {C.MAX_PUSH} push bytes and 3 group counts, each count "
           "and offset not negative and within 32 bits (offsets and sizes: 64 bits)")
"""What the encoder accepts (an operation past it is refused with LS_EBADSLOT)."""


class Buffer:
    """A buffer owned by the arbiter: ``kind`` is "shared" (mapped here) or "device"."""

    def __init__(self, session, buffer_id: int, size: int, kind: str, fd: int | None = None):
        self._session = session
        self.id = buffer_id
        """The arbiter's id for this buffer."""
        self.size = size
        """Size in bytes (rounded up to whole pages)."""
        self.kind = kind
        """"shared" (zero-copy, mapped in this process) or "device" (filled by copies)."""
        self.mapping: mmap.mmap | None = None
        """This process's mapping of a shared buffer; None for a device buffer."""
        self.address = 0
        """Address of the mapping in this process (0 for a device buffer)."""
        self.memfd = -1
        """The shared buffer's memfd, kept for a reattach (-1 for a device buffer, or once freed)."""
        if fd is not None:
            try:
                self.mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
            self.memfd = fd
            self.address = np.frombuffer(self.mapping, np.uint8, count=1).ctypes.data
        self.freed = False
        """True once :meth:`Session.free` let it go."""
        self.lost: Exception | None = None
        """Why the buffer no longer exists at the arbiter (a device buffer after a restart), or None."""

    def close_memfd(self) -> None:
        """Let go of the kept memfd (the mapping stays). Idempotent."""
        if self.memfd >= 0:
            os.close(self.memfd)
            self.memfd = -1

    def array(self, shape, dtype=np.float32, offset: int = 0) -> np.ndarray:
        """A numpy view on this shared buffer (no copy); raises for a device buffer."""
        if self.mapping is None:
            raise TypeError("a device buffer has no host view; copy it into a shared buffer first")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = np.dtype(dtype)
        count = int(math.prod(shape))  # np.prod costs microseconds on a tuple this small
        if offset < 0 or offset + count * dtype.itemsize > self.size:
            raise ValueError(f"{shape} of {dtype} at offset {offset} does not fit in {self.size} bytes")
        return np.frombuffer(self.mapping, dtype, count=count, offset=offset).reshape(shape)

    def __repr__(self) -> str:
        state = " freed" if self.freed else " lost" if self.lost else ""
        return f"<libshare.Buffer id={self.id} {self.kind} {self.size} bytes{state}>"


class TexelView:
    """Part of a buffer seen as texels of one format: what a dispatch binds at a kernel's texel buffer
    (``uniform samplerBuffer``, ``layout(r32f) uniform imageBuffer``). Made by :meth:`Session.texel_view`."""

    def __init__(self, view_id: int, buffer: Buffer, format: str, offset: int, nbytes: int):
        self.id = view_id
        """The arbiter's id for this view."""
        self.buffer = buffer
        """The buffer it views (freeing that buffer frees the view)."""
        self.format = format
        """Its texel format's name (``"r32f"``, ``"rgba8"``, ...: libshare.protocol.texels)."""
        self.offset = offset
        """The byte offset of its first texel in the buffer."""
        self.nbytes = nbytes
        """Its bytes: a whole number of texels."""
        self.freed = False
        """True once it, or its buffer, was freed."""
        self.lost: Exception | None = None
        """Why it no longer exists at the arbiter (its buffer was lost on a restart), or None."""

    def __repr__(self) -> str:
        state = " freed" if self.freed else " lost" if self.lost else ""
        return (f"<libshare.TexelView id={self.id} {self.format} of buffer {self.buffer.id} "
                f"[{self.offset}:{self.offset + self.nbytes}]{state}>")


class Program:
    """A program loaded into the arbiter, with the interface read from its SPIR-V."""

    def __init__(self, program_id: int, bindings: int, push_size: int, local_size: tuple[int, int, int],
                 spirv: bytes = b"", constants: list | None = None, arrays: list | None = None):
        self.id = program_id
        """The arbiter's id for this program (a new one after a reattach)."""
        self.spirv = spirv
        """The SPIR-V module it was loaded from (loaded again when the session reattaches)."""
        self.constants = dict(constants or ())
        """The values given to its specialization constants (SpecId: value; sent again on reattach)."""
        self.array_lengths = {(s, b): n for s, b, n in arrays or ()}
        """The lengths given to its runtime-sized arrays of buffers ((set, binding): length; sent again on reattach)."""
        self.lost: Exception | None = None
        """Why a new arbiter refused it on reattach, or None."""
        self.bindings = bindings
        """How many storage buffers it takes (bindings 0..N-1 of set 0)."""
        self.push_size = push_size
        """Bytes of push constants it declares."""
        self.local_size = local_size
        """Its workgroup size."""

    def __repr__(self) -> str:
        return f"<libshare.Program id={self.id} bindings={self.bindings} push={self.push_size}>"


def array_triples(array_lengths) -> list[list]:
    """``load_program``'s ``arrays`` field from a mapping of (set, binding) to the length of the runtime-sized
    array of buffers there (integers; the arbiter checks them against the module): ``[[set, binding,
    length], ...]`` in place order, empty for None."""
    if array_lengths is None:
        return []
    if not hasattr(array_lengths, "items"):
        raise TypeError(f"array_lengths must map (set, binding) to lengths, not {type(array_lengths).__name__}")
    triples = []
    for place, length in array_lengths.items():
        if not isinstance(place, tuple) or len(place) != 2:
            raise TypeError(f"array_lengths: a key is a (set, binding) pair (got {place!r})")
        triple = [*place, length]
        if not all(isinstance(part, (int, np.integer)) and not isinstance(part, bool) for part in triple):
            raise TypeError(f"array_lengths: set, binding and length are ints (got {place!r}: {length!r})")
        triples.append([int(part) for part in triple])
    return sorted(triples)


def constant_pairs(constants) -> list[list]:
    """``load_program``'s ``constants`` field from a mapping of SpecId to value (an int, a float or
    a bool; the arbiter checks each against the type the module declares): ``[[id, value], ...]``
    in id order, empty for None."""
    if constants is None:
        return []
    if not hasattr(constants, "items"):
        raise TypeError(f"constants must map SpecIds to values, not {type(constants).__name__}")
    pairs = []
    for spec_id, value in constants.items():
        if not isinstance(spec_id, int) or isinstance(spec_id, bool):
            raise TypeError(f"a specialization constant's id is an int (got {spec_id!r})")
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            value = value.item()
        if not isinstance(value, (bool, int, float)):
            raise TypeError(f"specialization constant {spec_id}'s value must be an int, a float or a bool "
                            f"(got {type(value).__name__})")
        pairs.append([spec_id, value])
    return sorted(pairs, key=lambda pair: pair[0])


def byte_size(item) -> int:
    """The bytes of a Buffer, or of an array over one."""
    return item.size if isinstance(item, Buffer) else item.nbytes


def workgroups(groups) -> tuple[int, int, int]:
    """Workgroup counts x, y, z from one to three of them (the missing ones are 1)."""
    if isinstance(groups, int):
        return groups, 1, 1
    groups = tuple(groups)
    if not 1 <= len(groups) <= 3:
        raise errors.InvalidSubmission(f"{TOO_BIG}: got {len(groups)} group counts")
    return groups + (1,) * (3 - len(groups))


def find_buffer(array: np.ndarray, by_mapping: dict[int, Buffer]) -> tuple[Buffer, int]:
    """The shared buffer an array views, and the byte offset of its first element."""
    if not array.flags.c_contiguous:
        raise BufferError("dispatch needs C-contiguous arrays; a strided view cannot be bound")
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
        if isinstance(base, memoryview):
            base = base.obj
    buffer = by_mapping.get(id(base)) if base is not None else None
    if buffer is None or buffer.freed:
        raise ValueError("array is not a view on a live buffer of this session (use session.array())")
    return buffer, array.ctypes.data - buffer.address
