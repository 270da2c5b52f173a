"""Quarantine: whoever brought arbiters down is refused, and only whoever did.

Containment (containment.py) keeps a client's faults to that client while the arbiter
lives. Some actions can end the arbiter itself: the driver's compiler crashing inside it
on a module the vetting child compiled fine (``libshare/arbiter/programs/compiler.py``: a
crash that depends on timing or memory), a crash while the engine handles a client's
descriptor, or a dispatch that never ends, which on a driver that cannot abort it leaves the
arbiter no way out but to exit (EXIT_UNRECOVERABLE). A supervisor restarts it; without a
memory of who did it, the same tenant could bring it down again and again, and every other
client would lose its work each time. So the arbiter keeps that memory in its pipe
directory, where the next arbiter on the same directory finds it, whoever starts that one.

**The journal.** Before an action that could end the process, the arbiter writes a small
record into ``quarantine/`` (a temporary name, then ``rename``: a record is whole or absent)
naming the client (pid, uid, the process's start time from ``/proc/PID/stat``, so that a
recycled pid is never blamed, and the share socket it came through; its name and command
line for the log), the action and the module's canonical identity; it removes the record
when the action ends. Records are few and cheap (a file created and renamed, later
unlinked; no ``fsync``: they must outlive the process, not the machine, and a reboot ends
every client anyway):

* one per compile the arbiter runs itself (``Requests._load_program`` in ``serve/requests.py``:
  pipeline creation, only when no pipeline of that module exists yet). The vetting compile
  runs in a child process, whose crash refuses the module without harming the arbiter, so
  it writes none;
* one when the watchdog finds a dispatch past its limit, removed once that work has ended.
  When it never ends (under the control daemon the arbiter ends at once: see "Handing over
  at once" in containment.py), the arbiter exits with the record in place, and the next one
  refuses that process's reattach (:meth:`Quarantine.check_reattach`). The engine names the
  client of the command that runs (a batch's progress marker says which) and its program;
  only an unmarked batch that several clients shared (SUSPECT in ``ps``) blames nobody:
  which of their dispatches ran cannot be told, and blaming all would let a runaway
  quarantine its neighbours;
* one per client whose descriptor was being processed when the arbiter crashed (action
  "descriptor being processed"), written by the crash handler itself. The record is made
  when the client comes and handed to emergency.c (``emergency.prepare``, held in memory
  by client slot), and withdrawn when it goes: nothing is written to disk per client or per
  descriptor (files made on each hello and renamed at each close cost some 80 us of CPU per
  client on ext4, on the control thread ahead of its first requests). While the
  engine checks and records a client's descriptors it keeps that client's slot in a word that
  the crash handler reads (``Engine.set_busy_word``); on a crash signal (SIGSEGV, SIGBUS,
  SIGABRT, ...) the handler writes that client's record to a temporary name and renames it to
  a journal record (``action-ARBITERPID-crashSLOT``), with system calls that are safe in a
  signal handler (making JSON there is not). A crash while the device runs the work
  (after the descriptors were recorded and submitted) is not attributed: which client's
  dispatch the driver was in cannot be told from the host.

An orderly stop (SIGTERM, ``quit``) withdraws the records of compiles still running (the
compile did not end the arbiter) but not the watchdog's: the arbiter stops with that
dispatch still running.

**A module's identity** is what it computes, not its bytes: :meth:`Quarantine.check_program`
hashes each new module's canonical form once (``programs/identity.py``: debug and
non-semantic instructions stripped, ids renumbered in order of first appearance, the
header's generator and bound normalized), and keeps it by the SHA-256 of the bytes, which
is what the rest of the arbiter (the pipelines, the watchdog) names a module by; the
journal records the canonical one. A client that changes one word the validator ignores
has the same module.

**Strikes** (strikes.py). At start, before it listens, an arbiter reads the records a dead
one left (a record names its arbiter by pid and start time: those of an arbiter still alive,
one handing its clients over to this one, stay where they are), logs them to server.log,
adds them to ``quarantine/strikes.json`` (written whole, then renamed), and removes them.
Each is a strike for three identities, each at most once per dead arbiter:

* the process: at :data:`STRIKES` it is refused at hello, until it exits;
* its tenant, the identity a fork cannot shed (its share socket, else its uid; root's and
  the arbiter's own clients are a tenant like any other): :data:`STRIKES` strikes within
  :data:`~libshare.arbiter.drain.strikes.WINDOW` refuse the tenant's every new process at
  hello for a cooldown, doubling each time;
* the module, per tenant: refused to a tenant with :data:`STRIKES` strikes on it; to every
  client only once it crashed the arbiter (a compile, not a dispatch past the watchdog:
  how long a kernel runs depends on the inputs its client chose) for
  :data:`~libshare.arbiter.drain.strikes.PROGRAM_TENANTS` distinct tenants. A tenant that
  runs a shipped kernel past the watchdog with its own inputs is refused that kernel, and
  nobody else is.

A refusal raises :class:`~libshare.errors.Quarantined`, whose message says what happened,
how often, and how an operator lifts it (``clear_quarantine PID``, ``uid:UID``,
``share:GROUP``, a module's digest, or ``all``). ``ps`` lists what is refused,
``get_quarantine`` every strike.

**Hostile input.** The directory belongs to the arbiter's uid (0700, inside the pipe
directory), but any process of that uid can write it, clients included. So the store and
the records are read with bounds (size, count, each field's type and range), a file that is
not a regular file is not followed, and whatever does not parse is logged and dropped: the
quarantine then starts empty, and the arbiter starts regardless. The worst a writer of that
directory can do is to quarantine whomever it likes, or to clear strikes; whoever can write
it can also signal the arbiter, which is worse.

An embedded arbiter (inside its one client, no pipe directory) keeps no quarantine: every
method here is then a no-op.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path

from libshare.protocol.control import decimal, printable
from libshare._proc import MAX_PID, start_time
from libshare.arbiter.drain import emergency as _emergency
from libshare.arbiter.drain.strikes import (ACTIONS, COMPILE, DESCRIPTOR, RUNAWAY, STRIKES, Strikes, share_field,
                                            tenant_of)
from libshare.arbiter.drain.strikes import digest as _digest, identity as _identity
from libshare.arbiter.programs.identity import canonical_digest
from libshare.errors import ClientTerminated, InvalidSubmission, Quarantined

__all__ = ["COMPILE", "DESCRIPTOR", "RUNAWAY", "STRIKES", "Quarantine"]

log = logging.getLogger("libshare.arbiter")

_DIRECTORY = "quarantine"  # inside the pipe directory
_STORE = "strikes.json"
_RECORD = "action-"  # a journal record: action-ARBITERPID-SERIAL
_TEMPORARY = ".tmp-"  # a record or store being written
_MAX_RECORD = _emergency.RECORD_BYTES  # bytes of one record (read; held for the crash handler)
_MAX_RECORDS = 1024  # records read at start; more are removed unread
_MAX_STORE = 1 << 20  # bytes read of the store
_MAX_TEXT = 200  # characters kept of a name or a command line
_MAX_IDENTITIES = 8192  # canonical identities kept, by SHA-256 of the bytes


class Quarantine:
    """The journal of risky actions and the strikes, in a pipe directory (thread-safe).

    Off (every method a no-op) until :meth:`open`, which a daemon arbiter calls before it serves.
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        """``quarantine/`` in the pipe directory; None while off."""
        self._lock = threading.Lock()
        self._strikes = Strikes()
        # What the hot paths read without the lock: pids, tenants and modules refused to someone.
        self._refused: tuple[frozenset, frozenset, frozenset] = (frozenset(), frozenset(), frozenset())
        self._identities: OrderedDict[bytes, bytes] = OrderedDict()  # SHA-256 of the bytes -> canonical
        self._runaways: dict[int, dict] = {}  # by client pid: the RUNAWAY records that ended the last arbiter
        self._pending: dict[Path, bool] = {}  # records written and not ended: withdrawn by close()?
        self._serial = itertools.count(1)
        self._closed = False
        self._warned = False
        self._started = start_time(os.getpid()) or 0  # this arbiter's identity in its records

    # ---------------------------------------------------------------- start

    def open(self, pipe_directory: Path) -> None:
        """Take the quarantine of ``pipe_directory``: count the records a dead arbiter left as
        strikes, then clear them. Never raises: a directory it cannot use leaves it off, logged."""
        directory = Path(pipe_directory) / _DIRECTORY
        try:
            _own_directory(directory)
        except OSError as exc:
            log.error("quarantine off: cannot use %s (%s); clients that crash the arbiter are not remembered",
                      directory, exc)
            return
        try:
            strikes = _load(directory / _STORE)
            records = _sweep(directory)
            with self._lock:
                self._strikes = strikes
                strikes.count(records)
                self._runaways = {r["client"]["pid"]: r for r in records if r["action"] == RUNAWAY}
                strikes.forget_exited(start_time)
                self._changed()
        except Exception:  # a case the checks missed: the arbiter starts all the same
            log.exception("quarantine off: reading %s failed", directory)
            with self._lock:
                self._strikes = Strikes()
                self._changed()
            return
        self.directory = directory
        try:
            _emergency.journal(str(directory))  # a crash in a client's descriptor names it (see arm)
        except OSError as exc:
            log.error("quarantine: crashes while processing a descriptor go unrecorded: %s", exc)
        self._save()
        refused = self.describe(None, refused_only=True)
        if refused:
            log.warning("quarantine: refusing %s", "; ".join(refused))

    def _changed(self) -> None:
        """Under the lock, after the tables changed: the sets the hot paths read."""
        self._refused = self._strikes.refused(time.time())

    def _save(self) -> None:
        with self._lock:
            if self.directory is None:
                return
            data = json.dumps(self._strikes.as_json()).encode()
            try:
                _write_atomically(self.directory / _STORE, data)
            except OSError as exc:
                log.error("quarantine: could not save %s (%s): its strikes last only as long as this arbiter",
                          self.directory / _STORE, exc)

    # ---------------------------------------------------------------- the journal

    def begin(self, action: str, client, digest: bytes | None, *, ends_with_close: bool = True) -> Path | None:
        """Record that ``client`` starts ``action`` (on the module of SHA-256 ``digest``); :meth:`end`
        it when it ends.

        ``ends_with_close``: an orderly stop withdraws the record (the action did not end the
        arbiter). Returns the record, or None when nothing was written (off, or the write failed:
        the action goes on unrecorded).
        """
        if self.directory is None or self._closed:
            return None
        path = self.directory / f"{_RECORD}{os.getpid()}-{next(self._serial)}"
        try:
            _write_atomically(path, self._record_of(action, client, digest))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.error("quarantine: could not write %s (%s): actions go unrecorded until it can", path, exc)
            return None
        with self._lock:
            if not self._closed or not ends_with_close:
                self._pending[path] = ends_with_close
                return path
        path.unlink(missing_ok=True)  # closed meanwhile
        return None

    def _record_of(self, action: str, client, digest: bytes | None) -> bytes:
        """The JSON record, within _MAX_RECORD bytes (the name and command line cut shorter if need be:
        escaped, a character of theirs can take 12 bytes). It names the module by its canonical
        identity when :meth:`check_program` computed it (else by the SHA-256 of its bytes)."""
        if digest is not None:
            with self._lock:
                digest = self._identities.get(digest, digest)
        fields = {"arbiter": os.getpid(), "arbiter_start": self._started, "action": action, "since": time.time(),
                  "program": digest.hex() if digest else None, "share": getattr(client, "share", None)}
        identity = {"pid": client.pid, "uid": client.uid, "start": start_time(client.pid) or 0}
        text = _MAX_TEXT
        while True:
            record = json.dumps({**fields, "client": {**identity, "name": client.name[:text],
                                                      "cmdline": client.cmdline[:text]}}).encode()
            if len(record) <= _MAX_RECORD or not text:
                return record
            text //= 2

    def arm(self, client) -> None:
        """Make, in advance, the record of a crash while the engine handles ``client``'s descriptors,
        and hand it to the crash handler in emergency.c, which writes it only on a crash (writing is
        safe in a signal handler, making JSON is not). :meth:`disarm` withdraws it when the client goes."""
        if self.directory is None or self._closed:
            return
        try:
            _emergency.prepare(client.slot, self._record_of(DESCRIPTOR, client, None))
        except OSError as exc:
            log.warning("quarantine: could not prepare the crash record of %s (%s)", client.describe(), exc)

    def disarm(self, client) -> None:
        """Withdraw the record :meth:`arm` prepared for ``client`` (its slot's next client has its own)."""
        if self.directory is not None:
            _emergency.prepare(client.slot, b"")

    def end(self, record: Path | None) -> None:
        """The action of ``record`` (from :meth:`begin`) ended without ending the arbiter."""
        if record is None:
            return
        with self._lock:
            self._pending.pop(record, None)
        try:
            record.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("quarantine: could not remove %s (%s)", record, exc)

    @contextlib.contextmanager
    def risk(self, action: str, client, digest: bytes | None, unless: bool = False):
        """A record of ``action`` for the duration of the ``with`` block (none when ``unless``: no risk)."""
        record = None if unless else self.begin(action, client, digest)
        try:
            yield
        finally:
            self.end(record)

    def close(self) -> None:
        """An orderly stop: withdraw the records of actions that did not end the arbiter."""
        with self._lock:
            self._closed = True
            withdrawn = [path for path, ends in self._pending.items() if ends]
        for path in withdrawn:
            self.end(path)
        if self.directory is not None:  # what is still processed at an orderly stop did not end the arbiter
            _emergency.journal("")

    # ---------------------------------------------------------------- refusals

    def check_client(self, pid: int, uid: int, share: str | None = None, reattaching: bool = False) -> None:
        """Raise Quarantined when process ``pid`` (of ``uid``, through ``share``'s socket or, None, the
        arbiter's own) is refused, or its tenant is in a cooldown (the operator's uids get none: see
        strikes.py). A tenant's cooldown refuses new sessions only: one ``reattaching`` was admitted before, and its honest neighbours of the same
        tenant must not lose their sessions to another process's runaway (that process's own
        session is refused by :meth:`check_reattach`)."""
        pids, tenants, _ = self._refused
        tenant = tenant_of(uid, share)
        if pid in pids:
            with self._lock:
                entry = self._strikes.refused_client(f"{uid}:{pid}:{start_time(pid)}")
            if entry is not None:
                log.warning("refused pid %d (%s, uid %d): quarantined after %d strikes", pid,
                            printable(entry["name"]), uid, entry["strikes"])
                raise Quarantined(f"the arbiter refuses this process (pid {pid}): it brought the arbiter down "
                                  f"{entry['strikes']} times ({'; '.join(entry['reasons'])}), so it is quarantined; "
                                  f"an operator can lift that with `libshare-control clear_quarantine {pid}`, or "
                                  "start a new process")
        if tenant in tenants and not reattaching:
            now = time.time()
            with self._lock:
                entry = self._strikes.refused_tenant(tenant, now)
            if entry is not None:
                log.warning("refused pid %d (%s): its clients brought arbiters down %d times", pid, tenant,
                            entry["strikes"])
                raise Quarantined(f"the arbiter refuses every new client of {printable(tenant)} for "
                                  f"{entry['until'] - now:.0f} s more: its clients brought the arbiter down "
                                  f"{entry['strikes']} times ({'; '.join(entry['reasons'])}); a new process does not "
                                  f"change that, and each further refusal lasts twice as long; an operator can lift "
                                  f"it with `libshare-control clear_quarantine {printable(tenant)}`")

    def runaway_of(self, pid: int) -> str | None:
        """What process ``pid`` ran past the watchdog when it ended the last arbiter; None if it did not."""
        record = self._runaways.get(pid)
        if record is None or start_time(pid) != record["client"]["start"]:
            return None
        of = f" of program {record['program'][:16]}" if record["program"] else ""
        return f"its dispatch{of} ran past the watchdog and ended arbiter pid {record['arbiter']}"

    def check_reattach(self, pid: int) -> None:
        """Raise ClientTerminated when the session of process ``pid`` reattaches after its own dispatch
        ended the last arbiter (:meth:`runaway_of`): only that session is lost."""
        why = self.runaway_of(pid)
        if why is not None:
            log.warning("refused the reattach of pid %d: %s", pid, why)
            raise ClientTerminated(f"this session is terminated: {why}; a new session may connect unless the "
                                   "quarantine refuses it")

    def check_program(self, digest: bytes, client, spirv: bytes | None = None) -> None:
        """Raise Quarantined when the module ``spirv`` (of SHA-256 ``digest``) is refused to ``client``'s
        tenant, or to everyone. The first call for a digest computes the module's canonical identity
        (``spirv`` must be given then), which the journal names it by."""
        if self.directory is None:
            return
        canonical = self._canonical(digest, spirv)
        if canonical not in self._refused[2]:
            return
        tenant = tenant_of(client.uid, getattr(client, "share", None))
        with self._lock:
            found = self._strikes.refused_program(canonical.hex(), tenant)
        if found is None:
            return
        entry, everyone = found
        whom = "every client" if everyone else f"the clients of {printable(tenant)}"
        raise Quarantined(f"the arbiter refuses this program (identity {canonical.hex()}, SHA-256 {digest.hex()}) "
                          f"to {whom}: it brought the arbiter down {entry['strikes']} times "
                          f"({'; '.join(entry['reasons'])}), so it is quarantined; an operator can lift that with "
                          f"`libshare-control clear_quarantine {canonical.hex()[:16]}`")

    def _canonical(self, digest: bytes, spirv: bytes | None) -> bytes:
        """The canonical identity of the module of SHA-256 ``digest`` (computed from ``spirv`` once)."""
        with self._lock:
            found = self._identities.get(digest)
            if found is not None:
                self._identities.move_to_end(digest)
                return found
        if spirv is None:
            return digest
        canonical = canonical_digest(spirv)  # outside the lock: a child process, some milliseconds
        with self._lock:
            self._identities[digest] = canonical
            if len(self._identities) > _MAX_IDENTITIES:
                self._identities.popitem(last=False)
        return canonical

    # ---------------------------------------------------------------- the operator's view

    def describe(self, viewer_uid: int | None, refused_only: bool = False) -> list[str]:
        """One line per process, tenant and module with strikes (``refused_only``: those refused),
        oldest first. ``viewer_uid`` other than None, root or the arbiter's sees another uid's
        process by pid only, and another tenant without its reasons."""
        with self._lock:
            return self._strikes.describe(viewer_uid, refused_only, time.time())

    def clear(self, what: str) -> list[str]:
        """Lift the strikes of a client pid, of a tenant (``uid:UID``, ``share:GROUP``), of the modules
        whose identity starts with ``what`` (8 to 64 hex digits), or of everything (``all``); the
        lines describing what was cleared."""
        if self.directory is None:
            raise InvalidSubmission("this arbiter keeps no quarantine (it serves no pipe directory)")
        what = what.strip()
        everything = what.lower() == "all"
        pid = decimal(what, MAX_PID) or None
        kind, _, name = what.partition(":")
        tenant = what if (kind == "uid" and decimal(name, 1 << 32) is not None) or \
            (kind == "share" and share_field(name) and name) else None
        prefix = what.lower() if 8 <= len(what) <= 64 and all(c in "0123456789abcdef" for c in what.lower()) \
            else None
        if not (everything or pid or tenant or prefix):
            raise InvalidSubmission(f"clear_quarantine takes a client pid, uid:UID, share:GROUP, a program's "
                                    f"identity (8 to 64 hex digits) or all (got {printable(what[:80])!r})")
        with self._lock:
            cleared = self._strikes.clear(everything, pid, tenant, prefix)
            self._changed()
        if not cleared and not everything:
            raise InvalidSubmission(f"nothing in the quarantine matches {printable(what[:80])}")
        self._save()
        for line in cleared:
            log.warning("quarantine: %s by the operator", line)
        return cleared


