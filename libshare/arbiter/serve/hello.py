"""Hello and attach: what a client may ask for, the slot it takes, and its welcome.

A connection's first frame reaches :meth:`Hellos.route` on the gate's thread (gate.py): a
control command goes to the control workers, a hello is checked against :data:`HELLO` (the
type and range of each field; a bad one is answered and may be sent again) and the admission
rules, and takes a client slot (:meth:`Hellos.admit`). The gate's thread then makes the client
and sends its welcome (:meth:`Hellos.welcome`, called by sessions.py): a ring region (one of
the :class:`SpareRegions` made ahead when there is one), the client's doorbell, its record,
queued for the control thread; the welcome carries the ring's memfd and the doorbell, and, for a
hello that asks (``device_info``: the Vulkan driver's), the physical device the driver reports
(device_info.py). Nothing in that waits on the peer. The peer's pid and uid come from SO_PEERCRED, never from a message.

Slots. ``--max-clients`` bounds the clients attached at once; one share socket serves at
most a quarter of them (:attr:`Arbiter.share_clients`), and one uid other than root's and the
arbiter's leaves a quarter to the others (:attr:`Arbiter.user_clients`: one user that opened
every slot locked the others out). A slot goes back when the connection ends
(:meth:`Hellos.release`), whatever failed: no exited process keeps one.

Users. Without --multi-user the socket is 0600 in a 0700 directory, and a peer of another
uid is refused with AccessDenied (by the file system at connect, or here at hello if the
modes were opened). With it (root only) the directory is 0711 and the socket 0666: any user
may connect and the arbiter checks uids itself. A client of another uid may ask only for the
default priority or lower (:func:`check_priority_allowed`), and may join only the groups it
owns (set_group_owner) or unowned ones of no raised priority, naming one of its own when it
owns any (:func:`check_group_allowed`). A hello through a group's share socket
(share_sockets.py, a container's pipe directory) joins that group whatever it names; whatever
its uid, it gets no priority above the default and is held to the group's owner rules, and
no control command is taken there. A client, for its part, talks only to a listener of its
own uid or root's (``protocol.wire.dial``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from libshare.errors import AccessDenied, InvalidSubmission, ProtocolError, ServerNotReady, TooManyClients
from libshare.protocol import wire as protocol
from libshare.protocol.control import printable
from libshare.ring import Region
from libshare.arbiter.policy.limits import device_limit
from libshare.arbiter.policy.scheduler import outranks, percentage, priority_name
from libshare.arbiter.serve.clients import Client, trusted_peer
from libshare.arbiter.serve.commands import FIELDS as _CONTROL
from libshare.arbiter.serve.device_info import physical_device
from libshare.arbiter.serve.share_sockets import check_share_hello

__all__ = ["HELLO", "Hellos", "SpareRegions", "check_priority_allowed", "check_group_allowed"]

log = logging.getLogger("libshare.arbiter")

SPARE_REGIONS = 2  # ring regions made ahead of the hellos that will take them


def _op(name: str) -> dict:
    return {"op": (protocol.choice(name), True)}


def _group_name(name: str, value):
    value = protocol.text(256)(name, value)
    if not value.isprintable():
        raise InvalidSubmission(f"{name} must be printable text (got {protocol.short(value)})")
    return value


HELLO = {**_op("hello"), "name": (protocol.text(1024), False), "version": (protocol.integer(0, 65535), False),
         "priority": (protocol.text(32), False), "group": (_group_name, False),
         "share": (protocol.either(protocol.text(16), protocol.integer(0, 100)), False),
         "mem_limit": (protocol.byte_counts(16, 64, 1 << 62), False), "reattach": (protocol.flag(), False),
         "device_info": (protocol.flag(), False)}
"""The schema of a hello (checked by the gate: a bad one is answered and may be sent again)."""


class Hellos:
    """The arbiter's side of hello and attach: routes first frames, keeps the client slots, and
    makes and welcomes each admitted client. ``lock`` is the arbiter's (its ``closed`` and the
    slots); ``spares`` the ring regions made ahead."""

    def __init__(self, arbiter, lock: threading.Lock, spares: SpareRegions):
        self._arbiter, self._lock, self._spares = arbiter, lock, spares
        self._next_client = 1
        self._attached: dict[int, tuple[str | None, int]] = {}  # client id -> (its share socket's group, its
        # uid), for the clients whose connection is open (the client limit, and a tenant's)

    def __len__(self) -> int:
        """Clients attached (their connections open)."""
        return len(self._attached)

    def route(self, frame: protocol.Frame, pid: int, uid: int, control: bool, share: str | None = None):
        """What the gate does with a connection's first frame: ("session", client id) for an admitted
        hello, ("control", None) for a control command. A bad frame raises ProtocolError or
        InvalidSubmission (answered; the connection stays), a refusal another LibshareError. ``share``:
        the group whose share socket the connection came through (share_sockets.py)."""
        op = frame.fields.get("op")
        if frame.payload:
            raise ProtocolError("a hello or a control command carries no payload")
        if op == "control" and share is not None:
            raise AccessDenied(f"this socket is the share of group {share}: it takes sessions only, and control "
                               "commands go to the arbiter's own socket")
        if op == "control":
            protocol.check_fields(frame.fields, _CONTROL, "control")
            return "control", None
        if op != "hello":
            raise ProtocolError(f"the first message must be hello or a control command (got op "
                                f"{protocol.short(op)})")
        if control:
            raise ProtocolError("a control connection carries only control commands")
        protocol.check_fields(frame.fields, HELLO, "hello")
        scheduler = self._arbiter.drainer.scheduler
        priority, _ = requested_priority_and_share(frame.fields, scheduler.default_priority)
        trusted = trusted_peer(uid, share)
        check_priority_allowed(priority, scheduler.default_priority, trusted)
        if share is not None:
            check_share_hello(frame.fields, share)  # its group is the share's, and the owner rules apply
        check_group_allowed(requested_group(frame.fields), uid, self._arbiter.group_owners, scheduler, trusted)
        reattaching = bool(frame.fields.get("reattach"))
        if reattaching:  # ClientTerminated when its dispatch ended the last arbiter
            self._arbiter.drainer.quarantine.check_reattach(pid)
        return "session", self.admit(pid, uid, share, reattaching)

    def admit(self, pid: int, uid: int, share: str | None = None, reattaching: bool = False) -> int:
        """A client slot for the peer (pid, uid), by its id; refuses with AccessDenied, ServerNotReady
        or TooManyClients (also past ``share_clients`` of one share socket, and ``user_clients`` of one
        uid that is not trusted)."""
        arbiter = self._arbiter
        if uid != os.getuid() and not arbiter.multi_user:
            log.warning("refused pid %d: uid %d is not the arbiter's uid %d", pid, uid, os.getuid())
            raise AccessDenied(f"uid {uid} may not use this arbiter: it runs as uid {os.getuid()} "
                               "and was not started in multi-user mode")
        arbiter.drainer.quarantine.check_client(pid, uid, share, reattaching)  # Quarantined: the process, or its tenant
        with self._lock:
            if arbiter.closed:
                raise ServerNotReady("the arbiter is shutting down")
            if arbiter.state != "ACTIVE":
                raise ServerNotReady(f"server not ready: its state is {arbiter.state}; retry once it is ACTIVE")
            if share is not None and sum(s == share for s, _ in self._attached.values()) >= arbiter.share_clients:
                raise TooManyClients(f"the share socket of group {share} serves {arbiter.share_clients} clients "
                                     "already, its limit (a quarter of --max-clients)")
            if not protocol.trusted_uid(uid) and sum(u == uid for _, u in self._attached.values()) >= \
                    arbiter.user_clients:
                raise TooManyClients(f"uid {uid} has {arbiter.user_clients} clients already, the most one user "
                                     "other than root and the arbiter's may have (a quarter of --max-clients "
                                     "stays for the others)")
            if len(self._attached) >= arbiter.max_clients:
                raise TooManyClients(f"the arbiter already serves {len(self._attached)} clients (its limit is "
                                     f"{arbiter.max_clients}); wait for one to leave or raise --max-clients")
            client_id = self._next_client
            self._next_client += 1
            self._attached[client_id] = (share, uid)
        return client_id

    def release(self, client_id: int) -> None:
        """Client ``client_id``'s slot goes back (its connection ended, or its hello failed)."""
        with self._lock:
            self._attached.pop(client_id, None)

    def welcome(self, conn: socket.socket, fields: dict, pid: int, uid: int, client_id: int) -> Client:
        """Make and welcome the client that :meth:`route` admitted as ``client_id`` (its hello passed
        :data:`HELLO` there). A failure gives its slot back; once the control thread knows the client,
        the end of its connection reclaims it."""
        arbiter = self._arbiter
        drainer = arbiter.drainer
        priority, requested_share = requested_priority_and_share(fields, drainer.scheduler.default_priority)
        name = printable(fields.get("name") or f"pid{pid}")[:64]  # it goes into logs and ps
        group = requested_group(fields)
        env_limit = fields.get("mem_limit")
        if env_limit is not None:
            env_limit = device_limit(env_limit, arbiter.device.index, arbiter.device.uuid)
        with self._lock:
            if arbiter.closed:
                raise ServerNotReady("the arbiter is shutting down")
            share, _ = self._attached.get(client_id, (None, uid))
        region = None
        try:
            region = self._spares.take()
            region.peers.announce_consumer()
            if pid != os.getpid():  # an embedded client is this process: nothing to watch
                region.peers.watch(pid)
        except BaseException:
            if region is not None:
                region.close()
            self.release(client_id)
            raise
        try:
            client = Client(client_id, pid, uid, name, priority, region, group=group, cmdline=_cmdline(pid),
                            requested_share=requested_share, env_mem_limit=env_limit,
                            own_priority=bool(fields.get("priority")), share=share)
        except BaseException:  # its doorbell takes descriptors too
            region.close()
            raise
        try:  # queued ahead of every later task (ps, once the client has its welcome, lists it), but run
            # only once the welcome is out (sessions.py flushes it), while the client maps its ring
            drainer.post(drainer.add_client, client, policy=False, wake=False)  # it sets the policy
        except BaseException:  # shutting down: the control thread never knew it
            region.close()
            client.doorbell.close()
            raise
        try:
            extra, payload = ({}, b"")
            if fields.get("device_info"):  # the Vulkan driver's (device_info.py)
                described, payload = physical_device(arbiter, client)
                extra = {"physical_device": described}
            protocol.send(conn, {"ok": True, "client_id": client_id, "arbiter_pid": os.getpid(),
                                 "device": arbiter.device.name, "priority": priority,
                                 "load_timeout": arbiter.load_bound(), "supervised": arbiter.supervised,
                                 "share": share, **extra}, payload,
                          fds=(region.fd, client.doorbell.writer))
            log.info("%s connected (uid %d%s)", client.describe(), uid, f", group {group}" if group else "")
            region.forget_fd()  # the client has them now: the mappings and the arbiter's own bell stay
            client.doorbell.handed_over()
        except BaseException:  # gone before (or failed right after) the welcome: reclaim what was made for it
            drainer.post(drainer.connection_closed, client)
            self.release(client_id)
            raise
        return client


