"""The native engine's binding (engine.h): the only module that touches its ``ffi`` and ``lib``.

:class:`Engine` wraps one ``ls_engine``: the thread that pops, checks, records, submits,
retires and answers descriptors in C (see loop.c's essay). Its return codes become
exceptions here, in :func:`check`, and its structs become plain Python values.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

from libshare.errors import LibshareError
from libshare.protocol.texels import TEXEL_STORAGE, TEXEL_UNIFORM, format_code
from libshare.ring._binding import code_error
from libshare.ring._binding import ffi as ring_ffi
from libshare.arbiter.engine._engine_cffi import ffi, lib

log = logging.getLogger("libshare.arbiter")

BUFFER, PROGRAM, LIST = lib.LS_KIND_BUFFER, lib.LS_KIND_PROGRAM, lib.LS_KIND_LIST
GROUP, VIEW = lib.LS_KIND_GROUP, lib.LS_KIND_VIEW
MOST_COMMANDS = lib.LS_ENGINE_MAX_LIST
"""The most commands in one command list (engine/lists.c)."""
MOST_BINDINGS = lib.LS_ENGINE_MAX_BINDINGS
"""The most buffers one program binds, through a bind group past ring.h's LS_MAX_BUFFERS (engine/validate.c)."""
EVENTS = {name: getattr(lib, f"LS_EV_{name}") for name in
          ("RELEASED", "IDLE", "DROPPED", "WATCHDOG", "SUSPECT", "DEVICE", "MUTED")}
POP = lib.LS_ENGINE_POP
MOST_PIECES = lib.LS_ENGINE_MAX_PIECES
"""The most pieces one dispatch is cut into (policy/engine_policy.c, "Pieces")."""
assert (TEXEL_STORAGE, TEXEL_UNIFORM) == (lib.LS_VIEW_STORAGE, lib.LS_VIEW_UNIFORM)  # one meaning for the bits
_LOST = -4  # VK_ERROR_DEVICE_LOST: what a submission through a destroyed engine returns
_ENGINES: dict[int, Engine] = {}  # by the ls_engine address, for the planning callback


def check(rc: int, what: str) -> int:
    """``rc`` when it is a count; else the exception the error table (libshare/errors.py) gives its code,
    through the ring's :func:`~libshare.ring._binding.code_error` (the engine's ``LS_E*`` codes are
    ring.h's): ``MemoryError`` for ``-ENOMEM``, :class:`LibshareError` for a code the table lacks."""
    if rc >= 0:
        return rc
    if -rc == errno.ENOMEM:
        raise MemoryError(f"{what}: out of memory")
    raise code_error(-rc, f"{what} failed", unknown=LibshareError)


@dataclass
class Event:
    """One thing the engine tells the control plane (see LS_EV_* in engine.h)."""

    type: int
    client: int  # the client's slot
    code: int
    kind: int
    a: int
    b: int


@dataclass
class Stats:
    """A client's counters in the engine (struct ls_engine_stats)."""

    submitted: int
    completed: int
    errors: int
    device_ns: int
    cut: int  # dispatches run in pieces
    pieces: int  # ... and the pieces they ran in
    listed: int  # commands of command lists put in submissions
    popped_since: int
    charged_since: int
    charged_ns_since: int
    outstanding: int
    pending: int
    closing: int
    muted: int
    table_slots: int
    table_probes: int


_STATS_FIELDS = [f for f in Stats.__dataclass_fields__]


def _read_stats(read, engine, slot: int) -> Stats | None:
    """A client's counters through ``read`` (ls_engine_stats or ls_engine_take_usage) into a struct of this
    call's own; None for an unknown slot."""
    out = ffi.new("struct ls_engine_stats *")
    if read(engine, slot, out) < 0:
        return None
    return Stats(*(getattr(out, name) for name in _STATS_FIELDS))


