"""A session's requests: their schemas, their handlers, and the descriptors they hand over.

Every frame is checked before anything reads it: its framing by protocol/wire.py, then its
fields against the request's schema (:data:`REQUESTS`; a hello's is hello.py's, a control
command's commands.FIELDS: the type and range of each field; unknown fields and ops are
refused, so a new request needs its schema here). A bad request gets an error reply
(ProtocolError, InvalidSubmission) and the connection goes on. A request that fails with an
OSError (out of descriptors or memory) is answered too, never taken for the client's
departure. Requests that touch the device (program load, alloc, free) run as control tasks
(drain/tasks.py: under the control lock, on the control thread or on the request's own).

Descriptors. A reply's descriptors are handed over: the arbiter closes its copy once sent. Only
``import`` carries one in (a shared buffer's memfd), and keeps none: its mapping needs no
descriptor. Every other request carries none, and one sent anyway is closed.

Programs. ``load_program`` carries the SPIR-V module as its payload and, optionally, the values
of its specialization constants (``constants``: ``[[id, value], ...]``, programs/specialize.py),
and the length of each runtime-sized array of buffers it declares (``arrays``: ``[[set, binding,
length], ...]``, programs/arrays.py), which the arbiter freezes into the module before admission: the
module admitted, vetted, compiled and identified by the quarantine is that specialized one, and no
driver is ever given other values.
Its reply says what the program is: ``program_id``, ``bindings`` (the buffers a bind group names),
``push_size``, ``local_size``, ``entry_point`` (the module's one entry point's name) and
``resources``: ``[[set, binding, count, kind], ...]``, the module's own (set, binding) of each
resource in the order a bind group names its buffers, the buffers it takes (an array's length) and
its kind (``storage``, ``uniform``, ``storage_texel``, ``uniform_texel``), which the Vulkan driver
checks a pipeline layout against (libshare/icd/pipeline.c).

Command lists. ``load_list`` carries a list's commands as its payload: whole descriptors (``struct
ls_desc``, 256 bytes each, their tickets ignored), 1 to ``LS_ENGINE_MAX_LIST``, each a dispatch or a
copy that the engine checks as it checks a popped descriptor (engine/lists.c; one with parameters,
``LS_LIST_ARG | k`` buffers or ``LS_DESC_SUBMISSION_PUSH``, as far as it can be before a submission
gives them), at most :data:`LISTS_PER_CLIENT` lists and :data:`LIST_COMMANDS_PER_CLIENT` commands in them a
client. ``free`` forgets one by ``list_id``.

Texel views. ``view`` makes a texel view of one of the client's buffers (serve/views.py: its
fields, checks and limits); ``free`` forgets one by ``view_id``, and freeing a buffer frees its views.

Bind groups. ``bind_group`` names a program (``program_id``: its layout) and, per binding, a buffer,
an offset and a range (``buffers``: ``[[buffer_id, offset, range], ...]``, range 0: to the buffer's
end; :func:`entries_rule`), at most ``LS_ENGINE_MAX_BINDINGS``; at a texel binding the entry names a
texel view, offset and range 0; the engine checks each entry as a dispatch checks a buffer or view
(engine/validate.c) and keeps them as a group object, which a dispatch names by id (``LS_DESC_GROUP``).
At most :data:`GROUPS_PER_CLIENT` a client; ``free`` forgets one by ``group_id``.

Reattaching. A session whose arbiter died hands the new one what it kept (its bind groups through ``bind_group`` with their ``id``): ``import`` (one
descriptor: a shared buffer's memfd, checked by ``check_sealed_memfd`` to be a memfd of the
size it says, writable, sealed against shrinking, growing and new seals, so that mapping it
can never fault; counted against the client's limits like an alloc) and ``load_program``,
each with the ``id`` it had (Client.new_id takes one only above every id it gave out, and none
past 2^31 - 1: a list's buffer id with the high bit is a parameter).

Memory a client receives is its own and nothing else: a shared buffer is a fresh memfd (its
pages start as zeros), sealed against resizing before it is sent, so that a client cannot
truncate it under the arbiter's mapping (see ring/_region.py); a device buffer reads as zeros
too: fresh anonymous pages on a CPU device, else a fill of zeros queued before its id is
returned (the device package). Every allocation is checked against the memory limits, down to
the total that the device fits (policy/limits.py), and each shared one against the descriptor
budget (fd_budget.py), before any memory exists.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import socket

from libshare.errors import InvalidSubmission, LibshareError, ProtocolError, QuotaExceeded, ServerNotReady
from libshare.protocol import wire as protocol
from libshare.ring._region import SharedMapping, check_sealed_memfd, sealed_memfd
from libshare.arbiter.engine.binding import MOST_BINDINGS, MOST_COMMANDS
from libshare.arbiter.serve.clients import BufferRecord, Client, GroupRecord, ListRecord, ProgramRecord, SharedMemory
from libshare.arbiter.serve.views import VIEW_FIELDS, make_view
from libshare.arbiter.programs.loading import check_program_quota
from libshare.arbiter.programs.arrays import arrays_rule
from libshare.arbiter.programs.specialize import constants_rule
from libshare.arbiter.drain.quarantine import COMPILE

__all__ = ["GROUPS_PER_CLIENT", "LIST_COMMANDS_PER_CLIENT", "LISTS_PER_CLIENT", "REQUESTS", "entries_rule", "Requests", "reply_error", "SCARCE"]

log = logging.getLogger("libshare.arbiter")

_PAGE = mmap.PAGESIZE
_MAX_BUFFER = 1 << 40
SCARCE = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS)  # out of descriptors or memory
_ID = protocol.integer(0, (1 << 63) - 1)
_KEPT_ID = protocol.integer(1, (1 << 31) - 1)  # an id a reattaching session asks to keep (Client.new_id)
_DESC_SIZE = 256  # struct ls_desc (ring.h; the engine's ls_engine_put_list reads whole ones)
LISTS_PER_CLIENT = 1024
"""Command lists a client holds at once, freed ones still running included."""
LIST_COMMANDS_PER_CLIENT = 64 * MOST_COMMANDS
"""Commands in a client's lists together (256 bytes each at the engine: 16 MiB), freed ones still running
included: 64 lists of the longest, or more shorter ones."""
GROUPS_PER_CLIENT = 4096
"""Bind groups a client holds at once, freed ones still in use included (each under 1 KiB)."""


def entries_rule(name: str, value):
    """A rule: a bind group's entries, 1 to LS_ENGINE_MAX_BINDINGS lists of [buffer_id, offset, range]
    (integers: an id, a byte offset and a byte count, 0 for to the buffer's end)."""
    if not isinstance(value, list) or not 0 < len(value) <= MOST_BINDINGS:
        raise InvalidSubmission(f"{name} must be a list of 1 to {MOST_BINDINGS} [buffer_id, offset, range] "
                                f"(got {protocol.short(value)})")
    for k, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) != 3:
            raise InvalidSubmission(f"{name}[{k}] must be [buffer_id, offset, range] (got {protocol.short(entry)})")
        for part, most in zip(entry, ((1 << 32) - 1, (1 << 64) - 1, (1 << 64) - 1)):
            protocol.integer(0, most)(f"{name}[{k}]", part)
    return value


