"""The quarantine's strikes: whose they are, what they refuse, and their store (see quarantine.py).

Each journal record a dead arbiter left is one strike for up to three identities:

* the **process** (uid, pid and start time): at :data:`STRIKES` it is refused at hello, until
  it exits (a recycled pid has another start time);
* the **tenant**, the identity a fork cannot shed: the share socket the client came through
  (``share:GROUP``), else its uid (``uid:UID``). :data:`STRIKES` strikes within :data:`WINDOW`
  seconds refuse every new session of the tenant at hello for a cooldown: :data:`COOLDOWN`
  seconds the first time, twice the last one each time after (at most :data:`MAX_COOLDOWN`).
  Root's and the arbiter's own uid outside a share socket own the service and earn no tenant
  strikes: in a deployment of one uid a cooldown would refuse the operator's every new session
  (their processes and modules are still refused as anyone's);
* the **module**, by its canonical identity (``programs/identity.py``), counted per tenant: at
  :data:`STRIKES` strikes of one tenant the module is refused to that tenant; it is refused to
  everyone only once it crashed the arbiter (a compile; not a dispatch past the watchdog, whose
  length the client's inputs decide) for :data:`PROGRAM_TENANTS` distinct tenants.

A dead arbiter strikes each identity at most once (two clients compiling one module when it
died strike the module once, for the first one's tenant). The tables are plain dicts under the
quarantine's lock; the store is JSON, read back with a bound on every field (whoever shares
the arbiter's uid can write it).
"""

from __future__ import annotations

import logging
import time

from libshare._proc import MAX_PID
from libshare.protocol.control import printable
from libshare.protocol.wire import trusted_uid

__all__ = ["ACTIONS", "COMPILE", "COOLDOWN", "DESCRIPTOR", "MAX_COOLDOWN", "PROGRAM_TENANTS", "RUNAWAY", "STRIKES",
           "WINDOW", "Strikes", "digest", "identity", "share_field", "tenant_of"]

log = logging.getLogger("libshare.arbiter")

STRIKES = 2
"""Strikes after which a process, a tenant (within WINDOW) or a module (for one tenant) is refused."""
WINDOW = 3600.0
"""Seconds within which a tenant's STRIKES strikes start a cooldown."""
COOLDOWN = 600.0
"""Seconds a tenant is refused the first time; each later refusal lasts twice the one before."""
MAX_COOLDOWN = 7 * 86400.0
"""The longest cooldown."""
PROGRAM_TENANTS = 2
"""Distinct tenants a module must have crashed the arbiter for to be refused to everyone."""
COMPILE = "compile"
"""The journal's action: the arbiter's own compile of a module (pipeline creation)."""
RUNAWAY = "dispatch past the watchdog"
"""The journal's action: a dispatch the watchdog found past its limit (its length the client's inputs decide)."""
DESCRIPTOR = "descriptor being processed"
"""The journal's action (the crash handler's): the engine was handling the client's descriptor."""
ACTIONS = (COMPILE, RUNAWAY, DESCRIPTOR)
"""Every action a journal record may name."""

_MAX_CLIENTS = 256  # process identities kept
_MAX_TENANTS = 256  # tenants kept
_MAX_PROGRAMS = 1024  # modules kept
_MAX_PROGRAM_TENANTS = 16  # tenants kept per module
_MAX_REASONS = 4  # the latest reasons kept per entry
_MAX_TEXT = 200  # characters kept of a name, a command line or a reason
_MAX_SHARE = 64  # characters of a share socket's group


def tenant_of(uid: int, share: str | None) -> str:
    """The tenant of a client of ``uid`` that came through ``share``'s socket (None: the arbiter's own)."""
    return f"share:{share}" if share is not None else f"uid:{uid}"


