"""Command lists: commands recorded once, run by one descriptor, answered by one Ticket.

``with session.record() as commands:`` records ``commands.dispatch(...)``, ``commands.copy(...)``,
``commands.fill(...)``, ``commands.update(...)``, ``commands.barrier()``,
``commands.dispatch_indirect(...)`` (whose counts an earlier command of the list may write) and
``commands.timestamp(...)`` (the device's timestamp once the commands before it have ended) into descriptors (``struct ls_desc``, encoded by the ring's one encoder: ``ls_encode_op``, the
encoding and check of ``ls_push_op``) and, when the block ends,
hands them to the arbiter (the ``load_list`` request), which checks each as it checks a popped
descriptor and keeps the list (engine/lists.c). ``commands.submit()`` then pushes one
``LS_OP_LIST`` descriptor: the arbiter runs the commands in order, each after the one before
(each command ends with a barrier, as a single dispatch does), and answers one Ticket with the
device time of all and the first failure among them. A command that finds an object freed since
ends its list with that refusal. A dispatch may bind a bind group (groups.py), named by its id as a
single dispatch does. The commands name buffers, programs and groups by their ids: a session
that reattaches hands the list to the new arbiter after them (reattach.py), under the same id.

Parameters. A command may bind ``commands.argument(k)`` in place of a buffer (encoded as the
buffer id ``LS_LIST_ARG | k``, k < 8) and a dispatch may take ``push=commands.SUBMISSION_PUSH``
(the flag ``LS_DESC_SUBMISSION_PUSH``, its own push bytes none): ``commands.submit(push, buffers)``
then carries slot k's buffer in its descriptor's ``buffer[k]``/``offset[k]`` and the push constants
in its ``push[]``. The arbiter checks at registration what it can (the list's own objects; the
slots it uses, all of which each submission must give; the push bytes its programs take) and runs
each command with the submission's parameters substituted into a private copy, checked as a popped
descriptor is (engine/lists.c). The same commands with those buffers and push bytes inline give
the same bytes and the same recording: the arbiter caches recordings by the substituted content.
"""

from __future__ import annotations

import numpy as np

from libshare import errors
from libshare.client.buffers import Program, byte_size, workgroups
from libshare.client.groups import BindGroup
from libshare.client.operations import fill_fields, indirect_fields, timestamp_fields, update_bytes, update_fields
from libshare.ring import C
from libshare.ring._binding import DESC_DTYPE, encode_op

__all__ = ["Argument", "CommandList", "MOST_COMMANDS", "SUBMISSION_PUSH"]

MOST_COMMANDS = 1024
"""The most commands in one list (the engine's LS_ENGINE_MAX_LIST)."""


class Argument:
    """A list's parameter slot: bound in place of a buffer, it means the buffer in slot ``slot`` of
    each ``CommandList.submit(buffers=...)`` (made by ``CommandList.argument``)."""

    def __init__(self, slot: int):
        self.slot = slot

    def __repr__(self) -> str:
        return f"<libshare.Argument {self.slot}>"


class _SubmissionPush:
    def __repr__(self) -> str:
        return "libshare.SUBMISSION_PUSH"


SUBMISSION_PUSH = _SubmissionPush()
"""``push=SUBMISSION_PUSH`` in ``CommandList.dispatch``: the push constants of each submission."""