# -------------------------------------------------------------------- files (hostile input)

def _own_directory(directory: Path) -> None:
    """Make ``directory`` (0700), or take an existing one: a real directory of this uid, not a link."""
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    status = os.lstat(directory)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        raise OSError(f"not a directory of uid {os.getuid()}; remove it")
    os.chmod(directory, 0o700)


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary name in its directory, then rename."""
    temporary = path.with_name(f"{_TEMPORARY}{path.name}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)  # small: one write (a record is some 300 bytes, the store at most a megabyte)
    finally:
        os.close(fd)
    os.rename(temporary, path)


def _read_bounded(path: Path, most: int) -> bytes | None:
    """The bytes of regular file ``path`` if it has at most ``most``; None if larger or not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, most + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > most:
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse(data: bytes | None):
    if data is None:
        raise ValueError("too large, or not a regular file")
    return json.loads(data)  # ValueError (JSONDecodeError, UnicodeDecodeError) or RecursionError


def _load(path: Path) -> Strikes:
    """The stored strikes; none if missing or unreadable (entries that are not as written are dropped)."""
    try:
        strikes = Strikes(_parse(_read_bounded(path, _MAX_STORE)))
    except FileNotFoundError:
        return Strikes()
    except (OSError, ValueError, RecursionError) as exc:
        log.error("quarantine: ignoring %s (%s): starting with no strikes", path, exc)
        return Strikes()
    if strikes.dropped:
        log.warning("quarantine: dropped %d malformed entries of %s", strikes.dropped, path)
    return strikes