class Strikes:
    """The three tables of strikes (not thread-safe: the quarantine holds its lock around every call)."""

    def __init__(self, data=None) -> None:
        self.clients: dict[str, dict] = {}  # by "uid:pid:start"
        self.tenants: dict[str, dict] = {}  # by tenant_of()
        self.programs: dict[str, dict] = {}  # by canonical hex digest
        self.dropped = 0
        """Malformed entries :meth:`load`\\ ed data had."""
        if data is not None:
            self._load(data)

    # ---------------------------------------------------------------- counting

    def count(self, records: list[dict]) -> None:
        """One strike per record for its process, tenant and module, each at most once per dead arbiter."""
        seen: set[tuple] = set()
        for record in records:
            arbiter, client, digest = record["arbiter"], record["client"], record["program"]
            tenant = tenant_of(client["uid"], record["share"])
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["since"]))
            by = f"client pid {client['pid']} of {tenant}"
            of = f" of program {digest[:16]}" if digest else ""
            if _once(seen, arbiter, f"{client['uid']}:{client['pid']}:{client['start']}"):
                entry = self._add(self.clients, f"{client['uid']}:{client['pid']}:{client['start']}",
                                  {**client, "share": record["share"]}, f"{record['action']}{of} "
                                  f"(arbiter pid {arbiter}, {when})")
                _logged(entry, f"client pid {client['pid']} ({printable(client['name'])}, {tenant})",
                        entry["strikes"] >= STRIKES)
            operator = record["share"] is None and trusted_uid(client["uid"])  # owns the service: no cooldown
            if not operator and _once(seen, arbiter, tenant):
                entry = self._add(self.tenants, tenant, {"tenant": tenant, "recent": [], "refusals": 0,
                                                         "until": 0.0, "cooldown": 0.0},
                                  f"{record['action']}{of} by client pid {client['pid']} (arbiter pid {arbiter}, "
                                  f"{when})")
                _logged(entry, printable(tenant), self._rate_limit(entry, record["since"]))
            if digest and _once(seen, arbiter, digest):
                entry = self._add(self.programs, digest, {"digest": digest, "tenants": {}},
                                  f"{record['action']} by {by} (arbiter pid {arbiter}, {when})")
                mine = entry["tenants"].setdefault(tenant, {"strikes": 0, "crashes": 0})
                mine["strikes"] += 1
                mine["crashes"] += record["action"] != RUNAWAY
                _trim(entry["tenants"], _MAX_PROGRAM_TENANTS, key=lambda t: entry["tenants"][t]["strikes"])
                _logged(entry, f"program {digest}", mine["strikes"] >= STRIKES or _everyone(entry),
                        f"{mine['strikes']} of {STRIKES} by {tenant}")
        _trim(self.clients, _MAX_CLIENTS)
        _trim(self.tenants, _MAX_TENANTS)
        _trim(self.programs, _MAX_PROGRAMS)

    @staticmethod
    def _add(table: dict, key: str, fields: dict, reason: str) -> dict:
        entry = table.setdefault(key, {**fields, "strikes": 0, "reasons": []})
        entry["strikes"] += 1
        entry["reasons"] = [*entry["reasons"], reason[:_MAX_TEXT]][-_MAX_REASONS:]
        entry["last"] = time.time()
        return entry

    @staticmethod
    def _rate_limit(entry: dict, since: float) -> bool:
        """Add a strike at ``since`` to a tenant's window; STRIKES there start a cooldown (True)."""
        entry["recent"] = [t for t in entry["recent"] if abs(since - t) < WINDOW][-STRIKES:] + [since]
        if len(entry["recent"]) < STRIKES:
            return False
        entry["cooldown"] = min(2 * entry["cooldown"], MAX_COOLDOWN) if entry["refusals"] else COOLDOWN
        entry["until"] = time.time() + entry["cooldown"]
        entry["refusals"] += 1
        entry["recent"] = []
        return True

    # ---------------------------------------------------------------- what is refused

    def refused_client(self, key: str) -> dict | None:
        """The entry of process ``key`` ("uid:pid:start") if it is refused."""
        entry = self.clients.get(key)
        return entry if entry is not None and entry["strikes"] >= STRIKES else None

    def refused_tenant(self, tenant: str, now: float) -> dict | None:
        """The entry of ``tenant`` if it is in a cooldown at ``now``."""
        entry = self.tenants.get(tenant)
        return entry if entry is not None and now < entry["until"] else None

    def refused_program(self, digest: str, tenant: str) -> tuple[dict, bool] | None:
        """(the entry, whether for everyone) if module ``digest`` is refused to ``tenant``."""
        entry = self.programs.get(digest)
        if entry is None:
            return None
        if _everyone(entry):
            return entry, True
        mine = entry["tenants"].get(tenant)
        return (entry, False) if mine is not None and mine["strikes"] >= STRIKES else None

    def refused(self, now: float) -> tuple[frozenset, frozenset, frozenset]:
        """What the hot paths check first, without the lock: (pids refused, tenants in a cooldown,
        digests refused to someone)."""
        return (frozenset(e["pid"] for e in self.clients.values() if e["strikes"] >= STRIKES),
                frozenset(t for t, e in self.tenants.items() if now < e["until"]),
                frozenset(bytes.fromhex(d) for d, e in self.programs.items()
                          if _everyone(e) or any(t["strikes"] >= STRIKES for t in e["tenants"].values())))

    # ---------------------------------------------------------------- the operator's view

    def describe(self, viewer_uid: int | None, refused_only: bool, now: float) -> list[str]:
        """See Quarantine.describe."""
        lines = []
        for entry in sorted(self.clients.values(), key=lambda e: e["last"]):
            if not refused_only or entry["strikes"] >= STRIKES:
                lines.append(_client_line(entry, viewer_uid))
        for entry in sorted(self.tenants.values(), key=lambda e: e["last"]):
            if not refused_only or now < entry["until"]:
                lines.append(_tenant_line(entry, viewer_uid, now))
        for entry in sorted(self.programs.values(), key=lambda e: e["last"]):
            refused_to = _refused_to(entry)
            if not refused_only or refused_to:
                lines.append(f"program {entry['digest']}: {_strikes(entry['strikes'], refused_to)}; "
                             f"{printable('; '.join(entry['reasons']))}")
        return lines

    def clear(self, everything: bool, pid: int | None, tenant: str | None, prefix: str | None) -> list[str]:
        """Forget the matching entries; a line for each."""
        cleared = []
        for key, entry in list(self.clients.items()):
            if everything or entry["pid"] == pid:
                del self.clients[key]
                cleared.append(f"cleared client pid {entry['pid']} ({_strikes(entry['strikes'], _refused(entry))})")
        for key, entry in list(self.tenants.items()):
            if everything or key == tenant:
                del self.tenants[key]
                cleared.append(f"cleared {key} ({_strikes(entry['strikes'], entry['until'] > time.time())})")
        for key, entry in list(self.programs.items()):
            if everything or (prefix and key.startswith(prefix)):
                del self.programs[key]
                cleared.append(f"cleared program {key} ({_strikes(entry['strikes'], _refused_to(entry))})")
        return cleared

    def forget_exited(self, start_time) -> None:
        """Drop the processes that have exited (``start_time(pid)`` is not theirs any more)."""
        for key, entry in list(self.clients.items()):
            if start_time(entry["pid"]) != entry["start"]:
                del self.clients[key]
                log.info("quarantine: forgetting client pid %d (%s, %d strike(s)): that process has exited",
                         entry["pid"], printable(entry["name"]), entry["strikes"])

    def as_json(self) -> dict:
        """What the store holds (version 2)."""
        return {"version": 2, "clients": list(self.clients.values()), "tenants": list(self.tenants.values()),
                "programs": list(self.programs.values())}

    # ---------------------------------------------------------------- the store (hostile input)

    def _load(self, data) -> None:
        """Take the entries of a parsed store that pass their checks; count the rest in ``dropped``."""
        if not isinstance(data, dict) or not all(isinstance(data.get(k, []), list)
                                                 for k in ("clients", "tenants", "programs")):
            raise ValueError("not a strikes store")
        for entry in data.get("clients", [])[:4 * _MAX_CLIENTS]:
            self._take(self.clients, _client(entry), lambda c: f"{c['uid']}:{c['pid']}:{c['start']}")
        for entry in data.get("tenants", [])[:4 * _MAX_TENANTS]:
            self._take(self.tenants, _tenant(entry), lambda t: t["tenant"])
        for entry in data.get("programs", [])[:4 * _MAX_PROGRAMS]:
            self._take(self.programs, _program(entry), lambda p: p["digest"])
        _trim(self.clients, _MAX_CLIENTS)
        _trim(self.tenants, _MAX_TENANTS)
        _trim(self.programs, _MAX_PROGRAMS)

    def _take(self, table: dict, entry: dict | None, key) -> None:
        if entry is None:
            self.dropped += 1
        else:
            table[key(entry)] = entry


