"""Bind groups: a program layout's buffers bound once, named by one id in every dispatch.

A descriptor carries at most ``LS_MAX_BUFFERS`` (8) buffer ids, each bound from its offset to the
buffer's end. ``session.bind_group(program, buffers)`` asks the arbiter (the ``bind_group``
request) to keep, for ``program``'s layout, one buffer, offset and range per binding, up to the
device's limit (``LS_ENGINE_MAX_BINDINGS``, 32, or less); a dispatch that passes the group as its
``buffers`` (``session.dispatch(program, groups, buffers=group)``, or in a command list) is one
descriptor whatever the count: flags ``LS_DESC_GROUP``, no buffer ids but the group's. The arbiter
checks every entry when the group is made and again at each dispatch that names it (a buffer freed
since refuses the dispatch with ``LS_ENOBUFFER``; engine/validate.c). At a texel binding the entry
is a TexelView (buffers.py), whole (offset and range 0: a view has its own range). A group serves
every program of the same layout (buffer count, uniform or storage, arrays of buffers, texel
bindings and their formats); a program with more than 8 buffers is dispatched through one only.

A group names buffers by their ids: a session that reattaches hands it to the new arbiter after its
buffers and programs, under the same id (reattach.py), so that command lists recorded over it keep
working.
"""

from __future__ import annotations

from libshare import errors
from libshare.client.buffers import Program

__all__ = ["BindGroup", "group_entries", "make_group"]


class BindGroup:
    """Buffers bound once for a program's layout; pass it as a dispatch's ``buffers``.

    Made by ``Session.bind_group``; ``Session.free`` forgets it (dispatches already queued still
    run)."""

    __slots__ = ("id", "program", "entries", "lost")

    def __init__(self, group_id: int, program: Program, entries: list[list[int]]):
        self.id = group_id
        """The arbiter's id for this group."""
        self.program = program
        """The program whose layout it binds (any program of the same layout may use it)."""
        self.entries = entries
        """[buffer id, byte offset, byte range (0: to the buffer's end)] per binding, as the arbiter got them."""
        self.lost: Exception | None = None
        """Why a new arbiter refused it on reattach, or None."""

    def __repr__(self) -> str:
        return f"<libshare.BindGroup id={self.id} bindings={len(self.entries)}>"


def make_group(session, program: Program, entries: list[list[int]]) -> BindGroup:
    """The bind group of ``entries`` ([buffer id, offset, range] each) for ``program``, made by ``session``'s
    arbiter and kept by the session (for a reattach); the C API's ls_bind_group names buffers by id."""
    reply = session._request("bind_group", program_id=program.id, buffers=entries)
    group = BindGroup(reply.fields["group_id"], program, entries)
    session._objects[group.id] = group
    return group


def group_entries(binding, program: Program, buffers) -> list[list[int]]:
    """The bind_group request's entries for ``buffers`` (each a buffer or array, or ``(it, offset,
    range)``: the offset from where it binds, the range None for to its end), in ``program``'s binding
    order; ``binding`` is the session's (Submitter.binding)."""
    buffers = list(buffers)
    if len(buffers) != program.bindings:
        raise errors.InvalidSubmission(f"program {program.id} binds {program.bindings} buffers; the group lists "
                                       f"{len(buffers)}")
    entries = []
    for item in buffers:
        offset, size = 0, None
        if isinstance(item, tuple):
            if len(item) != 3:
                raise errors.InvalidSubmission(f"a bind group entry is a buffer or (buffer, offset, range), not "
                                               f"{len(item)} values")
            item, offset, size = item
        _, buffer_id, base = binding(item)
        if int(offset) < 0 or (size is not None and int(size) <= 0):
            raise errors.InvalidSubmission(f"a bind group entry's offset is at least 0 and its range above 0 "
                                           f"(got {offset}, {size})")
        entries.append([buffer_id, base + int(offset), 0 if size is None else int(size)])
    return entries