def _op(name: str) -> dict:
    return {"op": (protocol.choice(name), True)}


REQUESTS = {
    "load_program": {**_op("load_program"), "id": (_KEPT_ID, False),  # the SPIR-V module is the payload
                     "constants": (constants_rule, False),  # [[SpecId, value], ...] (programs/specialize.py)
                     "arrays": (arrays_rule, False)},  # [[set, binding, length], ...] (programs/arrays.py)
    "alloc": {**_op("alloc"), "size": (protocol.integer(1, _MAX_BUFFER), True),
              "kind": (protocol.choice("shared", "device"), False)},
    "import": {**_op("import"), "size": (protocol.integer(_PAGE, _MAX_BUFFER), True),  # the memfd rides along
               "id": (_KEPT_ID, False)},
    "load_list": {**_op("load_list"), "id": (_KEPT_ID, False)},  # the commands are the payload
    "view": {**_op("view"), **VIEW_FIELDS},  # a texel view of a buffer (serve/views.py)
    "bind_group": {**_op("bind_group"), "program_id": (protocol.integer(0, (1 << 32) - 1), True), "buffers": (entries_rule, True),
                   "id": (_KEPT_ID, False)},
    "free": {**_op("free"), "buffer_id": (_ID, False), "program_id": (_ID, False), "list_id": (_ID, False),
             "group_id": (_ID, False), "view_id": (_ID, False)},
    "stats": _op("stats"),
}
"""The schema of each request of a session (see protocol.wire.check_fields)."""