def _once(seen: set, arbiter: int, key: str) -> bool:
    """Whether ``key`` is struck for the first time for this dead arbiter."""
    if (arbiter, key) in seen:
        return False
    seen.add((arbiter, key))
    return True


def _logged(entry: dict, who: str, refused: bool, count: str | None = None) -> None:
    log.log(logging.ERROR if refused else logging.WARNING,
            "quarantine: strike %s for %s: the arbiter died during its %s%s", count or
            f"{entry['strikes']} of {STRIKES}", who, printable(entry["reasons"][-1]),
            f"; {_what_refused(entry)} from now on (clear_quarantine lifts it)" if refused else "")


def _what_refused(entry: dict) -> str:
    if "tenants" in entry:
        return f"it is refused {_refused_to(entry)}"
    if "tenant" in entry:
        return f"its new processes are refused for {entry['cooldown']:.0f} s"
    return "it is refused"


def _everyone(entry: dict) -> bool:
    return sum(t["crashes"] > 0 for t in entry["tenants"].values()) >= PROGRAM_TENANTS


def _refused_to(entry: dict) -> str:
    """'to everyone', 'to uid:1000, share:g', or '' for a module's entry."""
    if _everyone(entry):
        return "to everyone"
    mine = [t for t, counted in entry["tenants"].items() if counted["strikes"] >= STRIKES]
    return f"to {', '.join(map(printable, mine))}" if mine else ""