class SpareRegions:
    """Ring regions made ahead of the hellos that take them, on a thread of their own: a region
    took some 0.3 ms to format, 0.1 ms since the format leaves the slots alone, and made on the way
    to a welcome (or by the connection thread after it) it held up the new client's first request.

    The thread makes one at once when a hello took one: waiting for a quiet moment (no request for
    a millisecond) spared a lone client's next requests, which share the CPU and the GIL with it,
    but cost clients that attach one after another more than it saved (measured)."""

    def __init__(self, geometry: tuple[int, int, int]):
        self._geometry = geometry
        self._lock = threading.Lock()
        self._regions: list[Region] = []
        self._closed = False
        self._wanted = threading.Event()  # a hello took a spare region: the thread makes one
        self._thread: threading.Thread | None = None
        for _ in range(SPARE_REGIONS):  # made now, so that the arbiter's fd count stays level afterwards
            self._make_one()

    def take(self) -> Region:
        """A spare region, or a new one when none is left; ServerNotReady once closed."""
        with self._lock:
            if self._closed:
                raise ServerNotReady("the arbiter is shutting down")
            region = self._regions.pop() if self._regions else None
        return region or Region.create(*self._geometry)

    def refill(self) -> None:
        """Make up for the regions taken, on the spares thread (started on the first call: should it
        fail, hellos make their own)."""
        self._wanted.set()
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="libshare-spares", daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:  # no thread to be had now: the next hello tries again
            log.warning("could not start the spare-region thread: %s", exc)
            with self._lock:
                self._thread = None

    def close(self) -> None:
        """Close the spare regions; the thread ends."""
        with self._lock:
            self._closed = True
            spares, self._regions = self._regions, []
        for region in spares:
            region.close()
        self._wanted.set()

    def _run(self) -> None:
        """Keep SPARE_REGIONS made; sleep until a hello takes one."""
        while True:
            self._wanted.wait()
            self._wanted.clear()
            while not self._closed:
                with self._lock:
                    full = len(self._regions) >= SPARE_REGIONS
                if full:
                    break
                try:
                    self._make_one()
                except OSError as exc:  # the next hello makes its own
                    log.warning("could not make a spare ring region: %s", exc)
                    break
            if self._closed:
                return

    def _make_one(self) -> None:
        with self._lock:
            if self._closed or len(self._regions) >= SPARE_REGIONS:
                return
        region = Region.create(*self._geometry)
        with self._lock:
            if not self._closed and len(self._regions) < SPARE_REGIONS:
                self._regions.append(region)
                return
        region.close()


