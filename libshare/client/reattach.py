"""Surviving the arbiter: a session that moves to the arbiter that replaced a lost one.

Under the control daemon (``libshare-control -d``; see libshare/daemon/supervisor.py) an
arbiter that dies is replaced within about 50 ms, and a session reattaches instead of ending: a
plain loss becomes ArbiterRestarted (:meth:`Reattacher.record_loss`), and the next call or wait
runs :meth:`Reattacher.reattach`. That keeps other threads out of the old ring (they wait at the
gate's ``enter`` while it is moving), settles the tickets in flight, says hello to the new
arbiter and hands it every live buffer, texel view, program, bind group and command list under the ids
they had, in id order (a view after its buffer, a group after the buffers and views it names, a list
after the groups; ``import`` sends the
sealed memfd a shared buffer kept, so the arrays stay the same objects over the same pages; a
program's SPIR-V is loaded again, with its specialization constants and array lengths; a texel view is made again
over its buffer, with its format, offset and size, or lost with its buffer; a device buffer is lost:
BufferLost), then swaps in the new attachment and resends, first and in ticket order, the work
the old arbiter never ran:
descriptors still unconsumed in the old lanes (the producer's own writes, read back) and, after
a hand-over (``restart``: the old arbiter closes the ring with LS_EMOVED and answers what it had
not started LS_EMOVED), those answered so. It waits for the old arbiter to answer what it had
started before it decides. Work the old arbiter took and never answered fails with
ArbiterRestarted: it may not have run, or may have partly run. A loss that is not the arbiter's death
(terminated, a fault, a corrupt ring), or one with no control daemon, stays sticky.

The :class:`Reattacher` holds what a new arbiter needs (the hello, the socket's path, the
session's live objects) and works on the parts it is given: the gate (gate.py), whose
attachment it replaces, and the completions (completions.py), whose tickets it settles.
A session whose tickets are numbered and read outside Python (the C API) reattaches only when
C asks, through :meth:`Reattacher.reattach_external`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import numpy as np

from libshare import errors
from libshare.client import exchange as _exchange
from libshare.client.attachment import Attachment, Moved
from libshare.client.buffers import Buffer, Program, TexelView, array_triples, constant_pairs
from libshare.client.completions import Completions, Ticket
from libshare.client.gate import Gate, closed_error, fresh
from libshare.client.groups import BindGroup
from libshare.client.lists import CommandList
from libshare.protocol import paths as _config
from libshare.protocol import wire as protocol
from libshare.ring import C, Region, TicketBook

__all__ = ["Reattacher", "TRIES"]

TRIES = 3
"""Reattaches a call makes before the loss is raised (a new arbiter that dies at once: try the next)."""
_REDIAL_PAUSE = 0.01  # seconds between looks for the arbiter that replaces a lost one
_MOVE_POLL = 0.001  # seconds between looks at a handed-over ring, for the answers still due
_MOVED = TicketBook.MOVED


class Reattacher:
    """What a session needs to move to a new arbiter, and the move itself."""

    def __init__(self, gate: Gate, completions: Completions, objects: dict[int, Buffer | Program],
                 seen: dict, hello: dict | None, socket_path: Path | None, timeout: float, embedded: bool):
        self.gate, self.completions = gate, completions
        self.objects = objects  # id -> each live buffer and program of the session: handed to a new arbiter
        self.seen = seen  # the session's binding cache: its lanes and offsets are the old ring's
        self.hello, self.socket_path, self.timeout, self.embedded = hello, socket_path, timeout, embedded
        self.lock = threading.Lock()  # one reattach at a time
        self.count = 0
        """How many times the session reattached."""
        self.outside = False
        """True: other code (the C API) reads the completion ring and numbers the tickets; only
        :meth:`reattach_external` reattaches then (a call that meets the loss raises it)."""

    def may_reattach(self) -> bool:
        """Whether a new arbiter will take this session over when this one is lost."""
        return not self.embedded and self.socket_path is not None and not self.gate.closed and self.supervised()

    def supervised(self) -> bool:
        """Whether a control daemon starts a new arbiter on this session's socket."""
        attached = self.gate.attached
        return attached.supervised if attached.contained else _config.supervised(self.socket_path.parent)

    def record_loss(self, lost: errors.LibshareError) -> errors.LibshareError:
        """Record why the arbiter is gone, once; return the session's loss.

        A plain loss (the arbiter died or closed the connection) under a control daemon, which
        starts a new arbiter, becomes ArbiterRestarted, and so does a hand-over: the next call,
        or a wait, reattaches (:meth:`reattach`), which settles every ticket in flight. Any
        other loss (terminated, a fault, a corrupt ring), or one with no control daemon, is
        sticky and fails the tickets in flight now."""
        if type(lost) is errors.ArbiterLost and self.may_reattach():
            lost = errors.ArbiterRestarted(f"{lost}; a new arbiter takes over: the work in flight may not have "
                                           "run, or may have partly run (part of its output written); submit it "
                                           "again (this session reattaches by itself)")
        with self.gate.lock:  # a dispatch numbers and records its ticket under the lock: none slips past
            if self.gate.lost is not None:
                return self.gate.lost
            self.gate.lost = lost
        if not isinstance(lost, errors.ArbiterRestarted):
            self.completions.fail_in_flight(lost)
        return lost

    def check_usable(self) -> None:
        """Raise SessionClosed, or the sticky loss (noticing one the arbiter left in the ring);
        after an arbiter restart, reattach first."""
        gate = self.gate
        if gate.lost is None:
            gate.enter()
            try:
                gate.lost = gate.attached.closed_by_arbiter()
            finally:
                gate.leave()
        elif gate.closed:
            raise closed_error()
        if isinstance(gate.lost, errors.ArbiterRestarted):
            self.reattach()
        if gate.lost is not None:
            raise fresh(gate.lost)

    def reattach(self, outside: bool = False) -> None:
        """Attach the session to the arbiter that replaced a lost one: a new ring, then every live
        buffer (by the memfd it kept: the same memory) and program (from its SPIR-V) under the ids
        they had. Device buffers come back lost (BufferLost), a program the new arbiter refuses
        comes back lost with its reason. Waits up to the session's timeout for the new arbiter;
        past it the loss becomes a sticky ArbiterLost. ``outside``: called by
        :meth:`reattach_external` (the only caller for a session whose tickets live outside)."""
        gate, completions = self.gate, self.completions
        with self.lock:
            if not isinstance(gate.lost, errors.ArbiterRestarted) or gate.closed or self.outside and not outside:
                return  # another thread reattached already (or gave up, or the session closed)
            left = gate.stop_entries()  # nobody enters the old region from now on
            try:
                resend = self.unrun_work() if left else None
                sock, welcome = self.dial_new_arbiter()
                try:
                    self.register_objects(sock)  # before anyone dispatches: the ids must exist there
                except BaseException:
                    welcome.close_fds()
                    sock.close()
                    raise
            except (errors.LibshareError, EOFError, OSError) as exc:
                if isinstance(exc, (errors.AccessDenied, errors.TooManyClients, errors.ClientTerminated)):  # refused: say why
                    gate.lost = exc
                    completions.fail_in_flight(exc)
                elif not isinstance(exc, errors.ArbiterLost):  # (that one went too: the next call tries again)
                    gate.lost = errors.ArbiterLost(f"the arbiter went away and no new one took its place: {exc}")
                    completions.fail_in_flight(gate.lost)
                gate.resume()
                return
            if resend is None:  # a thread stayed inside the old ring: what it ran cannot be told
                completions.fail_in_flight(errors.error_for("LS_ERESTARTED"))
            sock.settimeout(_exchange.REPLY_TIMEOUT)
            old = gate.attached
            with gate.lock:
                gate.attached = Attachment(sock, welcome)
                gate.lanes = threading.local()  # each thread claims a lane on the new ring
                self.seen.clear()
                gate.lost = None
                self.count += 1
            old.close(region=left)  # a region still in use is left mapped
            try:
                if resend is not None and len(resend):  # first on the new ring: the order stays
                    gate.attached.region.lanes.producer().push(resend, timeout=self.timeout)
            except errors.LibshareError as exc:
                completions.fail_in_flight(errors.ArbiterRestarted(f"the new arbiter did not take this ticket's work "
                                                                   f"({exc}): submit it again"),
                                           resend["ticket"].tolist())
            finally:
                gate.resume()

    def unrun_work(self) -> np.ndarray:
        """The descriptors of the tickets in flight that the lost arbiter never ran, to send to the
        new one under the same tickets; every other ticket in flight fails with ArbiterRestarted.

        Never run: those it answered LS_EMOVED (handing over), and those still waiting in the
        lanes (it never took them). After a hand-over the old arbiter still finishes what it took
        (a long dispatch piece by piece) and answers it, so this waits for that while it lives:
        it bounds that wait itself (``Arbiter.moved_work_bound``: each piece within the
        watchdog), then exits. Only the reattaching thread uses the region now (no other thread
        may enter it)."""
        gate, completions = self.gate, self.completions
        region = gate.attached.region
        while True:
            try:
                completions.file()
                corrupt = False
            except errors.RingCorrupted:
                corrupt = True
            in_flight = completions.book.in_flight()
            pending = set(in_flight)
            moved = {number for number, marks in in_flight.items() if marks & _MOVED}
            unconsumed = set() if corrupt else region.lanes.unconsumed_tickets()
            if (corrupt or pending - moved <= unconsumed or not region.peers.alive()
                    or not isinstance(gate.lost, Moved)):
                break
            time.sleep(_MOVE_POLL)  # the old arbiter finishes what it took, then answers it
        not_run = (moved | unconsumed) & pending
        completions.book.resent()
        completions.fail_in_flight(errors.error_for("LS_ERESTARTED"), pending - not_run)
        return region.lanes.descriptors_of(not_run)

    def reattach_external(self, tickets, moved=()) -> list[tuple[int, int | None, int, errors.LibshareError | None]]:
        """Reattach a session whose tickets are numbered and whose completion ring is read outside
        Python (the C API, bindings/c/capi.c, which stops using the old ring meanwhile).

        ``tickets``: its tickets in flight, after it read the old completion ring; ``moved``: those
        of them the old arbiter answered LS_EMOVED. Each stands in the session's ticket book for the
        reattach (a Ticket held here), which reads what the old ring still holds, resends what the old
        arbiter never ran, and fails the rest. Returns ``(ticket, status, device_ns, error)`` for
        each: the arbiter's status (its completion was read here: the caller never sees it), or
        the error it failed with (ArbiterRestarted), or neither: sent to the new arbiter, its
        completion comes on the new ring. Raises the session's loss when it cannot reattach
        (no control daemon, terminated, a fault): sticky then."""
        gate, completions = self.gate, self.completions
        book = completions.book
        held = {int(number): Ticket(completions, int(number)) for number in tickets}
        # The caller read the completion ring through a view of its own, and a view keeps its own
        # head: this session's lags behind. A view opened now starts where the caller stopped.
        view = Region.attach(gate.attached.region.fd)
        with contextlib.suppress(OSError):  # (gone for good: nothing left to wait for)
            view.peers.watch(gate.attached.arbiter_pid)
        with gate.lock:
            for number in held:
                book.drop(number)  # (a record of an earlier reattach: the caller's now)
                book.add(number)
            stale, gate.attached.region = gate.attached.region, view
        for number in moved:
            book.settle(int(number), -C.EMOVED)  # marks it moved, as the completion did
        try:
            if gate.lost is None:  # the caller saw the loss on the ring, this session did not
                with gate.inside() as inside:
                    why = gate.attached.closed_by_arbiter() if inside else None
                self.record_loss(why or errors.ArbiterLost("the arbiter exited or closed this session"))
            for _ in range(TRIES):  # (a new arbiter that dies at once: try the next)
                if not isinstance(gate.lost, errors.ArbiterRestarted) or gate.closed:
                    break
                self.reattach(outside=True)
            if gate.closed:
                raise closed_error()
            if gate.lost is not None:
                raise fresh(gate.lost)
        finally:
            with gate.lock:  # the resent tickets are the caller's again: their completions come to it
                for number, ticket in held.items():
                    completions.fetch(ticket)  # (its outcome, when it was read here)
                    book.drop(number)
                    ticket.id = 0  # the number is the caller's: this Ticket must not forget it
            gate.wait_out()  # a thread that took the stale view is inside until it leaves
            stale.close()
        return [(number, ticket._status, ticket.device_ns or 0, ticket._error) for number, ticket in held.items()]

    def dial_new_arbiter(self) -> tuple[socket.socket, protocol.Frame]:
        """Say hello to the arbiter now serving the socket (waiting for it while a control daemon runs)."""
        deadline = time.monotonic() + max(self.timeout, _config.REPLACEMENT_WAIT)  # (while supervised)
        while True:
            sock = protocol.dial(self.socket_path, max(deadline - time.monotonic(), 0.1))
            if sock is not None:
                try:
                    welcome = _exchange.hello(sock, {**self.hello, "reattach": True}, self.timeout)
                    if welcome.fields["arbiter_pid"] != self.gate.attached.arbiter_pid:
                        return sock, welcome
                    welcome.close_fds()  # the old arbiter, still on its way out
                except errors.ArbiterUnavailable:  # (ServerNotReady too) starting, or on its way out
                    pass
                except BaseException:
                    sock.close()
                    raise
                sock.close()
            if time.monotonic() >= deadline:
                raise errors.ArbiterUnavailable(f"none answered at {self.socket_path} within "
                                                f"{max(self.timeout, _config.REPLACEMENT_WAIT):g} s")
            if not self.supervised():
                raise errors.ArbiterUnavailable("the control daemon stopped (quit)")
            time.sleep(_REDIAL_PAUSE)

    def register_objects(self, sock: socket.socket) -> None:
        """Hand a new arbiter every live buffer, texel view, program, group and list, in id order (ids are
        kept: a view's is above its buffer's); what it refuses is marked lost with the reason. EOFError or
        OSError when it goes away too."""
        for object_id, item in sorted(self.objects.items()):
            if isinstance(item, TexelView):
                if item.buffer.lost is not None:
                    item.lost = item.buffer.lost
                else:
                    reply = _exchange.exchange(sock, {"op": "view", "id": object_id, "buffer_id": item.buffer.id,
                                                      "format": item.format, "offset": item.offset,
                                                      "size": item.nbytes})
            elif isinstance(item, CommandList):  # after the buffers, views, programs and groups it names
                reply = _exchange.exchange(sock, {"op": "load_list", "id": object_id}, item.commands)
            elif isinstance(item, BindGroup):  # after its buffers and program, as made
                reply = _exchange.exchange(sock, {"op": "bind_group", "id": object_id, "program_id": item.program.id,
                                                  "buffers": item.entries})
            elif isinstance(item, Program):
                request = {"op": "load_program", "id": object_id}
                if item.constants:  # the same specialization: the same program
                    request["constants"] = constant_pairs(item.constants)
                if item.array_lengths:
                    request["arrays"] = array_triples(item.array_lengths)
                reply = _exchange.exchange(sock, request, item.spirv)
            elif item.memfd >= 0:
                reply = _exchange.exchange(sock, {"op": "import", "size": item.size, "id": object_id},
                                           fds=(item.memfd,))
            else:
                item.lost = errors.BufferLost(f"device buffer {object_id} died with the arbiter that held it (a "
                                              "restart keeps shared buffers only): allocate it again")
            if item.lost is None and not reply.fields.get("ok"):
                refusal = errors.remote_error(reply.fields)
                item.lost = refusal if isinstance(item, (Program, CommandList, BindGroup, TexelView)) else errors.BufferLost(
                    f"buffer {object_id} could not be handed to the new arbiter: {refusal}")
            if item.lost is not None:  # the new arbiter may give its id to a new object
                del self.objects[object_id]
                if isinstance(item, Buffer):
                    item.close_memfd()
