"""Python face of the ring: a mapped region, its producers, its consumer.

A :class:`Region` is one memfd holding a submission ring of several lanes and
a completion ring (see ring.c for the design). The memfd has no name, so
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
clients one arbiter can serve (see arbiter/_server.py, "Descriptors").

Every call that needs atomics goes through the C core; this module only
moves bytes between numpy arrays and C and turns return codes into errors.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import mmap
import os
import select
import threading
import time

import numpy as np

from libshare import errors
from libshare.ring._binding import C, CQE_DTYPE, DESC_DTYPE, check, ffi, lib

__all__ = ["Region", "Producer", "SharedMapping", "sealed_memfd", "check_sealed_memfd"]

_SPIN_NS = lib.LS_SPIN_NS  # polling before sleeping on a futex, yielding the core at each step (see ring.c)
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


def _ns(seconds: float | None) -> int:
    return -1 if seconds is None else max(0, int(seconds * 1e9))


def _as_bytes_source(descs, dtype: np.dtype):
    """A C pointer and an entry count for bytes or a contiguous array of ``dtype``."""
    if isinstance(descs, bytes):
        if len(descs) % dtype.itemsize:
            raise ValueError(f"{len(descs)} bytes is not a whole number of {dtype.itemsize}-byte entries")
        return descs, len(descs) // dtype.itemsize
    array = np.asarray(descs)
    if array.dtype != dtype:
        raise TypeError(f"expected entries of dtype {dtype}, got {array.dtype}")
    if not array.flags.c_contiguous:
        raise BufferError("entries must be C-contiguous; copy them first (np.ascontiguousarray)")
    return ffi.from_buffer("char[]", array), array.size


class Region:
    """A shared-memory region with a submission ring and a completion ring.

    ``Region.create`` makes a new one; ``Region.attach(fd)`` maps one made by
    another process. ``close()`` unmaps this process's view and is idempotent.
    """

    def __init__(self, fd: int, *, owns_fd: bool = True, mapping: SharedMapping | None = None):
        self._lock = threading.Lock()
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
        self._base = ffi.cast("char *", self._mapping.address)
        handle = ffi.new("ls_region **")
        rc = lib.ls_region_open(self._base, size, handle)
        if rc < 0:
            self._unmap()
            check(rc, None, "attach")
        self._handle = handle[0]
        header = lib.ls_region_header_of(self._handle)
        self.lane_count: int = header.lane_count
        """Submission lanes: the most threads that can push at once."""
        self.lane_entries: int = header.lane_entries
        """Slots per lane."""
        self.cq_entries: int = header.cq_entries
        """Completion slots."""
        self.size: int = size
        """Bytes mapped."""
        self._local = threading.local()
        self._cqe_out = np.empty(self.cq_entries, CQE_DTYPE)
        self._cqe_ptr = ffi.from_buffer("char[]", self._cqe_out)
        self._pidfd = -1
        self.spin_mode: int = C.SPIN_YIELD
        """How this view's waits spin (:meth:`set_spin_mode`)."""

    @classmethod
    def create(cls, lanes: int = 8, lane_entries: int = 256, cq_entries: int = 1024) -> Region:
        """Make a new anonymous region (memfd) with the given geometry and attach to it."""
        size = lib.ls_region_size(lanes, lane_entries, cq_entries)
        if size < 0:
            raise ValueError(
                f"bad ring geometry: lanes={lanes} (1..{C.MAX_LANES}), lane_entries={lane_entries} and "
                f"cq_entries={cq_entries} (powers of two up to {C.MAX_ENTRIES})"
            )
        fd = sealed_memfd("libshare-ring", size)
        mapping = None
        try:  # formatted through the mapping the region keeps (one mmap, not two)
            mapping = SharedMapping(fd, size)
            check(lib.ls_region_format(ffi.cast("char *", mapping.address), size, lanes, lane_entries,
                                       cq_entries, os.getpid()))
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

        The arbiter does this after the welcome, so that a client's ring costs it one
        descriptor (the one Python's mmap keeps) instead of two.
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

    # ---------------------------------------------------------------- liveness

    def watch_peer(self, pid: int) -> None:
        """Make waits raise :class:`ArbiterLost` soon after process ``pid`` exits."""
        self._require_open()
        if self._pidfd >= 0:
            os.close(self._pidfd)
        self._pidfd = os.pidfd_open(pid)
        lib.ls_set_peer_pidfd(self._handle, self._pidfd)

    def peer_alive(self) -> bool:
        """False once the process given to :meth:`watch_peer` has exited (True when none was)."""
        if self._pidfd < 0:
            return True
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)

    def announce_consumer(self, alive: bool = True) -> None:
        """Record this process as the consumer, alive or closed (a close wakes waiting clients)."""
        self._require_open()
        lib.ls_set_consumer(self._handle, os.getpid(), C.PEER_ALIVE if alive else C.PEER_CLOSED)

    def close_consumer(self, reason: int = 0) -> None:
        """Close the consumer side, saying why (0, C.ECANCELED or C.EFAULT); wakes waiting clients."""
        self._require_open()
        lib.ls_close_consumer(self._handle, reason)

    def close_reason(self) -> int:
        """Why the consumer closed (0 while it is open or after a plain shutdown)."""
        self._require_open()
        return lib.ls_close_reason(self._handle)

    def announce_client(self, alive: bool = True) -> None:
        """Record this process as the client, alive or closed."""
        self._require_open()
        lib.ls_set_client(self._handle, os.getpid(), C.PEER_ALIVE if alive else C.PEER_CLOSED)

    def set_spin_mode(self, mode: int) -> None:
        """How this view's waits spin before they sleep: C.SPIN_YIELD (the default: yield the core at
        each look), C.SPIN_KEEP (keep it: a realtime session's) or C.SPIN_NONE (sleep at once: a
        low-priority session's); see wait_for in ring.c."""
        self._require_open()
        check(lib.ls_set_spin_mode(self._handle, mode), None, "set the spin mode")
        self.spin_mode = mode

    def set_wake_fd(self, doorbell_fd: int) -> None:
        """The doorbell: a client wakes the consumer by writing 8 bytes to ``doorbell_fd`` (the socket
        the arbiter gave it, or an eventfd) instead of a futex, for a consumer that sleeps in poll();
        the arbiter, given its own end, sends a byte there for a client's async waiter."""
        self._require_open()
        lib.ls_set_wake_fd(self._handle, doorbell_fd)

    # ---------------------------------------------------------------- producer

    def producer(self) -> Producer:
        """This thread's producer: claims a lane on first use and keeps it for the thread's life."""
        producer = getattr(self._local, "producer", None)
        if producer is None or producer.lane is None:
            producer = Producer(self)
            self._local.producer = producer
        return producer

    def push(self, descs, timeout: float | None = None) -> None:
        """Push every descriptor (bytes or DESC_DTYPE array) from this thread's lane."""
        self.producer().push(descs, timeout)

    # ---------------------------------------------------------------- consumer

    def pending(self) -> int:
        """Descriptors published and not yet popped, over all lanes."""
        self._require_open()
        return check(lib.ls_sq_pending(self._handle), self._handle, "pending")

    def pop_into(self, out: np.ndarray, out_ptr=None) -> int:
        """Pop up to ``len(out)`` descriptors into ``out`` (a DESC_DTYPE array); return how many.

        A slot whose fields failed the ring's range checks arrives with opcode
        ``OP_BAD``. Pass ``out_ptr`` (``ffi.from_buffer`` of ``out``, made once)
        to skip making it on every call.
        """
        self._require_open()
        ptr = out_ptr if out_ptr is not None else ffi.from_buffer("char[]", out)
        return check(lib.ls_sq_pop(self._handle, ptr, len(out)), self._handle, "pop")

    def pop(self, max_count: int = 256) -> np.ndarray:
        """Pop up to ``max_count`` descriptors into a new DESC_DTYPE array."""
        out = np.empty(max_count, DESC_DTYPE)
        return out[: self.pop_into(out)]

    def wait(self, timeout: float | None = None, spin: float = _SPIN_NS / 1e9) -> int:
        """Block until descriptors are pending; return how many. Raises Timeout or ArbiterLost."""
        self._require_open()
        return check(lib.ls_sq_wait(self._handle, int(spin * 1e9), _ns(timeout)), self._handle, "wait")

    def arm(self) -> int:
        """Ask producers to ring before the caller sleeps elsewhere (epoll); return pending count.

        A positive result means entries arrived meanwhile: call :meth:`disarm` and drain
        instead of sleeping.
        """
        self._require_open()
        return check(lib.ls_sq_arm(self._handle), self._handle, "arm")

    def disarm(self) -> None:
        """Clear the wake-up request set by :meth:`arm` (the consumer is awake again)."""
        self._require_open()
        lib.ls_sq_disarm(self._handle)

    # ---------------------------------------------------------------- completions

    def post(self, cqes) -> int:
        """Post completions (bytes or CQE_DTYPE array); return how many fitted."""
        self._require_open()
        source, count = _as_bytes_source(cqes, CQE_DTYPE)
        return check(lib.ls_cq_post(self._handle, source, count), self._handle, "post")

    def completion_space(self) -> int:
        """Free completion slots, as the poster sees them."""
        self._require_open()
        return check(lib.ls_cq_space(self._handle), self._handle, "completion space")

    def completions(self, max_count: int | None = None) -> np.ndarray:
        """Take the completions that are ready (at most ``max_count``), without waiting."""
        self._require_open()
        limit = self.cq_entries if max_count is None else min(max_count, self.cq_entries)
        n = check(lib.ls_cq_pop(self._handle, self._cqe_ptr, limit), self._handle, "completions")
        return self._cqe_out[:n].copy()

    def completions_into(self, out: np.ndarray, out_ptr=None) -> int:
        """Take ready completions into ``out`` (a CQE_DTYPE array); return how many, without waiting."""
        self._require_open()
        ptr = out_ptr if out_ptr is not None else ffi.from_buffer("char[]", out)
        return check(lib.ls_cq_pop(self._handle, ptr, len(out)), self._handle, "completions")

    def arm_completions(self) -> int:
        """Ask for a byte on the doorbell socket with the next completion (for a waiter that polls
        it, such as an event loop); how many completions are ready already."""
        self._require_open()
        return check(lib.ls_cq_arm(self._handle), self._handle, "arm completions")

    def wait_completions(self, min_count: int = 1, timeout: float | None = None,
                         spin: float = _SPIN_NS / 1e9) -> int:
        """Block until ``min_count`` completions are ready; return how many are."""
        self._require_open()
        rc = lib.ls_cq_wait(self._handle, min_count, int(spin * 1e9), _ns(timeout))
        return check(rc, self._handle, "wait for completions")

    # ---------------------------------------------------------------- lifetime

    # ---------------------------------------------------------------- after a hand-over (client side)

    def _lane_slots(self):
        """(tail, head, the lane's slots as a DESC_DTYPE view) for each lane."""
        header = lib.ls_region_header_of(self._handle)
        lane_size, head_at = ffi.sizeof("struct ls_lane"), ffi.offsetof("struct ls_lane", "head")
        for lane in range(self.lane_count):
            start = header.lanes_offset + lane * header.lane_stride
            tail, = np.frombuffer(self._map, np.uint32, 1, start)
            head, = np.frombuffer(self._map, np.uint32, 1, start + head_at)
            yield int(tail), int(head), np.frombuffer(self._map, DESC_DTYPE, self.lane_entries, start + lane_size)

    def unconsumed_tickets(self) -> set[int]:
        """The tickets of the descriptors published in the lanes that the consumer has not taken."""
        self._require_open()
        tickets = set()
        mask = self.lane_entries - 1
        for tail, head, slots in self._lane_slots():
            waiting = (tail - head) & 0xFFFFFFFF
            for position in range(head, head + min(waiting, self.lane_entries)):
                tickets.add(int(slots[position & mask]["ticket"]))
        return tickets

    def descriptors_of(self, tickets: set[int]) -> np.ndarray:
        """Copies of the descriptors in the lanes whose ticket is in ``tickets``, in ticket order:
        the producer's own writes, read back to send them to a new consumer after a hand-over
        (they stay in their slots until this producer reuses them)."""
        self._require_open()
        wanted = np.fromiter(tickets, np.uint64, len(tickets))
        found = [slots[np.isin(slots["ticket"], wanted)] for _, _, slots in self._lane_slots()]
        descs = np.concatenate(found) if found else np.empty(0, DESC_DTYPE)
        _, first = np.unique(descs["ticket"], return_index=True)  # one copy each, in ticket order
        return descs[first].copy()

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
            lib.ls_region_close(self._handle)
            self._handle = None
            ffi.release(self._cqe_ptr)
            if self._pidfd >= 0:
                os.close(self._pidfd)
            self._unmap()

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()

    def _c(self):
        """The C handle, for the sibling modules of this package."""
        self._require_open()
        return self._handle


