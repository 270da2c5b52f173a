"""Sessions: the client side of libshare, and its public calls.

A Session holds a control socket (rare requests: programs, buffers) and a ring region (every
dispatch). ``dispatch`` hands the operation to the ring's C encoder, which checks it and writes
it straight into this thread's lane, and returns a Ticket at once; tickets complete through the
ring's completion ring, read into the session's ticket book by whichever thread waits. Connecting
to a daemon imports nothing from Vulkan: the session is sockets, memfds and the ring. Embedded
mode starts one arbiter inside this process and talks to it over a socketpair with the very same
protocol (connect.py).

A Session is made of parts that are objects, each in a module of its own, each given the others
it needs when the session is made:

- the :class:`~libshare.client.gate.Gate` (gate.py): the state the parts share (the current
  attachment to an arbiter, attachment.py; closed, lost, moving) and the count of threads inside
  the ring, which closing waits for;
- the :class:`~libshare.client.completions.Completions` (completions.py): tickets and waiting,
  the ticket book, and a failed ticket's status as its exception (the error table);
- the :class:`~libshare.client.reattach.Reattacher` (reattach.py): surviving an arbiter restart
  under the control daemon;
- the :class:`~libshare.client.submit.Submitter` (submit.py): numbering and pushing operations,
  and binding arrays to buffers.

The Session keeps the live buffers, texel views, programs, bind groups (groups.py) and command lists
(which a reattach hands to a new arbiter) and
makes control requests (exchange.py); a request that finds the arbiter gone records the loss.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from pathlib import Path

import numpy as np

from libshare import errors
from libshare.client import exchange as _exchange
from libshare.client.attachment import Attachment
from libshare.client.buffers import (Buffer, Program, TexelView, array_triples, byte_size, constant_pairs,
                                     find_buffer, workgroups)
from libshare.client.completions import Completions, Ticket
from libshare.client.gate import Gate, closed_error, fresh
from libshare.client.groups import BindGroup, group_entries, make_group
from libshare.client.lists import CommandList
from libshare.client.operations import fill_fields, indirect_fields, timestamp_fields, update_bytes, update_fields
from libshare.client.reattach import Reattacher
from libshare.client.submit import Submitter
from libshare.protocol import wire as protocol
from libshare.ring import C

__all__ = ["Session"]

_OP_DISPATCH, _OP_COPY = C.OP_DISPATCH, C.OP_COPY
_OP_GROUP = C.OP_DISPATCH | C.DESC_GROUP << 16  # ls_push_op's opcode: the flags ride in its high 16 bits


def make_texel_view(session: Session, buffer: Buffer | np.ndarray, format: str, offset: int = 0,
                    nbytes: int | None = None) -> TexelView:
    """A view of ``buffer`` (or of the buffer under an array, from the array's first byte) as texels of
    ``format`` (``"r32f"``, ``"r32ui"``, ``"rgba8"``, ``"rgba32f"``, ...: libshare.protocol.texels), to pass
    in a dispatch's buffers at a kernel's texel buffer (``uniform samplerBuffer``: a uniform one;
    ``layout(r32f) uniform imageBuffer``: a storage one).

    ``offset`` (bytes, from the buffer's or the array's start) must be a multiple of the device's
    minTexelBufferOffsetAlignment; ``nbytes`` (default: the array's bytes, or whole texels to the buffer's
    end) a whole number of texels within the buffer. The arbiter checks both, and that the device
    supports the format; a read past the view's end reads zeros, a write there is dropped. Freeing the
    buffer frees its views."""
    if isinstance(buffer, Buffer):
        base, owner = 0, buffer
    else:
        owner, base = find_buffer(buffer, session._by_mapping)
        nbytes = buffer.nbytes if nbytes is None else nbytes
    if owner.lost is not None:
        raise fresh(owner.lost)
    fields = {"buffer_id": owner.id, "format": format, "offset": base + int(offset)}
    if nbytes is not None:
        fields["size"] = int(nbytes)
    reply = session._request("view", **fields).fields
    view = TexelView(reply["view_id"], owner, format, reply["offset"], reply["size"])
    session._objects[view.id] = view
    return view


def _attached(name: str, doc: str) -> property:
    """A read-only property of a Session: field ``name`` of its attachment now (a reattach changes it)."""
    return property(lambda session: getattr(session._gate.attached, name), doc=doc)


class Session:
    """A client's connection to an arbiter. Use ``libshare.connect()`` to make one."""

    def __init__(self, sock: socket.socket, welcome: protocol.Frame, embedded: bool, hello: dict | None = None,
                 socket_path: Path | None = None, timeout: float = 10.0):
        self.embedded = embedded
        """True when the arbiter runs inside this process."""
        self._request_lock = threading.RLock()  # re-entrant: close() from a finalizer inside a request
        self._by_mapping: dict[int, Buffer] = {}
        self._objects: dict[int, Buffer | Program | TexelView] = {}  # id -> each live object (for a reattach)
        self._seen: dict = {}  # the bindings of arrays to buffers (submit.py)
        self._gate = Gate(Attachment(sock, welcome), lambda: _tear_down(self))
        self._completions = Completions(self._gate)
        self._restarts = Reattacher(self._gate, self._completions, self._objects, self._seen, hello, socket_path,
                                    timeout, embedded)
        self._completions.restarts = self._restarts
        submitter = Submitter(self._gate, self._completions, self._restarts, self._seen, self._by_mapping)
        self._binding, self._push, self._submit = submitter.binding, submitter.push, submitter.submit

    # ---------------------------------------------------------------- what the session is attached to

    client_id = _attached("client_id", "This session's client id at the arbiter (an int).")
    device_name = _attached("device_name", "The name of the arbiter's device.")
    arbiter_pid = _attached("arbiter_pid", "The pid of the arbiter this session is attached to.")
    priority = _attached("priority", "The priority the arbiter gave this session when it connected (asked for, "
                         "or its default).")

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._gate.closed

    @property
    def reattached(self) -> int:
        """How many times this session reattached to a new arbiter."""
        return self._restarts.count

    # ---------------------------------------------------------------- control requests

    def _request(self, op: str, payload: bytes = b"", max_fds: int = 0, fds: tuple[int, ...] = (),
                 reply_timeout: float | None = None, **fields) -> protocol.Frame:
        """Send one request and read its reply, which may take ``reply_timeout`` seconds (default
        exchange.REPLY_TIMEOUT); the reply, or the arbiter's refusal raised (ArbiterLost when it
        does not answer in time: the session is lost then)."""
        self._restarts.check_usable()
        reply_timeout = reply_timeout or _exchange.REPLY_TIMEOUT
        gate = self._gate
        with self._request_lock:
            sock = gate.attached.sock
            try:
                if sock.gettimeout() != reply_timeout:
                    sock.settimeout(reply_timeout)
                reply = _exchange.exchange(sock, {"op": op, **fields}, payload, max_fds, fds, poll=not self.embedded)
            except (EOFError, OSError) as exc:
                if gate.closed:
                    raise closed_error() from exc
                with gate.inside() as inside:
                    why = gate.attached.closed_by_arbiter() if inside else None
                lost = self._restarts.record_loss(
                    why or errors.ArbiterLost(f"the arbiter closed the connection ({exc or 'EOF'})"))
                raise fresh(lost) from exc
        if not reply.fields.get("ok"):
            reply.close_fds()
            raise errors.remote_error(reply.fields)
        return reply

    def load_program(self, spirv: bytes | str | os.PathLike, constants: dict | None = None,
                     array_lengths: dict | None = None) -> Program:
        """Load a compute program from SPIR-V bytes or a .spv path; its interface is reflected.

        ``constants`` maps specialization-constant ids (``constant_id``, ``local_size_x_id``) to
        values (int, float or bool, as the module types them); the arbiter freezes them into the
        module, which it then checks and compiles (an id the module does not declare is refused).
        ``array_lengths`` maps the (set, binding) of each runtime-sized array of buffers (``b[]``)
        to its length (1 to 32), which makes it a fixed-size array of that many buffers."""
        code = bytes(spirv) if isinstance(spirv, (bytes, bytearray)) else _read_module(Path(spirv))
        pairs, triples = constant_pairs(constants), array_triples(array_lengths)
        fields = {"constants": pairs} if pairs else {}
        if triples:
            fields["arrays"] = triples
        reply = self._request("load_program", code, reply_timeout=self._gate.attached.load_timeout, **fields)
        f = reply.fields
        program = Program(f["program_id"], f["bindings"], f["push_size"], tuple(f["local_size"]), code, pairs,
                          triples)
        self._objects[program.id] = program
        return program

    def alloc(self, nbytes: int, kind: str = "shared") -> Buffer:
        """Allocate a buffer of ``nbytes``: "shared" (zero-copy, mapped here) or "device"."""
        reply = self._request("alloc", size=int(nbytes), kind=kind, max_fds=1)
        fd = reply.fds[0] if reply.fds else None
        if (fd is None) != (kind == "device"):
            reply.close_fds()
            raise errors.ProtocolError(f"arbiter answered a {kind} alloc with {len(reply.fds)} descriptors")
        buffer = Buffer(self, reply.fields["buffer_id"], reply.fields["size"], kind, fd)
        if buffer.mapping is not None:
            self._by_mapping[id(buffer.mapping)] = buffer
        self._objects[buffer.id] = buffer
        return buffer

    def texel_view(self, buffer: Buffer | np.ndarray, format: str, offset: int = 0,
                   nbytes: int | None = None) -> TexelView:
        """A view of ``buffer`` as texels of ``format``, for a kernel's texel buffer (see
        :func:`make_texel_view`, which makes it)."""
        return make_texel_view(self, buffer, format, offset, nbytes)

    def array(self, shape, dtype=np.float32) -> np.ndarray:
        """A zero-copy numpy array on a new shared buffer."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = max(int(math.prod(shape)) * np.dtype(dtype).itemsize, 1)
        return self.alloc(nbytes).array(shape, dtype)

    def record(self) -> CommandList:
        """A command list: ``with session.record() as commands:`` records ``commands.dispatch(...)``,
        ``copy``, ``fill``, ``update``, ``barrier`` and ``dispatch_indirect`` over this session's
        objects, checked and kept by the arbiter when the block ends; ``commands.submit()`` then runs
        them all in order from one descriptor and returns one Ticket (the device time of all, the
        first failure among them). A command may bind ``commands.argument(k)`` and take
        ``push=commands.SUBMISSION_PUSH``, which each ``commands.submit(push, buffers)`` fills
        (client/lists.py, "Parameters")."""
        return CommandList(self)

    def bind_group(self, program: Program, buffers) -> BindGroup:
        """Bind ``buffers`` once for ``program``'s layout: a dispatch given the group as its ``buffers``
        binds them all from one descriptor (up to the device's limit, past a descriptor's 8).

        ``buffers`` lists, in the program's binding order (as :meth:`dispatch` takes them; an array
        of buffers takes its length of them), a buffer or array of this session, or ``(it, offset,
        range)``: the byte offset from where it binds and the bytes bound (None: to its end), and a
        TexelView (:meth:`texel_view`, whole: no offset or range) at each texel buffer. The arbiter
        checks each now and at every dispatch that names the group."""
        if program.lost is not None:
            raise fresh(program.lost)
        return make_group(self, program, group_entries(self._binding, program, buffers))

    def free(self, obj: Buffer | np.ndarray | Program | CommandList | BindGroup | TexelView) -> None:
        """Release a buffer (or the buffer under an array, with its texel views), a program, a command
        list, a bind group or a texel view.

        Work already submitted that uses it still completes: the arbiter destroys it
        after the device is done. Arrays on a freed buffer stay readable here.
        """
        if isinstance(obj, (Program, CommandList, BindGroup)):
            if obj.lost is None and obj.id:  # (a lost one is unknown to this arbiter, which may give its id to another)
                name = "program_id" if isinstance(obj, Program) else "list_id" if isinstance(obj, CommandList) \
                    else "group_id"
                self._request("free", **{name: obj.id})
                self._objects.pop(obj.id, None)
            return
        if isinstance(obj, TexelView):
            if obj.lost is None and not obj.freed:
                self._request("free", view_id=obj.id)
            views = [obj]
        else:
            buffer = obj if isinstance(obj, Buffer) else find_buffer(obj, self._by_mapping)[0]
            if buffer.lost is None:
                self._request("free", buffer_id=buffer.id)
                self._objects.pop(buffer.id, None)
            buffer.freed = True
            buffer.close_memfd()
            for key, (_, buffer_id, _) in list(self._seen.items()):  # its arrays bind nothing any more
                if buffer_id == buffer.id:
                    self._seen.pop(key, None)
            if buffer.mapping is not None:
                self._by_mapping.pop(id(buffer.mapping), None)
            views = [item for item in self._objects.values() if isinstance(item, TexelView) and item.buffer is buffer]
        for view in views:  # (a buffer's: the arbiter freed them with it)
            view.freed = True
            self._objects.pop(view.id, None)
            self._seen.pop(id(view), None)

    def stats(self) -> dict:
        """The arbiter's counters for this client (dispatches, device time, bytes, ...)."""
        fields = dict(self._request("stats").fields)
        fields.pop("ok", None)
        return fields

    # ---------------------------------------------------------------- submission and completion

    def dispatch(self, program: Program, groups, buffers=(), push: bytes = b"") -> Ticket:
        """Queue ``program`` over ``groups`` workgroups on ``buffers``; returns a Ticket at once.

        ``buffers`` are arrays from :meth:`array` (a slice binds from its first element)
        or Buffer objects, and a TexelView (:meth:`texel_view`) at each texel buffer, or a
        :class:`BindGroup` (:meth:`bind_group`; a program with more than 8 buffers binds them only so);
        ``push`` is the push-constant bytes (``struct.pack``).
        """
        if program.lost is not None:
            raise fresh(program.lost)
        if groups.__class__ is int:
            gx, gy, gz = groups, 1, 1
        else:
            gx, gy, gz = workgroups(groups)
        if buffers.__class__ is BindGroup:
            return self._submit(_OP_GROUP, program.id, gx, gy, gz, *bound_group(buffers), bytes(push))
        if program.bindings > C.MAX_BUFFERS:
            raise errors.InvalidSubmission(too_many(program))
        ids, offsets = [], []
        seen = self._seen
        for item in buffers:  # the hot path of Submitter.binding, inline
            known = seen.get(id(item))
            if known is None or known[0]() is not item:
                known = self._binding(item)
            ids.append(known[1])
            offsets.append(known[2])
        if push.__class__ is not bytes:
            push = bytes(push)
        return (self._push(_OP_DISPATCH, program.id, gx, gy, gz, ids, offsets, push)
                or self._submit(_OP_DISPATCH, program.id, gx, gy, gz, ids, offsets, push))

    def copy(self, src, dst, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> Ticket:
        """Queue a copy between two buffers (shared or device); returns a Ticket at once."""
        (_, src_id, src_base), (_, dst_id, dst_base) = self._binding(src), self._binding(dst)
        if nbytes is None:
            nbytes = min(byte_size(src), byte_size(dst))
        offsets = [src_base + src_offset, dst_base + dst_offset, int(nbytes)]
        return self._submit(_OP_COPY, 0, 0, 0, 0, [src_id, dst_id], offsets, b"")

    def fill(self, buffer, value, nbytes: int | None = None, offset: int = 0) -> Ticket:
        """Queue a fill of ``nbytes`` of ``buffer`` (an array or a Buffer; by default to its end) from
        byte ``offset`` with the 32-bit ``value`` (an int, or a float written as float32); offset and
        size multiples of 4. Returns a Ticket at once."""
        opcode, program, groups, ids, offsets, push = fill_fields(self._binding, buffer, value, nbytes, offset)
        return self._submit(opcode, program, *groups, ids, offsets, push)

    def update(self, buffer, data, offset: int = 0) -> Ticket:
        """Queue a write of ``data`` (bytes-like or an array: 4 to 128 bytes, a multiple of 4, carried in
        the descriptor itself) into ``buffer`` at byte ``offset``; more is refused (copy from a shared
        buffer instead, or record a list: ``CommandList.update`` splits). Returns a Ticket at once."""
        fields = update_fields(self._binding, buffer, update_bytes(data), offset)
        opcode, program, groups, ids, offsets, push = fields
        return self._submit(opcode, program, *groups, ids, offsets, push)

    def timestamp(self, buffer, offset: int = 0) -> Ticket:
        """Queue a timestamp into ``buffer`` (an array or a Buffer) at byte ``offset`` (a multiple of 8):
        once every operation queued before it has ended, the device's timestamp (ticks of its timestamp
        period) as a uint64 there and a uint64 1, its availability, at ``offset + 8``. A device whose
        queue has no timestamps fails the Ticket with InvalidSubmission (LS_EUNSUPPORTED). Returns a
        Ticket at once."""
        opcode, program, groups, ids, offsets, push = timestamp_fields(self._binding, buffer, offset)
        return self._submit(opcode, program, *groups, ids, offsets, push)

    def dispatch_indirect(self, program: Program, counts_buffer, buffers=(), push: bytes = b"",
                          offset: int = 0) -> Ticket:
        """Queue ``program`` on ``buffers`` over the workgroup counts the device reads when it runs: three
        uint32 at byte ``offset`` of ``counts_buffer`` (an array or a Buffer). The arbiter clamps them on
        the device: counts of 0 run nothing; a count past the device's limit, or a product past
        2^32 - 1, runs nothing and fails the Ticket with InvalidSubmission (LS_EGROUPS). Returns a
        Ticket at once."""
        fields = indirect_fields(self._binding, program, counts_buffer, buffers, push, offset)
        opcode, program_id, groups, ids, offsets, push = fields
        return self._submit(opcode, program_id, *groups, ids, offsets, push)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until every submitted ticket is done; errors stay with their tickets.

        Raises the arbiter's loss (within a wait slice of it, and at once once it is known,
        like every call on the session), SessionClosed or Timeout."""
        self._completions.wait_idle(timeout)

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Disconnect; idempotent. Submitted work still completes at the arbiter.

        Threads waiting on this session's tickets wake within a wait slice and raise
        SessionClosed; the ring is unmapped only once no thread is inside it."""
        self._gate.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tear_down(session: Session) -> None:
    """Let go of everything of ``session``, once no thread is inside the ring (its gate calls it once)."""
    for item in session._objects.values():
        if isinstance(item, Buffer):
            item.close_memfd()
    session._gate.attached.close(lock=session._request_lock)


