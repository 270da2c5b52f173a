"""Python face of the ring: the mapped region, its header and its lifetime.

A :class:`Region` is one memfd holding a submission ring of several lanes and
a completion ring (see ring.c for the design). It is composed of one object per
part, each over the same mapping: ``region.lanes`` (:class:`Lanes`: the
submission lanes, their producers and their consumer), ``region.completions``
(:class:`Completions`: the completion ring) and ``region.peers`` (:class:`Peers`:
who is on each side, and how each wakes the other). The memfd has no name, so
nothing ever appears in /dev/shm and no other user can open it; another
process attaches by receiving its file descriptor (``socket.send_fds``) or by
inheriting it, and the memory goes away when the last mapping and descriptor
close, however the processes died.

Every memfd the arbiter hands a client (this region, and each shared buffer) is
made by :func:`sealed_memfd`: sized once, then sealed against shrinking and
growing (``F_SEAL_SHRINK | F_SEAL_GROW``, and ``F_SEAL_SEAL`` so the seals
stay). A client holds the same open file as the arbiter; without the seals it
could ``ftruncate`` it to nothing, and the arbiter's next access to its mapping
would die of SIGBUS. Sealed, ``ftruncate`` fails with EPERM in every process.
Writing stays allowed: that is what the memory is for, and a ring peer's
writes are checked anyway.

A mapping keeps no descriptor (:class:`SharedMapping`). Python's ``mmap.mmap``
keeps a duplicate of the file descriptor for as long as the mapping lives; in the
arbiter, which maps every client's ring and every shared buffer, that was one
descriptor per ring and per buffer, and descriptors are what bounds how many
clients one arbiter can serve (see arbiter/serve/server.py, "Descriptors").

Every call that needs atomics goes through the C core, through the thin
functions of _binding.py; these modules only move bytes between numpy arrays
and C.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import threading

from libshare import errors
from libshare.ring import _binding
from libshare.ring._completions import Completions
from libshare.ring._lanes import Lanes
from libshare.ring._peers import Peers

__all__ = ["Region", "SharedMapping", "sealed_memfd", "check_sealed_memfd"]

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def sealed_memfd(name: str, size: int) -> int:
    """A new memfd of ``size`` bytes (close-on-exec) whose size no process can change any more."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


_WRITE_SEALS = fcntl.F_SEAL_WRITE | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)


def check_sealed_memfd(fd: int, size: int) -> None:
    """Check that a descriptor a peer sent is what :func:`sealed_memfd` makes: a memfd of exactly
    ``size`` bytes, of ordinary pages, open for reading and writing, whose size no process can change and which no
    process can make read-only (so that mapping it can never fault); InvalidSubmission if not.

    ``F_SEAL_SEAL`` makes the seals final, so what is checked here stays true afterwards."""
    try:
        status = os.fstat(fd)
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # EINVAL for anything but a memfd (shmem)
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError as exc:
        raise errors.InvalidSubmission(f"the descriptor is not a sealed memfd ({exc.strerror})") from None
    if seals & _SEALS != _SEALS or seals & _WRITE_SEALS:
        raise errors.InvalidSubmission(f"the memfd's seals are {seals:#x}: a buffer's memfd is sealed against "
                                       "shrinking and growing (and sealing), and not against writing")
    if status.st_size != size:
        raise errors.InvalidSubmission(f"the memfd holds {status.st_size} bytes, not the {size} declared")
    if status.st_blksize != mmap.PAGESIZE:  # hugetlbfs: its pages are reserved apart, and mapping may fail
        raise errors.InvalidSubmission(f"the memfd has {status.st_blksize}-byte pages (MFD_HUGETLB?): a buffer's "
                                       f"memfd is a plain one, of {mmap.PAGESIZE}-byte pages")
    if mode != os.O_RDWR:
        raise errors.InvalidSubmission("the memfd is not open for reading and writing")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class SharedMapping:
    """A read-write MAP_SHARED mapping of ``size`` bytes of ``fd`` that keeps no descriptor.

    ``address`` is where it lies; ``view`` is a writable buffer over it (slices, struct,
    numpy, cffi). Unlike ``mmap.mmap`` nothing stops :meth:`close` while a view is in use:
    the owner closes it once nothing can touch it (the region's lock, the arbiter's drain
    thread).
    """

    def __init__(self, fd: int, size: int):
        address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, f"mmap of {size} bytes failed: {os.strerror(error)}")
        self.address: int = address
        """Start of the mapping (0 once closed)."""
        self.size = size
        self.view = (ctypes.c_char * size).from_address(address)

    def close(self) -> None:
        """Unmap. Idempotent."""
        if self.address:
            self.view = None
            _libc.munmap(self.address, self.size)
            self.address = 0