class CommandList:
    """Dispatches and copies over a session's own objects, run in order by one descriptor.

    Made by ``Session.record()``; record into it inside its ``with`` block, then ``submit()`` it
    as often as needed. ``Session.free`` forgets it."""

    SUBMISSION_PUSH = SUBMISSION_PUSH
    """``dispatch(..., push=commands.SUBMISSION_PUSH)``: the push constants of each submission."""

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

    def argument(self, slot: int) -> Argument:
        """Parameter ``slot`` (0 to 7): bind it in place of a buffer, and each ``submit`` names the buffer."""
        if not isinstance(slot, int) or not 0 <= slot < C.MAX_BUFFERS:
            raise errors.InvalidSubmission(f"a list's parameter slot is 0 to {C.MAX_BUFFERS - 1} (got {slot!r})")
        return Argument(slot)

    def dispatch(self, program: Program, groups, buffers=(), push=b"") -> None:
        """Record ``program`` over ``groups`` workgroups on ``buffers``, a list or a bind group (as
        ``Session.dispatch``); a buffer may be ``argument(k)``, and ``push`` may be ``SUBMISSION_PUSH``:
        each submission's push bytes."""
        if program.lost is not None:
            raise errors.InvalidSubmission(f"program {program.id} is lost: {program.lost}")
        takes_push = push is SUBMISSION_PUSH
        push, flags = (b"", C.DESC_SUBMISSION_PUSH) if takes_push else (bytes(push), 0)
        if isinstance(buffers, BindGroup):
            if buffers.lost is not None:
                raise errors.InvalidSubmission(f"bind group {buffers.id} is lost: {buffers.lost}")
            self._check_room()
            self._append(encode_op(C.OP_DISPATCH | C.DESC_GROUP << 16, program.id, workgroups(groups),
                                   [buffers.id], [], push), flags)
            return
        self._add(C.OP_DISPATCH, program.id, workgroups(groups), buffers, None, push, flags)

    def copy(self, src, dst, nbytes: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy between two buffers (as ``Session.copy``); either may be ``argument(k)``, with
        ``nbytes`` then given."""
        if nbytes is None:
            if isinstance(src, Argument) or isinstance(dst, Argument):
                raise errors.InvalidSubmission("a copy from or to a list's argument names its nbytes")
            nbytes = min(byte_size(src), byte_size(dst))
        self._add(C.OP_COPY, 0, (0, 0, 0), (src, dst), (src_offset, dst_offset, int(nbytes)), b"", 0)

    def fill(self, buffer, value, nbytes: int | None = None, offset: int = 0) -> None:
        """Record a fill of ``buffer`` with a 32-bit ``value`` (as ``Session.fill``); ``buffer`` may be
        ``argument(k)``, with ``nbytes`` then given."""
        if nbytes is None and isinstance(buffer, Argument):
            raise errors.InvalidSubmission("a fill of a list's argument names its nbytes")
        self._check_room()
        self._append(encode_op(*fill_fields(self._bind, buffer, value, nbytes, offset)), 0)

    def update(self, buffer, data, offset: int = 0) -> None:
        """Record a write of ``data`` into ``buffer`` at ``offset`` (as ``Session.update``; ``buffer`` may be
        ``argument(k)``); data past 128 bytes is recorded as several updates of 128 (the list answers once
        for all of them)."""
        data = update_bytes(data)
        self._check_room()
        step = C.MAX_PUSH
        if len(data) > step and len(self._descs) + -(-len(data) // step) > MOST_COMMANDS:
            raise errors.InvalidSubmission(f"a command list holds at most {MOST_COMMANDS} commands")
        for at in range(0, max(len(data), 1), step):
            self._append(encode_op(*update_fields(self._bind, buffer, data[at:at + step], offset + at)), 0)

    def barrier(self) -> None:
        """Record a barrier: what the commands before it wrote is seen by those after it. Every command
        already ends with one (the engine's record_barrier), so it changes nothing and costs nothing on
        the device; it is checked and kept."""
        self._check_room()
        self._append(encode_op(C.OP_BARRIER, 0, (0, 0, 0), [], [], b""), 0)

    def timestamp(self, buffer, offset: int = 0) -> None:
        """Record a timestamp into ``buffer`` at ``offset`` (as ``Session.timestamp``): written once the
        commands before it have ended; ``buffer`` may be ``argument(k)``."""
        self._check_room()
        self._append(encode_op(*timestamp_fields(self._bind, buffer, offset)), 0)

    def dispatch_indirect(self, program: Program, counts_buffer, buffers=(), push=b"", offset: int = 0) -> None:
        """Record ``program`` over the counts the device reads from ``counts_buffer`` at ``offset`` when the
        command runs, written maybe by a command before it (as ``Session.dispatch_indirect``); a buffer
        may be ``argument(k)`` (the counts' buffer may not), and ``push`` may be ``SUBMISSION_PUSH``."""
        if isinstance(counts_buffer, Argument):
            raise errors.InvalidSubmission("an indirect dispatch's counts buffer cannot be a list's argument")
        takes_push = push is SUBMISSION_PUSH
        self._check_room()
        fields = indirect_fields(self._bind, program, counts_buffer, buffers, b"" if takes_push else push, offset)
        self._append(encode_op(*fields), C.DESC_SUBMISSION_PUSH if takes_push else 0)

    def _bind(self, item) -> tuple:
        """(buffer, id, offset) of a command's buffer: ``argument(k)`` as ``LS_LIST_ARG | k``, else the session's."""
        if isinstance(item, Argument):
            return None, C.LIST_ARG | item.slot, 0
        return self._session._binding(item)

    def _check_room(self) -> None:
        if self.id:
            raise errors.InvalidSubmission("this command list was recorded already: record a new one")
        if len(self._descs) >= MOST_COMMANDS:
            raise errors.InvalidSubmission(f"a command list holds at most {MOST_COMMANDS} commands")

    def _add(self, opcode: int, program: int, groups, buffers, extra, push: bytes, flags: int) -> None:
        self._check_room()
        bound = [self._bind(item) for item in buffers]
        offsets = [offset for _, _, offset in bound]
        if extra is not None:  # a copy: source and destination offsets from their bindings, then the size
            offsets = [offsets[0] + extra[0], offsets[1] + extra[1], extra[2]]
        self._append(encode_op(opcode, program, groups, [buffer_id for _, buffer_id, _ in bound], offsets, push),
                     flags)

    def _append(self, desc: bytes, flags: int) -> None:
        """Keep encoded command ``desc``, with list-only ``flags`` added (the encoder writes none of them)."""
        if flags:
            slot = np.frombuffer(desc, DESC_DTYPE).copy()
            slot["flags"] |= flags
            desc = slot.tobytes()
        self._descs.append(desc)

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

    def submit(self, push=b"", buffers=()):
        """Run the list: one descriptor, one Ticket for all its commands (the first failure is its error).
        ``buffers`` fill its parameter slots (``argument(k)`` is ``buffers[k]``: arrays or Buffers; a list
        whose commands use k slots takes exactly k), ``push`` its ``SUBMISSION_PUSH`` dispatches' push bytes."""
        if self.lost is not None:
            raise errors.InvalidSubmission(f"command list {self.id} is lost: {self.lost}")
        if not self.id:
            raise errors.InvalidSubmission("record the list (its with block) before submitting it")
        session = self._session
        bound = [session._binding(item) for item in buffers]
        ids, offsets = [buffer_id for _, buffer_id, _ in bound], [offset for _, _, offset in bound]
        push = bytes(push)
        return (session._push(C.OP_LIST, self.id, 0, 0, 0, ids, offsets, push)
                or session._submit(C.OP_LIST, self.id, 0, 0, 0, ids, offsets, push))

    def __repr__(self) -> str:
        return f"<libshare.CommandList id={self.id} commands={len(self._descs)}>"