def _refused(entry: dict) -> bool:
    return entry["strikes"] >= STRIKES


def _strikes(count: int, refused) -> str:
    text = f"{count} strike{'s' * (count != 1)}"
    return text + (f", refused {refused}" if isinstance(refused, str) and refused else ", refused" if
                   refused is True else "")


def _client_line(entry: dict, viewer_uid: int | None) -> str:
    head = f"client pid {entry['pid']}: {_strikes(entry['strikes'], _refused(entry))}"
    if viewer_uid is not None and not trusted_uid(viewer_uid) and viewer_uid != entry["uid"]:
        return f"{head} (another user's process)"
    share = f", share {printable(entry['share'])}" if entry.get("share") is not None else ""
    return (f"{head}; name {printable(entry['name'])}, uid {entry['uid']}{share}, command "
            f"{printable(entry['cmdline']) or '-'}; {printable('; '.join(entry['reasons']))}")


def _tenant_line(entry: dict, viewer_uid: int | None, now: float) -> str:
    tenant = entry["tenant"]
    cooling = now < entry["until"]
    head = (f"{printable(tenant)}: {_strikes(entry['strikes'], cooling)}"
            + (f" for {entry['until'] - now:.0f} s more (cooldown {entry['cooldown']:.0f} s, refusal "
               f"{entry['refusals']})" if cooling else ""))
    if viewer_uid is not None and not trusted_uid(viewer_uid) and tenant != f"uid:{viewer_uid}":
        return f"{head} (another tenant)"
    return f"{head}; {printable('; '.join(entry['reasons']))}"