class Region:
    """A shared-memory region with a submission ring and a completion ring.

    ``Region.create`` makes a new one; ``Region.attach(fd)`` maps one made by
    another process. ``close()`` unmaps this process's view and is idempotent.
    Its parts: :attr:`lanes`, :attr:`completions`, :attr:`peers`.
    """

    def __init__(self, fd: int, *, owns_fd: bool = True, mapping: SharedMapping | None = None):
        self._lock = threading.Lock()
        self._handle = None
        self._fd = fd if owns_fd else os.dup(fd)
        try:
            size = mapping.size if mapping is not None else os.fstat(self._fd).st_size
            if size <= 0:
                raise ValueError("the region is empty")
            self._mapping = mapping if mapping is not None else SharedMapping(self._fd, size)
        except (OSError, ValueError) as exc:
            os.close(self._fd)
            raise errors.RingCorrupted(f"cannot map ring region from fd {fd}: {exc}") from exc
        self._map = self._mapping.view  # a writable buffer over the region
        try:
            handle = _binding.region_open(self._mapping.address, size)
        except BaseException:
            self._unmap()
            raise
        self._handle = handle
        self.lane_count, self.lane_entries, self.cq_entries = _binding.region_geometry(handle)
        """Submission lanes (the most threads that can push at once), slots per lane, completion slots."""
        self.size: int = size
        """Bytes mapped."""
        self.lanes = Lanes(self)
        """The submission lanes: this thread's :class:`Producer`, and the consumer's pops."""
        self.completions = Completions(self)
        """The completion ring: the consumer's posts, the client's takes and waits."""
        self.peers = Peers(self)
        """Who is on each side, and how this view's waits wake and spin."""

    @classmethod
    def create(cls, lanes: int = 8, lane_entries: int = 256, cq_entries: int = 1024) -> Region:
        """Make a new anonymous region (memfd) with the given geometry and attach to it."""
        size = _binding.region_size(lanes, lane_entries, cq_entries)
        fd = sealed_memfd("libshare-ring", size)
        mapping = None
        try:  # formatted through the mapping the region keeps (one mmap, not two)
            mapping = SharedMapping(fd, size)
            _binding.region_format(mapping.address, size, lanes, lane_entries, cq_entries, os.getpid())
        except BaseException:
            if mapping is not None:
                mapping.close()
            os.close(fd)
            raise
        return cls(fd, mapping=mapping)

    @classmethod
    def attach(cls, fd: int) -> Region:
        """Map a region from a file descriptor received from its creator (the fd is duplicated)."""
        return cls(fd, owns_fd=False)

    @property
    def fd(self) -> int:
        """The memfd, to pass to the peer with ``socket.send_fds`` (until :meth:`forget_fd`)."""
        self._require_open()
        if self._fd < 0:
            raise ValueError("this region's descriptor was closed once handed over (forget_fd)")
        return self._fd

    def forget_fd(self) -> None:
        """Close this process's descriptor of the region once the peer has it; the mapping stays.

        The arbiter does this after the welcome, so that a client's ring costs it no descriptor
        of its own (the mapping keeps none).
        """
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._handle is None

    def _require_open(self) -> None:
        if self._handle is None:
            raise ValueError("ring region is closed")

    def _c(self):
        """The C handle (``ls_region *``), for the parts and the sibling modules of this package."""
        if self._handle is None:
            raise ValueError("ring region is closed")
        return self._handle

    def _unmap(self) -> None:
        self._map = None
        self._mapping.close()
        if self._fd >= 0:
            os.close(self._fd)

    def close(self) -> None:
        """Unmap this process's view and close its descriptors. Idempotent."""
        with self._lock:
            if getattr(self, "_handle", None) is None:
                return
            _binding.region_close(self._handle)
            self._handle = None
            self.completions._release()
            self.peers._release()
            self._unmap()

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()
