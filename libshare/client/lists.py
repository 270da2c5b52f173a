"""Command lists: commands recorded once, run by one descriptor, answered by one Ticket.

``with session.record() as commands:`` records ``commands.dispatch(...)``, ``commands.copy(...)``,
``commands.fill(...)``, ``commands.update(...)``, ``commands.barrier()`` and
``commands.dispatch_indirect(...)`` (whose counts an earlier command of the list may write)
into descriptors (``struct ls_desc``, encoded by the ring's one encoder: ``ls_encode_op``, the
encoding and check of ``ls_push_op``) and, when the block ends,
hands them to the arbiter (the ``load_list`` request), which checks each as it checks a popped
descriptor and keeps the list (engine/lists.c). ``commands.submit()`` then pushes one
``LS_OP_LIST`` descriptor: the arbiter runs the commands in order, each after the one before
(each command ends with a barrier, as a single dispatch does), and answers one Ticket with the
device time of all and the first failure among them. A command that finds an object freed since
ends its list with that refusal. The commands name buffers and programs by their ids: a session
that reattaches hands the list to the new arbiter after them (reattach.py), under the same id.
"""

from __future__ import annotations

from libshare import errors
from libshare.client.buffers import Program, byte_size, workgroups
from libshare.client.operations import fill_fields, indirect_fields, update_bytes, update_fields
from libshare.ring import C
from libshare.ring._binding import encode_op

__all__ = ["CommandList", "MOST_COMMANDS"]

MOST_COMMANDS = 1024
"""The most commands in one list (the engine's LS_ENGINE_MAX_LIST)."""


class CommandList:
    """Dispatches and copies over a session's own objects, run in order by one descriptor.

    Made by ``Session.record()``; record into it inside its ``with`` block, then ``submit()`` it
    as often as needed. ``Session.free`` forgets it."""

    def __init__(self, session):
        self._session = session
        self._descs: list[bytes] = []
        self.id = 0
        """The arbiter's id for this list, once its ``with`` block has ended (0 before)."""
        self.commands = b""
        """Its descriptors, as the arbiter got them (handed again to a new arbiter on reattach)."""
        self.lost: Exception | None = None
        """Why a new arbiter refused it on reattach, or None."""

    def __len__(self) -> int:
        return len(self._descs)

    def dispatch(self, program: Program, groups, buffers=(), push: bytes = b"") -> None:
        """Record ``program`` over ``groups`` workgroups on ``buffers`` (as ``Session.dispatch``)."""
        if program.lost is not None:
            raise errors.InvalidSubmission(f"program {program.id} is lost: {program.lost}")
        self._add(C.OP_DISPATCH, program.id, workgroups(groups), buffers, None, bytes(push))

    def copy(self, src, dst, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy between two buffers (as ``Session.copy``)."""
        if nbytes is None:
            nbytes = min(byte_size(src), byte_size(dst))
        self._add(C.OP_COPY, 0, (0, 0, 0), (src, dst), (src_offset, dst_offset, int(nbytes)), b"")

    def fill(self, buffer, value, nbytes: int | None = None, offset: int = 0) -> None:
        """Record a fill of ``buffer`` with a 32-bit ``value`` (as ``Session.fill``)."""
        self._check_open()
        self._append(*fill_fields(self._session._binding, buffer, value, nbytes, offset))

    def update(self, buffer, data, offset: int = 0) -> None:
        """Record a write of ``data`` into ``buffer`` at ``offset`` (as ``Session.update``); data past 128
        bytes is recorded as several updates of 128 (the list answers once for all of them)."""
        data = update_bytes(data)
        self._check_open()
        step = C.MAX_PUSH
        if len(data) > step and len(self._descs) + -(-len(data) // step) > MOST_COMMANDS:
            raise errors.InvalidSubmission(f"a command list holds at most {MOST_COMMANDS} commands")
        for at in range(0, max(len(data), 1), step):
            self._append(*update_fields(self._session._binding, buffer, data[at:at + step], offset + at))

    def barrier(self) -> None:
        """Record a barrier: what the commands before it wrote is seen by those after it. Every command
        already ends with one (the engine's record_barrier), so it changes nothing and costs nothing on
        the device; it is checked and kept."""
        self._check_open()
        self._append(C.OP_BARRIER, 0, (0, 0, 0), [], [], b"")

    def dispatch_indirect(self, program: Program, counts_buffer, buffers=(), push: bytes = b"",
                          offset: int = 0) -> None:
        """Record ``program`` over the counts the device reads from ``counts_buffer`` at ``offset`` when the
        command runs, written maybe by a command before it (as ``Session.dispatch_indirect``)."""
        self._check_open()
        self._append(*indirect_fields(self._session._binding, program, counts_buffer, buffers, push, offset))

    def _check_open(self) -> None:
        """Refuse a command once the list is recorded, or past the most it holds."""
        if self.id:
            raise errors.InvalidSubmission("this command list was recorded already: record a new one")
        if len(self._descs) >= MOST_COMMANDS:
            raise errors.InvalidSubmission(f"a command list holds at most {MOST_COMMANDS} commands")

    def _add(self, opcode: int, program: int, groups, buffers, extra, push: bytes) -> None:
        self._check_open()
        bound = [self._session._binding(item) for item in buffers]
        offsets = [offset for _, _, offset in bound]
        if extra is not None:  # a copy: source and destination offsets from their bindings, then the size
            offsets = [offsets[0] + extra[0], offsets[1] + extra[1], extra[2]]
        self._append(opcode, program, groups, [buffer_id for _, buffer_id, _ in bound], offsets, push)

    def _append(self, opcode: int, program: int, groups, ids: list, offsets: list, push: bytes) -> None:
        self._descs.append(encode_op(opcode, program, groups, ids, offsets, push))

    @classmethod
    def from_commands(cls, session, commands: bytes) -> CommandList:
        """A list of ``commands`` encoded already (the C API's ls_list_dispatch), registered now."""
        size = C.DESC_SIZE
        made = cls(session)
        made._descs = [commands[k:k + size] for k in range(0, len(commands), size)]
        made._register()
        return made

    def __enter__(self) -> CommandList:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self._register()

    def _register(self) -> None:
        """Hand the recorded commands to the arbiter (each checked there; a refusal names the first bad one)."""
        if not self._descs:
            raise errors.InvalidSubmission("a command list holds at least one command")
        commands = b"".join(self._descs)
        session = self._session
        reply = session._request("load_list", commands)
        self.id, self.commands = reply.fields["list_id"], commands
        session._objects[self.id] = self

    def submit(self):
        """Run the list: one descriptor, one Ticket for all its commands (the first failure is its error)."""
        if self.lost is not None:
            raise errors.InvalidSubmission(f"command list {self.id} is lost: {self.lost}")
        if not self.id:
            raise errors.InvalidSubmission("record the list (its with block) before submitting it")
        session = self._session
        return (session._push(C.OP_LIST, self.id, 0, 0, 0, [], [], b"")
                or session._submit(C.OP_LIST, self.id, 0, 0, 0, [], [], b""))

    def __repr__(self) -> str:
        return f"<libshare.CommandList id={self.id} commands={len(self._descs)}>"