def _trim(table: dict, most: int, key=None) -> None:
    """Keep the ``most`` entries with the latest strikes (or the highest ``key``)."""
    if len(table) > most:
        for gone in sorted(table, key=key or (lambda k: table[k]["last"]))[:len(table) - most]:
            del table[gone]


def _client(data) -> dict | None:
    client, counted = identity(data), _counted(data)
    share = data.get("share") if isinstance(data, dict) else None
    if client is None or counted is None or not share_field(share):
        return None
    return {**client, "share": share, **counted}


def _tenant(data) -> dict | None:
    counted = _counted(data)
    if counted is None or not isinstance(data.get("tenant"), str) or not _tenant_name(data["tenant"]):
        return None
    recent, refusals = data.get("recent"), data.get("refusals")
    if not isinstance(recent, list) or not all(_number(t) for t in recent[:STRIKES]) or \
            not _int(refusals, 0, 1 << 20) or not _number(data.get("until")) or \
            not (_number(data.get("cooldown")) and data["cooldown"] <= MAX_COOLDOWN):
        return None
    return {"tenant": data["tenant"], "recent": recent[:STRIKES], "refusals": refusals, "until": data["until"],
            "cooldown": data["cooldown"], **counted}


def _program(data) -> dict | None:
    counted = _counted(data)
    tenants = data.get("tenants") if counted is not None else None
    if not isinstance(tenants, dict) or len(tenants) > _MAX_PROGRAM_TENANTS or not digest(data.get("digest")):
        return None
    for tenant, mine in tenants.items():
        if not _tenant_name(tenant) or not isinstance(mine, dict) or not _int(mine.get("strikes"), 1, 1 << 20) or \
                not _int(mine.get("crashes"), 0, mine["strikes"] + 1):
            return None
    return {"digest": data["digest"], "tenants": {t: {"strikes": m["strikes"], "crashes": m["crashes"]}
                                                  for t, m in tenants.items()}, **counted}


def identity(data) -> dict | None:
    """A process identity (pid, uid, start, name, cmdline) read from hostile JSON; None if anything is off."""
    if not isinstance(data, dict) or not _int(data.get("pid"), 1, MAX_PID + 1) or \
            not _int(data.get("uid"), 0, 1 << 32) or not _int(data.get("start"), 0, 1 << 63):
        return None
    name, cmdline = data.get("name"), data.get("cmdline")
    if not isinstance(name, str) or not isinstance(cmdline, str):
        return None
    return {"pid": data["pid"], "uid": data["uid"], "start": data["start"], "name": name[:_MAX_TEXT],
            "cmdline": cmdline[:_MAX_TEXT]}


def _counted(data) -> dict | None:
    if not isinstance(data, dict):
        return None
    strikes, reasons, last = data.get("strikes"), data.get("reasons"), data.get("last")
    if not _int(strikes, 1, 1 << 20) or not isinstance(reasons, list) or not _number(last):
        return None
    if not all(isinstance(r, str) for r in reasons):
        return None
    return {"strikes": strikes, "reasons": [r[:_MAX_TEXT] for r in reasons[-_MAX_REASONS:]], "last": last}


def share_field(value) -> bool:
    """Whether ``value`` is a share socket's group as a record or the store holds it: None (the
    arbiter's own socket) or a name of at most 64 characters."""
    return value is None or (isinstance(value, str) and 0 < len(value) <= _MAX_SHARE)


def _tenant_name(value: str) -> bool:
    kind, _, name = value.partition(":")
    return (kind == "uid" and name.isdigit() and len(name) <= 10) or (kind == "share" and share_field(name))


def _int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _number(value) -> bool:
    return type(value) in (int, float) and 0 <= value < 1e11


def digest(value) -> bool:
    """Whether ``value`` is a SHA-256 in lowercase hex."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