def requested_priority_and_share(fields: dict, default_priority: str) -> tuple[str, int]:
    """The priority and compute share a hello asks for (the share may only lower the arbiter's)."""
    try:
        priority = priority_name(fields.get("priority") or default_priority)
        share = fields.get("share")
        share = 100 if share in (None, "") else percentage(share)  # 0 is no share, not "unset"
    except ValueError as exc:
        raise InvalidSubmission(str(exc)) from None
    return priority, share


def requested_group(fields: dict) -> str:
    """The group a hello names ("" for none), cut to 64 characters as it is kept."""
    return (fields.get("group") or "")[:64]


def check_priority_allowed(priority: str, default_priority: str, trusted: bool) -> None:
    """AccessDenied when a peer that is not ``trusted`` (root or the arbiter's uid, on the arbiter's
    own socket) asks for a priority above the default: in multi-user mode a tenant could otherwise
    make itself realtime, and hold every other client to one short slice per pass (MPS's clients may
    only lower theirs)."""
    if not trusted and outranks(priority, default_priority):
        raise AccessDenied(f"priority {priority} is above the default ({default_priority}): only uid {os.getuid()} "
                           "or root may ask for it; the operator may set it (set_client_priority PID PRIORITY)")


def check_group_allowed(group: str, uid: int, owners: dict[str, int], scheduler, trusted: bool) -> None:
    """AccessDenied when a peer that is not ``trusted`` (clients.trusted_peer: root or the arbiter's
    uid, through the arbiter's own socket) names a group that another uid owns (set_group_owner),
    or an unowned group whose priority is above the default, or, owning groups, names none of them.
    A group is a name: without owners, a tenant could join another job's group to spend its memory
    limit and compute share, or a group the operator made realtime, or leave its own group to escape
    its limits. Through a share socket root is a tenant too: the operator lets a root container into
    a raised-priority share group by making uid 0 its owner."""
    if trusted:
        return
    if group and owners.get(group, uid) != uid:
        raise AccessDenied(f"group {printable(group)!r} belongs to uid {owners[group]}")
    if group and group not in owners and outranks(scheduler.group_priority.get(group), scheduler.default_priority):
        raise AccessDenied(f"group {printable(group)!r} has priority {scheduler.group_priority[group]}, above the "
                           f"default: only uid {os.getuid()} or root may join it unless the operator gives it an "
                           "owner (set_group_owner GROUP UID)")
    mine = sorted(g for g, owner in list(owners.items()) if owner == uid)  # a control worker may write meanwhile
    if mine and group not in mine:
        raise AccessDenied(f"uid {uid} owns groups ({', '.join(map(printable, mine[:4]))}): name one of them "
                           "(LIBSHARE_GROUP)")


def _cmdline(pid: int) -> str:
    """The command line of process ``pid`` (from /proc), or "" if it is gone."""
    try:  # three system calls (a buffered open() makes eight): this is on the way to a client's welcome
        fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return ""
    return text.replace(b"\0", b" ").decode(errors="replace").strip()