class Producer:
    """One thread's lane in a region's submission ring (single producer, lock-free)."""

    def __init__(self, region: Region):
        self._region = region
        handle = ffi.new("ls_producer **")
        check(lib.ls_producer_open(region._c(), threading.get_native_id(), os.getpid(), handle),
              None, "claim lane")
        self._handle = handle[0]
        self._push = lib.ls_push
        self.lane: int | None = lib.ls_producer_lane(self._handle)
        """The lane index this producer owns, None after release."""
        self.push_op = functools.partial(lib.ls_push_op, self._handle)
        """ring.h's ``ls_push_op`` on this lane, the client's one descriptor encoder: called as
        ``push_op(ticket, opcode, program, gx, gy, gz, nbuffers, ids, noffsets, offsets, push,
        push_size)`` (``ids`` and ``offsets`` sequences of ints, ``push`` bytes), it writes the slot
        in C and returns 1, 0 when the lane is full, or a negative code for :meth:`raise_for`.
        The caller keeps this producer (and its region) alive and unreleased while it calls it."""

    def try_push(self, descs) -> int:
        """Push as many descriptors as fit without waiting; return how many were pushed.

        ``descs`` is bytes (a multiple of 256) or a C-contiguous DESC_DTYPE array.
        """
        if type(descs) is bytes and not len(descs) & 255:
            n = self._push(self._handle, descs, len(descs) >> 8)
        else:
            source, count = _as_bytes_source(descs, DESC_DTYPE)
            n = self._push(self._handle, source, count)
        return n if n >= 0 else check(n, self._region._c(), "push")

    def push(self, descs, timeout: float | None = None) -> None:
        """Push every descriptor, waiting for space up to ``timeout`` seconds (None: forever)."""
        source, count = _as_bytes_source(descs, DESC_DTYPE)
        pushed = check(self._push(self._handle, source, count), self._region._c(), "push")
        if pushed < count:
            self._push_rest(source, count, pushed, timeout)

    def _push_rest(self, source, count: int, pushed: int, timeout: float | None) -> None:
        view = ffi.from_buffer("char[]", source) if isinstance(source, bytes) else source
        deadline = None if timeout is None else time.monotonic() + timeout
        while pushed < count:
            if deadline is not None and time.monotonic() > deadline:
                raise errors.RingFull(f"push: lane {self.lane} stayed full for {timeout} s "
                                      f"({pushed} of {count} descriptors pushed)")
            os.sched_yield()
            rest = view + pushed * C.DESC_SIZE
            pushed += check(self._push(self._handle, rest, count - pushed), self._region._c(), "push")

    def raise_for(self, rc: int) -> None:
        """Raise the error a negative :attr:`push_op` result stands for."""
        check(rc, self._region._c(), "push")

    def space(self) -> int:
        """Free slots in this lane."""
        return check(lib.ls_space(self._handle), self._region._c(), "space")

    def release(self) -> None:
        """Give the lane back so another thread may claim it. Idempotent."""
        if self.lane is not None and not self._region.closed:
            lib.ls_producer_close(self._handle)
        self.lane = None

    def __del__(self):
        if getattr(self, "lane", None) is not None:
            self.release()
