"""Quarantine: a client process, or a SPIR-V module, that brought the arbiter down twice is refused.

Containment (containment.py) keeps a client's faults to that client while the arbiter
lives. Some actions can end the arbiter itself: the driver's compiler crashing inside it
on a module the vetting child compiled fine (``libshare/arbiter/programs/compiler.py``: a
crash that depends on timing or memory), or a dispatch that never ends, which on a driver
that cannot abort it leaves the arbiter no way out but to exit (EXIT_UNRECOVERABLE). A supervisor restarts it; without
a memory of who did it, the same tenant could bring it down again and again, and every
other client would lose its work each time. So the arbiter keeps that memory in its pipe
directory, where the next arbiter on the same directory finds it, whoever starts that one.

**The journal.** Before an action that could end the process, the arbiter writes a small
record into ``quarantine/`` (a temporary name, then ``rename``: a record is whole or absent)
naming the client (pid, uid, and the process's start time from ``/proc/PID/stat``, so that
a recycled pid is never blamed; its name and command line for the log), the action and the
module's SHA-256; it removes the record when the action ends. Records are few and cheap (a
file created and renamed, later unlinked; no ``fsync``: they must outlive the process, not
the machine, and a reboot ends every client anyway):

* one per compile the arbiter runs itself (``Requests._load_program`` in ``serve/requests.py``:
  pipeline creation, only when no pipeline of that module exists yet). The vetting compile
  runs in a child process, whose crash refuses the module without harming the arbiter, so
  it writes none;
* one when the watchdog finds a dispatch past its limit, removed once that work has ended.
  When it never ends, the arbiter gives the device up and exits with the record in place. A
  submission that several clients shared (SUSPECT in ``ps``) blames nobody: which of their
  dispatches ran cannot be told, and blaming all would let a runaway quarantine its
  neighbours. The module is blamed only when that client's dispatches in the submission all
  ran one program (the engine says which: the SUSPECT event).

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

**Strikes.** At start, before it listens, an arbiter reads the records a dead one left (a
record names its arbiter by pid and start time: those of an arbiter still alive, one handing
its clients over to this one, stay where they are): each
is one strike for its client identity and one for its module (at most one of each per dead
arbiter: two clients compiling one module at the crash strike it once), logged to
server.log, added to ``quarantine/strikes.json`` (written whole, then renamed), and removed.
At :data:`STRIKES` strikes a client process is refused at hello, and a module at
``load_program`` whoever sends it, with :class:`~libshare.errors.Quarantined`, whose message
says what happened, how often, and how an operator lifts it (``clear_quarantine``). ``ps``
lists what is refused, ``get_quarantine`` every strike. A process that has exited is
forgotten at the next start (its identity can never connect again); the store keeps at most
:data:`_MAX_CLIENTS` processes and :data:`_MAX_PROGRAMS` modules, the oldest strikes going
first.

**Hostile input.** The directory belongs to the arbiter's uid (0700, inside the pipe
directory), but any process of that uid can write it, clients included. So the store and
the records are read with bounds (size, count, each field's type and range), a file that is
not a regular file is not followed, and whatever does not parse is logged and dropped: the
quarantine then starts empty, and the arbiter starts regardless. The worst a writer of that
directory can do is to quarantine processes or modules of its own uid, which it could
equally hurt by other means, or to clear strikes, which costs at most two more crashes.

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
from pathlib import Path

from libshare.protocol.control import decimal, printable
from libshare._proc import MAX_PID, start_time
from libshare.protocol.wire import trusted_uid
from libshare.arbiter.drain import emergency as _emergency
from libshare.errors import InvalidSubmission, Quarantined

__all__ = ["COMPILE", "DESCRIPTOR", "RUNAWAY", "STRIKES", "Quarantine"]

log = logging.getLogger("libshare.arbiter")

STRIKES = 2
"""Deaths of the arbiter during a process's (or a module's) actions after which it is refused."""
COMPILE = "compile"
RUNAWAY = "dispatch past the watchdog"
DESCRIPTOR = "descriptor being processed"
_ACTIONS = (COMPILE, RUNAWAY, DESCRIPTOR)

_DIRECTORY = "quarantine"  # inside the pipe directory
_STORE = "strikes.json"
_RECORD = "action-"  # a journal record: action-ARBITERPID-SERIAL
_TEMPORARY = ".tmp-"  # a record or store being written
_MAX_RECORD = _emergency.RECORD_BYTES  # bytes of one record (read; held for the crash handler)
_MAX_RECORDS = 1024  # records read at start; more are removed unread
_MAX_STORE = 1 << 20  # bytes read of the store
_MAX_CLIENTS = 256  # process identities kept
_MAX_PROGRAMS = 1024  # modules kept
_MAX_REASONS = 4  # the latest reasons kept per entry
_MAX_TEXT = 200  # characters kept of a name, a command line or a reason


class Quarantine:
    """The journal of risky actions and the strikes, in a pipe directory (thread-safe).

    Off (every method a no-op) until :meth:`open`, which a daemon arbiter calls before it serves.
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        """``quarantine/`` in the pipe directory; None while off."""
        self._lock = threading.Lock()
        self._clients: dict[str, dict] = {}  # by "uid:pid:start"
        self._programs: dict[str, dict] = {}  # by hex digest
        self._refused_pids: frozenset[int] = frozenset()  # read without the lock: the common hello
        self._refused_programs: frozenset[bytes] = frozenset()
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
            clients, programs = _load(directory / _STORE)
            with self._lock:
                self._clients, self._programs = clients, programs
                changed = self._strike(_sweep(directory))
                changed |= self._forget_exited()
                self._changed()
        except Exception:  # a case the checks missed: the arbiter starts all the same
            log.exception("quarantine off: reading %s failed", directory)
            with self._lock:
                self._clients, self._programs = {}, {}
                self._changed()
            return
        self.directory = directory
        try:
            _emergency.journal(str(directory))  # a crash in a client's descriptor names it (see arm)
        except OSError as exc:
            log.error("quarantine: crashes while processing a descriptor go unrecorded: %s", exc)
        if changed:
            self._save()
        refused = self.describe(None, refused_only=True)
        if refused:
            log.warning("quarantine: refusing %s", "; ".join(refused))

    def _strike(self, records: list[dict]) -> bool:
        """One strike per record for its client and its module, at most one of each per dead arbiter."""
        seen: set[tuple] = set()
        for record in records:
            arbiter, client, digest = record["arbiter"], record["client"], record["program"]
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["since"]))
            key = f"{client['uid']}:{client['pid']}:{client['start']}"
            if (arbiter, key) not in seen:
                seen.add((arbiter, key))
                of = f" of program {digest[:16]}" if digest else ""
                self._add(self._clients, key, client, f"{record['action']}{of} (arbiter pid {arbiter}, {when})",
                          f"client pid {client['pid']} ({printable(client['name'])}, uid {client['uid']})")
            if digest and (arbiter, digest) not in seen:
                seen.add((arbiter, digest))
                self._add(self._programs, digest, {"digest": digest},
                          f"{record['action']} by client pid {client['pid']} (arbiter pid {arbiter}, {when})",
                          f"program {digest}")
        return bool(records)

    def _add(self, table: dict, key: str, fields: dict, reason: str, who: str) -> None:
        entry = table.setdefault(key, {**fields, "strikes": 0, "reasons": []})
        entry["strikes"] += 1
        entry["reasons"] = [*entry["reasons"], reason[:_MAX_TEXT]][-_MAX_REASONS:]
        entry["last"] = time.time()
        level = logging.ERROR if entry["strikes"] >= STRIKES else logging.WARNING
        log.log(level, "quarantine: strike %d of %d for %s: the arbiter died during its %s%s", entry["strikes"],
                STRIKES, who, printable(reason),
                "; it is refused from now on (clear_quarantine lifts it)" if entry["strikes"] >= STRIKES else "")
        _trim(table, _MAX_CLIENTS if table is self._clients else _MAX_PROGRAMS)

    def _forget_exited(self) -> bool:
        """Drop the identities of processes that have exited (a recycled pid has another start time)."""
        gone = [key for key, entry in self._clients.items() if start_time(entry["pid"]) != entry["start"]]
        for key in gone:
            entry = self._clients.pop(key)
            log.info("quarantine: forgetting client pid %d (%s, %d strike(s)): that process has exited",
                     entry["pid"], printable(entry["name"]), entry["strikes"])
        return bool(gone)

    def _changed(self) -> None:
        """Under the lock, after the tables changed: the sets the hot paths read."""
        self._refused_pids = frozenset(e["pid"] for e in self._clients.values() if e["strikes"] >= STRIKES)
        self._refused_programs = frozenset(bytes.fromhex(d) for d, e in self._programs.items()
                                           if e["strikes"] >= STRIKES)

    def _save(self) -> None:
        with self._lock:
            if self.directory is None:
                return
            data = json.dumps({"version": 1, "clients": list(self._clients.values()),
                               "programs": list(self._programs.values())}).encode()
            try:
                _write_atomically(self.directory / _STORE, data)
            except OSError as exc:
                log.error("quarantine: could not save %s (%s): its strikes last only as long as this arbiter",
                          self.directory / _STORE, exc)

    # ---------------------------------------------------------------- the journal

    def begin(self, action: str, client, digest: bytes | None, *, ends_with_close: bool = True) -> Path | None:
        """Record that ``client`` starts ``action`` (on module ``digest``); :meth:`end` it when it ends.

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
        escaped, a character of theirs can take 12 bytes)."""
        fields = {"arbiter": os.getpid(), "arbiter_start": self._started, "action": action, "since": time.time(),
                  "program": digest.hex() if digest else None}
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

    def check_client(self, pid: int, uid: int) -> None:
        """Raise Quarantined when process ``pid`` (of ``uid``) is refused."""
        if pid not in self._refused_pids:
            return
        start = start_time(pid)
        with self._lock:
            entry = self._clients.get(f"{uid}:{pid}:{start}")
        if entry is None or entry["strikes"] < STRIKES:
            return
        log.warning("refused pid %d (%s, uid %d): quarantined after %d strikes", pid, printable(entry["name"]),
                    uid, entry["strikes"])
        raise Quarantined(f"the arbiter refuses this process (pid {pid}): it brought the arbiter down "
                          f"{entry['strikes']} times ({'; '.join(entry['reasons'])}), so it is quarantined; an "
                          f"operator can lift that with `libshare-control clear_quarantine {pid}`, or start a "
                          "new process")

    def check_program(self, digest: bytes) -> None:
        """Raise Quarantined when the module of SHA-256 ``digest`` is refused."""
        if digest not in self._refused_programs:
            return
        with self._lock:
            entry = self._programs.get(digest.hex())
        if entry is None:
            return
        raise Quarantined(f"the arbiter refuses this program (SHA-256 {digest.hex()}) for every client: it "
                          f"brought the arbiter down {entry['strikes']} times ({'; '.join(entry['reasons'])}), "
                          f"so it is quarantined; an operator can lift that with `libshare-control "
                          f"clear_quarantine {digest.hex()[:16]}`")

    # ---------------------------------------------------------------- the operator's view

    def describe(self, viewer_uid: int | None, refused_only: bool = False) -> list[str]:
        """One line per process and module with strikes (``refused_only``: those refused), oldest first.
        ``viewer_uid`` other than None, root or the arbiter's sees another uid's process by pid only."""
        with self._lock:
            clients = sorted(self._clients.values(), key=lambda e: e["last"])
            programs = sorted(self._programs.values(), key=lambda e: e["last"])
        lines = []
        for entry in clients:
            if refused_only and entry["strikes"] < STRIKES:
                continue
            head = f"client pid {entry['pid']}: {_strikes(entry)}"
            if viewer_uid is not None and not trusted_uid(viewer_uid) and viewer_uid != entry["uid"]:
                lines.append(f"{head} (another user's process)")
                continue
            lines.append(f"{head}; name {printable(entry['name'])}, uid {entry['uid']}, command "
                         f"{printable(entry['cmdline']) or '-'}; {printable('; '.join(entry['reasons']))}")
        for entry in programs:
            if not refused_only or entry["strikes"] >= STRIKES:
                lines.append(f"program {entry['digest']}: {_strikes(entry)}; "
                             f"{printable('; '.join(entry['reasons']))}")
        return lines

    def clear(self, what: str) -> list[str]:
        """Lift the strikes of a client pid, of the modules whose digest starts with ``what`` (8 to 64
        hex digits), or of everything (``all``); the lines describing what was cleared."""
        if self.directory is None:
            raise InvalidSubmission("this arbiter keeps no quarantine (it serves no pipe directory)")
        what = what.strip().lower()
        everything = what == "all"
        pid = decimal(what, MAX_PID) or None
        prefix = what if 8 <= len(what) <= 64 and all(c in "0123456789abcdef" for c in what) else None
        if not (everything or pid or prefix):
            raise InvalidSubmission(f"clear_quarantine takes a client pid, a program's SHA-256 (8 to 64 hex "
                                    f"digits) or all (got {printable(what[:80])!r})")
        cleared = []
        with self._lock:
            for key, entry in list(self._clients.items()):
                if everything or entry["pid"] == pid:
                    del self._clients[key]
                    cleared.append(f"cleared client pid {entry['pid']} ({_strikes(entry)})")
            for key, entry in list(self._programs.items()):
                if everything or (prefix and key.startswith(prefix)):
                    del self._programs[key]
                    cleared.append(f"cleared program {key} ({_strikes(entry)})")
            self._changed()
        if not cleared and what != "all":
            raise InvalidSubmission(f"nothing in the quarantine matches {what}")
        self._save()
        for line in cleared:
            log.warning("quarantine: %s by the operator", line)
        return cleared