def bound_group(group: BindGroup) -> tuple[list[int], list[int]]:
    """The ids and offsets ls_push_op takes for a dispatch over ``group``: its id, as buffers[0]."""
    if group.lost is not None:
        raise fresh(group.lost)
    return [group.id], []


def too_many(program: Program) -> str:
    """Why a dispatch of ``program`` names a bind group, not its buffers."""
    return (f"program {program.id} binds {program.bindings} buffers, more than a descriptor's {C.MAX_BUFFERS}: "
            "dispatch it through a bind group (session.bind_group)")


def _read_module(path: Path) -> bytes:
    """The bytes of a .spv file; InvalidSubmission past the most a frame carries (a path such as
    /dev/zero would otherwise be read until this process ran out of memory)."""
    with open(path, "rb") as file:  # read what its size says: a read of the bound allocates the bound (4 MiB)
        size = os.fstat(file.fileno()).st_size  # 0 for a device such as /dev/zero
        code = file.read(min(size, protocol.MAX_FRAME) + 1)
        if len(code) > size:  # a device, or a file that grew: read on, up to the bound
            code += file.read(protocol.MAX_FRAME + 1 - len(code))
    if len(code) > protocol.MAX_FRAME:
        raise errors.InvalidSubmission(f"{path} holds more than {protocol.MAX_FRAME} bytes, more than any "
                                       "SPIR-V module the arbiter takes")
    return code