def _sweep(directory: Path) -> list[dict]:
    """The records dead arbiters left in ``directory`` (each removed once read; a live arbiter's stay),
    and half-written files removed."""
    records, seen = [], 0
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        log.error("quarantine: cannot read %s (%s)", directory, exc)
        return []
    for entry in entries:
        if not entry.name.startswith((_RECORD, _TEMPORARY)):
            continue
        path = Path(entry.path)
        if entry.name.startswith(_RECORD) and seen < _MAX_RECORDS:
            seen += 1
            try:
                record = _record(_parse(_read_bounded(path, _MAX_RECORD)))
            except (OSError, ValueError, RecursionError) as exc:
                record, why = None, str(exc)
            else:
                why = "malformed"
            if record is None:
                log.warning("quarantine: ignoring journal record %s (%s)", entry.name, why)
            elif start_time(record["arbiter"]) == record["arbiter_start"]:
                continue  # its arbiter lives (one handing its clients over to this one): its action goes on
            else:
                records.append(record)
        try:
            path.unlink()
        except OSError as exc:
            log.warning("quarantine: could not remove %s (%s)", path, exc)
    return records


def _record(data) -> dict | None:
    """A journal record, checked; None if anything is off."""
    if not isinstance(data, dict) or data.get("action") not in ACTIONS or \
            not _int(data.get("arbiter"), 1, MAX_PID + 1) or not _int(data.get("arbiter_start"), 0, 1 << 63):
        return None
    client, program, since = _identity(data.get("client")), data.get("program"), data.get("since")
    if client is None or (program is not None and not _digest(program)) or not share_field(data.get("share")) or \
            not (type(since) in (int, float) and 0 <= since < 1e11):
        return None
    return {"arbiter": data["arbiter"], "arbiter_start": data["arbiter_start"], "action": data["action"],
            "client": client, "program": program, "since": since, "share": data.get("share")}


def _int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high