def _strikes(entry: dict) -> str:
    count = entry["strikes"]
    return f"{count} strike{'s' * (count != 1)}" + (", refused" if count >= STRIKES else "")


def _trim(table: dict, most: int) -> None:
    """Keep the ``most`` entries with the latest strikes."""
    if len(table) > most:
        for key in sorted(table, key=lambda k: table[k]["last"])[:len(table) - most]:
            del table[key]


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


def _load(path: Path) -> tuple[dict, dict]:
    """The stored strikes: (clients by identity, programs by digest); empty if missing or unreadable."""
    try:
        data = _parse(_read_bounded(path, _MAX_STORE))
        if not isinstance(data, dict) or not isinstance(data.get("clients"), list) or \
                not isinstance(data.get("programs"), list):
            raise ValueError("not a strikes store")
    except FileNotFoundError:
        return {}, {}
    except (OSError, ValueError, RecursionError) as exc:
        log.error("quarantine: ignoring %s (%s): starting with no strikes", path, exc)
        return {}, {}
    clients, programs, dropped = {}, {}, 0
    for entry in data["clients"][:4 * _MAX_CLIENTS]:
        client = _identity(entry)
        counted = client and _counted(entry)
        if counted:
            clients[f"{client['uid']}:{client['pid']}:{client['start']}"] = {**client, **counted}
        dropped += not counted
    for entry in data["programs"][:4 * _MAX_PROGRAMS]:
        digest = entry.get("digest") if isinstance(entry, dict) else None
        counted = _digest(digest) and _counted(entry)
        if counted:
            programs[digest] = {"digest": digest, **counted}
        dropped += not counted
    if dropped:
        log.warning("quarantine: dropped %d malformed entries of %s", dropped, path)
    _trim(clients, _MAX_CLIENTS)
    _trim(programs, _MAX_PROGRAMS)
    return clients, programs


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
    if not isinstance(data, dict) or data.get("action") not in _ACTIONS or \
            not _int(data.get("arbiter"), 1, MAX_PID + 1) or not _int(data.get("arbiter_start"), 0, 1 << 63):
        return None
    client, program, since = _identity(data.get("client")), data.get("program"), data.get("since")
    if client is None or (program is not None and not _digest(program)) or not _number(since):
        return None
    return {"arbiter": data["arbiter"], "arbiter_start": data["arbiter_start"], "action": data["action"],
            "client": client, "program": program, "since": since}


def _identity(data) -> dict | None:
    if not isinstance(data, dict) or not _int(data.get("pid"), 1, MAX_PID + 1) or \
            not _int(data.get("uid"), 0, 1 << 32) or not _int(data.get("start"), 0, 1 << 63):
        return None
    name, cmdline = data.get("name"), data.get("cmdline")
    if not isinstance(name, str) or not isinstance(cmdline, str):
        return None
    return {"pid": data["pid"], "uid": data["uid"], "start": data["start"], "name": name[:_MAX_TEXT],
            "cmdline": cmdline[:_MAX_TEXT]}


def _counted(data: dict) -> dict | None:
    strikes, reasons, last = data.get("strikes"), data.get("reasons"), data.get("last")
    if not _int(strikes, 1, 1 << 20) or not isinstance(reasons, list) or not _number(last):
        return None
    if not all(isinstance(r, str) for r in reasons):
        return None
    return {"strikes": strikes, "reasons": [r[:_MAX_TEXT] for r in reasons[-_MAX_REASONS:]], "last": last}


def _int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _number(value) -> bool:
    return type(value) in (int, float) and 0 <= value < 1e11


def _digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