class Engine:
    """One native engine on ``device``'s queue, with ``max_clients`` client slots.

    ``event_fd`` (an eventfd) is written whenever events wait; ``planner`` is called on the
    engine's thread (holding the GIL) before each planned pass, and calls :meth:`set_plan`.
    """

    def __init__(self, device, max_clients: int, event_fd: int, planner=None):
        handles = device.native_handles()
        config = ffi.new("struct ls_engine_config *", {
            "device": handles["device"], "queue": handles["queue"], "family": handles["family"],
            "host_memory_type": handles["host_memory_type"], "timestamp_mask": handles["timestamp_mask"],
            "timestamp_period_ns": handles["timestamp_period_ns"], "stamp_at_top": handles["stamp_at_top"],
            "max_storage_range": handles["max_storage_range"], "offset_alignment": handles["offset_alignment"],
            "max_uniform_range": handles["max_uniform_range"],
            "uniform_offset_alignment": handles["uniform_offset_alignment"],
            "max_groups": list(handles["max_group_count"]), "max_clients": max_clients, "event_fd": event_fd,
            "clamp_pipeline": handles["clamp"][0], "clamp_layout": handles["clamp"][1],
        })
        out = ffi.new("ls_engine **")
        check(lib.ls_engine_create(config, out), "creating the engine")
        self._e = out[0]
        self.max_clients = max_clients
        self.planner = planner
        self._events = ffi.new("struct ls_engine_event[]", 256)
        self._turns = ffi.new("struct ls_engine_turn[]", 64)
        self._clients = ffi.new("uint32_t[]", 64)
        self.abandoned = 0
        _ENGINES[int(ffi.cast("uintptr_t", self._e))] = self
        device.route_submissions(self._queue_submit)

    def _queue_submit(self, info: int, fence: int) -> int:
        return lib.ls_engine_queue_submit(self._e, info, fence) if self._e is not None else _LOST

    # ---------------------------------------------------------------- lifetime

    def start(self) -> None:
        """Start the engine's thread."""
        check(lib.ls_engine_start(self._e), "starting the engine")

    @property
    def thread_id(self) -> int:
        """The engine thread's id, once started."""
        return check(lib.ls_engine_thread_id(self._e), "the engine's thread id")

    def place(self, core: int | None) -> None:
        """Pin the engine thread to ``core``, where its polls yield (None: unplaced, its polls keep
        their core, and its cores are the caller's to set); see ls_engine_place."""
        check(lib.ls_engine_place(self._e, -1 if core is None else core), "placing the engine's thread")

    def stop(self, timeout: float) -> int:
        """Cancel queued work, give running work ``timeout`` s, abandon the rest; how many submissions
        were abandoned (their objects are never released)."""
        self.abandoned = check(lib.ls_engine_stop(self._e, int(max(timeout, 0) * 1e9)), "stopping the engine")
        return self.abandoned

    def destroy(self) -> bool:
        """Free the engine's Vulkan objects (False, and nothing freed, when abandoned work may use them)."""
        if self._e is None:
            return True
        if lib.ls_engine_destroy(self._e) < 0:
            return False
        _ENGINES.pop(int(ffi.cast("uintptr_t", self._e)), None)
        self._e = None
        return True

    def set_policy(self, *, planned: bool, timed: bool, watchdog: float | None, spin: float,
                   spin_clients: int, max_in_flight: int, plan_for: float) -> None:
        """The policy the engine enforces from its next pass on (see struct ls_engine_policy)."""
        lib.ls_engine_set_policy(self._e, ffi.new("struct ls_engine_policy *", {
            "planned": int(planned), "timed": int(timed),
            "watchdog_ns": int(watchdog * 1e9) if watchdog else 0, "spin_ns": int(spin * 1e9),
            "spin_clients": spin_clients, "max_in_flight": max_in_flight, "plan_ns": int(plan_for * 1e9)}))

    # ---------------------------------------------------------------- clients and objects

    def add_client(self, slot: int, region, doorbell_fd: int) -> None:
        """Start draining ``region`` (the arbiter's Region) as client ``slot``."""
        handle = int(ring_ffi.cast("uintptr_t", region._handle))  # the ring's own ls_region*
        check(lib.ls_engine_add_client(self._e, slot, handle, doorbell_fd), "adding a client to the engine")

    def set_busy_word(self, address: int) -> None:
        """Keep the slot (+ 1) of the client whose descriptors are being handled in the uint32 word at
        ``address`` (0 after), for a crash handler (see _emergency.c); 0 turns it off."""
        lib.ls_engine_set_busy_word(self._e, address)

    def close_client(self, slot: int, reason: int = 0) -> int:
        """Drain nothing more of ``slot`` (closing its ring for ``reason`` and cancelling what it holds,
        when non-zero); its outstanding count (0: reclaim it now)."""
        return check(lib.ls_engine_close_client(self._e, slot, reason), "closing a client")

    def remove_client(self, slot: int) -> None:
        """Forget ``slot`` (before its region is unmapped)."""
        lib.ls_engine_remove_client(self._e, slot)

    def put_program(self, slot: int, program_id: int, pipeline, bindings: int, push_size: int,
                    cuttable: bool = False) -> None:
        """Let ``slot``'s descriptors name ``pipeline`` (a device Pipeline) as ``program_id``; with
        ``cuttable``, its dispatches may run in pieces (policy/engine_policy.c, "Pieces")."""
        handle, layout = pipeline.native
        flags = lib.LS_ENGINE_CUTTABLE if cuttable else 0
        uniform_mask = sum(1 << k for k in pipeline.uniform)
        array_mask = sum(1 << k for k in pipeline.continued)
        formats = ffi.new("uint16_t[]", [sum(1 << format_code(name) for name in pipeline.texel.get(k, ()))
                                         for k in range(max(bindings, 1))])  # 0: a buffer binding
        check(lib.ls_engine_put_program(self._e, slot, program_id, handle, layout, bindings, uniform_mask,
                                        array_mask, push_size, flags, formats), "registering a program")

    def put_group(self, slot: int, group_id: int, program_id: int,
                  entries: list[tuple[int, int, int]]) -> None:
        """Let ``slot``'s dispatches of programs laid out as ``program_id`` bind ``entries`` (buffer id,
        offset, range: 0 to its end; one per binding) as bind group ``group_id``; each is checked now
        (engine/validate.c), a refusal names the first bad one."""
        count = len(entries)
        buffers = ffi.new("uint32_t[]", [e[0] for e in entries] or [0])
        offsets = ffi.new("uint64_t[]", [e[1] for e in entries] or [0])
        ranges = ffi.new("uint64_t[]", [e[2] for e in entries] or [0])
        bad = ffi.new("uint32_t *")
        rc = lib.ls_engine_put_group(self._e, slot, group_id, program_id, buffers, offsets, ranges, count, bad)
        if rc == -errno.EINVAL:
            raise code_error(errno.EINVAL, f"a bind group holds at most {MOST_BINDINGS} buffers (got {count})",
                             unknown=LibshareError)
        check(rc, f"making a bind group (at its binding {bad[0]}, or its program)")

    def put_list(self, slot: int, list_id: int, commands: bytes) -> None:
        """Let ``slot``'s LS_OP_LIST descriptors run ``commands`` (whole descriptors, 256 bytes each) as
        ``list_id``; each is checked as a popped one is (engine/lists.c), a refusal names the first bad one."""
        count = len(commands) // ring_ffi.sizeof("struct ls_desc")
        bad = ffi.new("uint32_t *")
        rc = lib.ls_engine_put_list(self._e, slot, list_id, commands, count, bad)
        if rc == -errno.EINVAL:
            raise code_error(errno.EINVAL, f"a command list holds 1 to {MOST_COMMANDS} commands (got {count})",
                             unknown=LibshareError)
        check(rc, f"registering a command list (its command {bad[0]})")

    def put_buffer(self, slot: int, buffer_id: int, buffer, size: int, view_of: tuple[int, str, int] | None = None) -> None:
        """Let ``slot``'s descriptors name ``buffer`` (a device Buffer) as ``buffer_id``; with ``view_of`` (its
        buffer's id, its texel format's name, its uses: LS_VIEW_* bits, libshare.protocol.texels' TEXEL_STORAGE
        and TEXEL_UNIFORM), ``buffer`` is a DeviceView that its dispatches name at texel bindings of those uses
        (``size``: its bytes), and it holds its buffer (engine/objects.c, "Views")."""
        if view_of is None:
            check(lib.ls_engine_put_buffer(self._e, slot, buffer_id, buffer.native, size), "registering a buffer")
            return
        of, format_name, uses = view_of
        check(lib.ls_engine_put_view(self._e, slot, buffer_id, of, buffer.native, buffer.offset, size,
                                     format_code(format_name), uses), "registering a texel view")

    def drop(self, slot: int, kind: int, object_id: int) -> bool:
        """Forget an object; True when commands still use it (an LS_EV_RELEASED event follows)."""
        rc = lib.ls_engine_drop(self._e, slot, kind, object_id)
        return rc == 1

    def stats(self, slot: int, take: bool = False) -> Stats | None:
        """``slot``'s counters, or None for an unknown slot; with ``take``, the *_since ones start again
        from 0 (the planner's, on the engine thread). Any thread: each call reads into its own struct
        (the C call releases the GIL: a shared struct could be overwritten by another thread's call
        before it is read, giving one client another's counters)."""
        return _read_stats(lib.ls_engine_take_usage if take else lib.ls_engine_stats, self._e, slot)

    def dropped(self, slot: int) -> bool:
        """True once the engine closed ``slot``'s ring as corrupt (its DROPPED event may still wait);
        False for a client not added yet (slot -1)."""
        return slot >= 0 and lib.ls_engine_dropped(self._e, slot) == 1

    # ---------------------------------------------------------------- faults, plans, events

    def set_fault(self, faulted: bool) -> None:
        """Stop popping (and answer finished work LS_EFAULT), or go on."""
        lib.ls_engine_set_fault(self._e, int(faulted))

    def in_flight(self) -> int:
        """Submissions on the device."""
        return lib.ls_engine_in_flight(self._e) if self._e is not None else 0

    def in_flight_clients(self) -> list[int]:
        """The slots of the clients with work on the device."""
        n = lib.ls_engine_in_flight_clients(self._e, self._clients, len(self._clients))
        return list(self._clients[0:n])

    def set_plan(self, turns: list[tuple[int, int, int, int]]) -> None:
        """The next planned pass: (slot, budget, rank, cut_us) in order (struct ls_engine_turn)."""
        if len(turns) > len(self._turns):
            self._turns = ffi.new("struct ls_engine_turn[]", 2 * len(turns))
        for k, (slot, budget, rank, cut_us) in enumerate(turns):
            turn = self._turns[k]
            turn.client, turn.budget, turn.rank, turn.cut_us = slot, budget, rank, cut_us
        check(lib.ls_engine_set_plan(self._e, self._turns, len(turns)), "setting the plan")

    def events(self) -> list[Event]:
        """The events queued since the last call, oldest first."""
        found = []
        while n := lib.ls_engine_events(self._e, self._events, len(self._events)):
            found.extend(Event(e.type, e.client, e.code, e.kind, e.a, e.b) for e in self._events[0:n])
            if n < len(self._events):
                break
        return found

    def wake(self) -> None:
        """Make the engine look at its rings now."""
        lib.ls_engine_wake(self._e)


@ffi.def_extern()
def ls_engine_plan_cb(engine) -> None:
    """The engine's thread asks for the turns of its next pass."""
    found = _ENGINES.get(int(ffi.cast("uintptr_t", engine)))
    try:
        if found is not None and found.planner is not None:
            found.planner()
    except Exception:  # never into C: an empty plan pops nothing, and the next pass asks again
        log.exception("planning a drain pass")

