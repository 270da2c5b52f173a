"""Command lists: dispatches and copies recorded once, run by one descriptor, answered by one Ticket.

``with session.record() as commands:`` records ``commands.dispatch(...)`` and ``commands.copy(...)``
into descriptors (``struct ls_desc``, encoded by the ring's one encoder: ``ls_encode_op``, the
encoding and check of ``ls_push_op``) and, when the block ends,
hands them to the arbiter (the ``load_list`` request), which checks each as it checks a popped
descriptor and keeps the list (engine/lists.c). ``commands.submit()`` then pushes one
``LS_OP_LIST`` descriptor: the arbiter runs the commands in order, each after the one before
(each command ends with a barrier, as a single dispatch does), and answers one Ticket with the
device time of all and the first failure among them. A command that finds an object freed since
ends its list with that refusal. A dispatch may bind a bind group (groups.py), named by its id as a
single dispatch does. The commands name buffers, programs and groups by their ids: a session
that reattaches hands the list to the new arbiter after them (reattach.py), under the same id.
"""

from __future__ import annotations

from libshare import errors
from libshare.client.buffers import Program, byte_size, workgroups
from libshare.client.groups import BindGroup
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
        """Record ``program`` over ``groups`` workgroups on ``buffers``, a list or a bind group (as
        ``Session.dispatch``)."""
        if program.lost is not None:
            raise errors.InvalidSubmission(f"program {program.id} is lost: {program.lost}")
        if isinstance(buffers, BindGroup):
            if buffers.lost is not None:
                raise errors.InvalidSubmission(f"bind group {buffers.id} is lost: {buffers.lost}")
            self._check_room()
            self._descs.append(encode_op(C.OP_DISPATCH | C.DESC_GROUP << 16, program.id, workgroups(groups),
                                         [buffers.id], [], bytes(push)))
            return
        self._add(C.OP_DISPATCH, program.id, workgroups(groups), buffers, None, bytes(push))

    def copy(self, src, dst, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy between two buffers (as ``Session.copy``)."""
        if nbytes is None:
            nbytes = min(byte_size(src), byte_size(dst))
        self._add(C.OP_COPY, 0, (0, 0, 0), (src, dst), (src_offset, dst_offset, int(nbytes)), b"")

    def _check_room(self) -> None:
        if self.id:
            raise errors.InvalidSubmission("this command list was recorded already: record a new one")
        if len(self._descs) >= MOST_COMMANDS:
            raise errors.InvalidSubmission(f"a command list holds at most {MOST_COMMANDS} commands")

    def _add(self, opcode: int, program: int, groups, buffers, extra, push: bytes) -> None:
        self._check_room()
        bound = [self._session._binding(item) for item in buffers]
        offsets = [offset for _, _, offset in bound]
        if extra is not None:  # a copy: source and destination offsets from their bindings, then the size
            offsets = [offsets[0] + extra[0], offsets[1] + extra[1], extra[2]]
        self._descs.append(encode_op(opcode, program, groups, [buffer_id for _, buffer_id, _ in bound], offsets,
                                     push))

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