def reply_error(conn: socket.socket, exc: Exception) -> None:
    """Refuse a request with ``exc`` (a peer that is gone is not told)."""
    try:
        protocol.send(conn, protocol.error_reply(exc))
    except (LibshareError, OSError):
        pass


class Requests:
    """Answers a welcomed client's requests for ``arbiter`` (its drainer, device, limits, quotas,
    vetting compilers); ``attached()`` counts the clients attached (the descriptor budget's
    reserve, and ``stats``)."""

    def __init__(self, arbiter, attached):
        self._arbiter, self._attached = arbiter, attached
        self._handlers = {"load_program": self._load_program, "alloc": self._alloc, "import": self._import,
                          "load_list": self._load_list, "bind_group": self._bind_group, "free": self._free,
                          "stats": self._stats, "view": self._view}

    def answer(self, conn: socket.socket, client: Client, frame: protocol.Frame) -> None:
        """Answer one request of ``client``: its reply, or its refusal. The frame's descriptors are
        closed (only import takes one, and it keeps none: its mapping needs no descriptor)."""
        try:
            self._answer(conn, client, frame)
        finally:
            frame.close_fds()

    def _answer(self, conn: socket.socket, client: Client, frame: protocol.Frame) -> None:
        arbiter = self._arbiter
        drainer = arbiter.drainer
        op = frame.fields.get("op")
        try:
            if client.sticky is None and drainer.engine.dropped(client.slot):
                drainer.call(drainer.handle_events)  # its DROPPED: the sticky error, the log line
            if client.sticky is not None:
                raise client.sticky
            handler = self._handler(frame)
            if op == "alloc" and frame.fields.get("kind", "shared") == "shared" and arbiter.fd_budget is not None:
                arbiter.fd_budget.reserve_buffer(arbiter.max_clients - self._attached())
            fields, fds = handler(client, frame)
        except LibshareError as exc:
            reply_error(conn, exc)
            return
        except OSError as exc:  # the request's own failure: the connection is fine
            reply_error(conn, _resource_error(exc, op))
            return
        except Exception as exc:  # a bug; the client is told, and its connection goes on
            log.exception("%s: request %s failed", client.describe(), protocol.short(op))
            reply_error(conn, ProtocolError(f"the arbiter failed on this request: {type(exc).__name__}"))
            return
        try:
            protocol.send(conn, {"ok": True, **fields}, fds=fds)
        finally:
            for fd in fds:  # a handler's descriptors are handed over: the arbiter keeps no copy
                os.close(fd)

    def _handler(self, frame: protocol.Frame):
        """The handler of a request, once its fields passed its schema (else ProtocolError or
        InvalidSubmission)."""
        op = frame.fields.get("op")
        schema = REQUESTS.get(op) if isinstance(op, str) else None
        handler = self._handlers.get(op) if schema is not None else None
        if handler is None:
            raise ProtocolError(f"unknown request {protocol.short(op)}; the requests are {', '.join(REQUESTS)}")
        protocol.check_fields(frame.fields, schema, op)
        if op == "free" and sum(name in frame.fields for name in _FREED) != 1:
            raise ProtocolError("free names one buffer_id, program_id, list_id, group_id or view_id")
        if op == "load_program" and not frame.payload:
            raise InvalidSubmission("load_program carries a SPIR-V module as its payload (got none)")
        if op == "load_list" and (not 0 < len(frame.payload) <= MOST_COMMANDS * _DESC_SIZE
                                  or len(frame.payload) % _DESC_SIZE):
            raise InvalidSubmission(f"load_list carries 1 to {MOST_COMMANDS} whole {_DESC_SIZE}-byte descriptors "
                                    f"(got {len(frame.payload)} bytes)")
        if op not in ("load_program", "load_list") and frame.payload:
            raise ProtocolError(f"{op} carries no payload (got {len(frame.payload)} bytes)")
        if op != "import" and frame.fds:
            raise ProtocolError(f"{op} carries no file descriptors (got {len(frame.fds)}; they were closed)")
        return handler

    # ---------------------------------------------------------------- the handlers

    def _load_program(self, client: Client, frame: protocol.Frame):
        arbiter = self._arbiter
        drainer = arbiter.drainer
        check_program_quota(client, list(drainer.clients.values()), arbiter.max_programs)  # before any work
        admitted = arbiter.interfaces.of(frame.payload, arbiter.device, frame.fields.get("constants", ()),
                                         frame.fields.get("arrays", ()))
        digest, interface, module = admitted.digest, admitted.interface, admitted.module  # module: specialized
        drainer.quarantine.check_program(digest, client, module)  # refused to this tenant, or to all
        push_size = -(-interface.push_constant_size // 4) * 4  # Vulkan ranges are whole words
        if arbiter.compilers is not None and not drainer.pipelines.has(digest):
            try:
                arbiter.compilers.vet(module, len(interface.bindings), push_size, interface.entry_point)
            except InvalidSubmission as exc:  # it crashed or outran the time limit: refuse it for everyone
                arbiter.interfaces.refuse(admitted.key, exc)
                log.warning("%s: program %s refused: %s", client.describe(), digest.hex()[:16], exc)
                raise
        with drainer.quarantine.risk(COMPILE, client, digest, unless=drainer.pipelines.has(digest)):
            pipeline = drainer.pipelines.acquire(arbiter.device, digest, module, interface, push_size)

        def register():
            drainer.pipelines.collect(arbiter.device)
            try:
                _require_attached(client)
                check_program_quota(client, drainer.clients.values(), arbiter.max_programs)
                program_id = client.new_id(frame.fields.get("id"))
            except LibshareError:  # the pipeline was acquired for this record: give it back
                drainer.pipelines.release(arbiter.device, pipeline)
                raise
            record = ProgramRecord(program_id, pipeline, len(interface.bindings), push_size,
                                   cuttable=not interface.counts_workgroups)
            drainer.adopt(client, record)
            return record.id

        program_id = drainer.call(register, policy=False)  # a record: the engine's policy stays
        return {"program_id": program_id, "bindings": len(interface.bindings), "push_size": push_size,
                "local_size": list(interface.local_size), "entry_point": interface.entry_point,
                "resources": _resources(interface)}, ()

    def _load_list(self, client: Client, frame: protocol.Frame):
        drainer = self._arbiter.drainer
        commands = bytes(frame.payload)

        def register():
            _require_attached(client)
            count = len(commands) // _DESC_SIZE
            if len(client.lists) + client.releasing[ListRecord] >= LISTS_PER_CLIENT:
                raise QuotaExceeded(f"a session holds at most {LISTS_PER_CLIENT} command lists; free one first")
            if client.list_commands + count > LIST_COMMANDS_PER_CLIENT:
                raise QuotaExceeded(f"a session's command lists hold at most {LIST_COMMANDS_PER_CLIENT} commands "
                                    f"together ({client.list_commands} now, {count} more asked); free one first")
            record = ListRecord(client.new_id(frame.fields.get("id")), count)
            drainer.adopt(client, record, commands)  # each command checked there: refused, nothing is added
            client.list_commands += count
            return record.id

        list_id = drainer.call(register, policy=False)  # a record: the engine's policy stays
        return {"list_id": list_id, "commands": len(commands) // _DESC_SIZE}, ()

    def _bind_group(self, client: Client, frame: protocol.Frame):
        drainer = self._arbiter.drainer
        entries = tuple(tuple(entry) for entry in frame.fields["buffers"])

        def register():
            _require_attached(client)
            if len(client.groups) + client.releasing[GroupRecord] >= GROUPS_PER_CLIENT:
                raise QuotaExceeded(f"a session holds at most {GROUPS_PER_CLIENT} bind groups; free one first")
            record = GroupRecord(client.new_id(frame.fields.get("id")), frame.fields["program_id"], entries)
            drainer.adopt(client, record)  # each entry checked there: refused, nothing is added
            return record.id

        group_id = drainer.call(register, policy=False)  # a record: the engine's policy stays
        return {"group_id": group_id}, ()

    def _alloc(self, client: Client, frame: protocol.Frame):
        size, kind = frame.fields.get("size"), frame.fields.get("kind", "shared")
        if not isinstance(size, int) or not 0 < size <= _MAX_BUFFER:
            raise InvalidSubmission(f"buffer size must be an integer in 1..{_MAX_BUFFER} (got {size!r})")
        if kind not in ("shared", "device"):
            raise InvalidSubmission(f"buffer kind must be 'shared' or 'device' (got {kind!r})")
        rounded = -(-size // _PAGE) * _PAGE
        drainer = self._arbiter.drainer
        self._arbiter.limits.check(client, list(drainer.clients.values()), rounded)  # before any memory exists
        memory = _shared_memory(rounded) if kind == "shared" else None
        buffer_id = self._register_buffer(client, kind, rounded, memory, None)
        return {"buffer_id": buffer_id, "size": rounded}, ((memory.take_fd(),) if memory else ())

    def _import(self, client: Client, frame: protocol.Frame):
        """A shared buffer's memfd that the client kept from an earlier arbiter (a session that
        reattaches after a restart): checked (see check_sealed_memfd), mapped, and counted against
        the client's limits like a new buffer. The client's memory is the very same."""
        size = frame.fields["size"]
        if len(frame.fds) != 1:
            raise InvalidSubmission(f"import carries exactly one memfd (got {len(frame.fds)})")
        if size % _PAGE:
            raise InvalidSubmission(f"an imported buffer is a whole number of {_PAGE}-byte pages (got {size})")
        check_sealed_memfd(frame.fds[0], size)
        drainer = self._arbiter.drainer
        self._arbiter.limits.check(client, list(drainer.clients.values()), size)  # before mapping anything
        mapping = SharedMapping(frame.fds[0], size)  # the frame's descriptor is closed by answer()
        buffer_id = self._register_buffer(client, "shared", size, SharedMemory(-1, mapping, mapping.address),
                                          frame.fields.get("id"))
        return {"buffer_id": buffer_id, "size": size}, ()

    def _register_buffer(self, client: Client, kind: str, rounded: int, memory: SharedMemory | None,
                         wanted_id: int | None) -> int:
        """Make the device buffer over ``memory`` (or a device-local one) and the client's record of
        it (id ``wanted_id`` if given), as a control task; the memory is released if that fails."""
        arbiter = self._arbiter
        drainer = arbiter.drainer

        def create():
            device = arbiter.device
            _require_attached(client)
            arbiter.limits.check(client, drainer.clients.values(), rounded,  # again, one alloc at a time
                                 device.clearing_bytes)
            buffer_id = client.new_id(wanted_id)  # before the device buffer: a refused id leaves nothing
            if memory is not None:
                device_buffer = device.import_host(memory.address, rounded)
            else:
                device_buffer = device.alloc_device(rounded)
            record = BufferRecord(buffer_id, kind, rounded, device_buffer, memory)
            drainer.adopt(client, record)
            client.counters.memory_bytes += rounded
            client.counters.peak_memory_bytes = max(client.counters.peak_memory_bytes,
                                                    client.counters.memory_bytes)
            drainer.note_memory()
            return record.id

        try:
            return drainer.call(create, policy=False)  # a record: the engine's policy stays
        except BaseException:
            if memory is not None:
                memory.close()
            raise

    def _free(self, client: Client, frame: protocol.Frame):
        drainer = self._arbiter.drainer

        def free():  # descriptors pushed before this request still find it (ls_engine_drop waits for them)
            fields = frame.fields
            name = next(name for name in _FREED if name in fields)
            record = getattr(client, _FREED[name]).get(fields[name])
            if record is None:
                raise InvalidSubmission(f"no such buffer, program, command list, bind group or texel view: {fields}")
            drainer.free(client, record)

        drainer.call(free, policy=False)  # records: the engine's policy stays
        return {}, ()

    def _view(self, client: Client, frame: protocol.Frame):
        drainer = self._arbiter.drainer
        return drainer.call(make_view, drainer, client, frame.fields, _require_attached, policy=False), ()

    def _stats(self, client: Client, frame: protocol.Frame):
        c = self._arbiter.drainer.refresh(client)
        return {"client_id": client.id, "submitted": c.submitted, "completed": c.completed,
                "errors": c.errors, "device_ns": c.device_ns, "cut": c.cut, "pieces": c.pieces, "listed": c.listed,
                "control_bytes": c.control_bytes,
                "memory_bytes": c.memory_bytes,
                "clients": self._attached()}, ()  # connections: the control thread may not have added this one yet


_FREED = {"buffer_id": "buffers", "program_id": "programs", "list_id": "lists", "group_id": "groups",
          "view_id": "views"}  # free's field: the table it names
"""What ``free`` names, and the client's table of it."""


def _resources(interface) -> list:
    """A program's resources as its reply names them: ``[set, binding, count, kind]`` each, in bind order."""
    texel, first, named = dict(interface.texel), 0, []
    for (descriptor_set, binding), count in zip(interface.resources, interface.arrays):
        kind = "uniform" if first in interface.uniform else "storage"
        named.append([descriptor_set, binding, count, f"{kind}_texel" if first in texel else kind])
        first += count
    return named


def _require_attached(client: Client) -> None:
    """In a control task, before a request adds to what a client holds: refuse once the client
    was dropped, terminated or reclaimed meanwhile (its reclaim would never see the new object)."""
    if client.closing:
        raise client.sticky or ServerNotReady("this session was closed by the arbiter; reconnect")


def _resource_error(exc: OSError, op) -> LibshareError:
    """What a request that failed with ``exc`` tells its client."""
    if exc.errno in SCARCE:
        return QuotaExceeded(f"the arbiter is out of file descriptors or memory ({exc.strerror}); free "
                             "buffers, or ask the operator to raise the arbiter's limits")
    return LibshareError(f"the arbiter failed on request {protocol.short(op)}: {exc}")


def _shared_memory(size: int) -> SharedMemory:
    """A new sealed memfd of ``size`` bytes (see ring/_region.py), mapped here (page-aligned, so it
    can be imported). A memfd's pages start as zeros, so the client reads no one else's data."""
    fd = sealed_memfd("libshare-buffer", size)
    try:
        mapping = SharedMapping(fd, size)  # keeps no descriptor: the memfd goes to the client
    except OSError:
        os.close(fd)
        raise
    return SharedMemory(fd, mapping, mapping.address)
