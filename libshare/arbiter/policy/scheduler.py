"""Who drains next, and how much: priorities, fair share of device time, compute-share ceilings.

While clients differ (priorities, compute shares, fairshare), the native engine asks
:meth:`Scheduler.plan`, on its own thread, once per pass for an ordered list of
(client, budget) and pops at most ``budget`` descriptors from each; a client left
out is simply not popped this pass, and its descriptors wait in its ring. Before
each plan, :meth:`Scheduler.charge_many` books the device time the engine measured
for the commands retired since (timestamp queries; without timestamps each command
counts as ``_UNTIMED_NS``). When every client is alike the engine drains all of
them without asking (the common case never takes the GIL). The policy, in order:

1. **Priority.** Clients drain in priority order (realtime, high, normal, low).
   While a client of a higher priority is active (it submitted within the last
   ``_ACTIVE_NS``), all lower-priority clients together get one command per pass,
   and only when nothing else is in flight, taking turns, and a long dispatch
   among them runs in pieces of about ``_CUT_NS`` of device time (a :class:`Turn`'s
   ``cut_ns``; engine_policy.c, "Pieces"), so a realtime dispatch waits behind at most one
   lower piece on a single-queue device such as lavapipe. (A slice of estimated
   device time was gamed: the estimate comes from the client's own past commands,
   and after 300 tiny ones 65 heavy ones fit in one slice, a realtime client
   waiting 520 ms; capped at 8 commands, 8 heavy ones of 7.6 s each made it wait
   53.8 s.) While the higher priority is connected but not
   active, a lower client's pass holds at most ``_IDLE_SLICE_NS`` of estimated device
   time and ``_IDLE_SLICE_COMMANDS`` commands, so that what runs when the higher one
   comes back ends soon: with all it had in one submission, a realtime client that
   came every 0.3 s waited 382-416 ms (p50) behind a low client's batch, 9.9 ms now.
   (At most 8 commands, a pipelining low client went from 450k to 160k dispatches a
   second beside an idle realtime one; at 64, 330k-610k.)
   The engine submits each priority of a pass separately, and the lower work popped
   with a higher priority's only once that has ended (engine_policy.c, "Policy"), so a
   higher priority's completion never waits for lower work.
2. **Compute share** (the active-thread-percentage analogue). A client, or a
   group, whose recent share of device time exceeds its ceiling is not drained
   while any other client wants the device. The device never idles while work
   waits, though: when every waiting client is at its ceiling at once (ceilings
   that add up to 100% all meet it together) and nothing runs, the one least
   over its ceiling gets a slice.
3. **Fair share** (mode ``fairshare``). Within a priority, the client with the
   least device time per unit of weight drains first and gets one slice; a client
   ahead of it by more than two slices waits while anything runs on the device
   (it goes after it on an idle device: a client whose work takes no device time,
   fences or refused descriptors, is always the least served and must not hold
   the device idle), and no waiting client trails the most served of its
   priority by more than ``_LAG_NS`` (a newcomer does not catch up the whole
   history of the others). In ``throughput`` mode every client gets all it has,
   in turn.

"Recent" device time decays with a time constant of ``_DECAY_NS``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

# The priorities and modes, and the checks of a priority, a mode and a compute share, are the
# settings table's (libshare/settings.py): the CLI, the configuration file and a client check them too.
from libshare.settings import MODES, PRIORITIES, UNSCHEDULED, mode_name, percentage, priority_name  # noqa: F401

_RANK = {name: rank for rank, name in enumerate(PRIORITIES)}
_ACTIVE_NS = 200_000_000  # a client that submitted this recently still counts as wanting the device
_SLICE_NS = 200_000  # device time a slice of fairshare (or compute-share) work may take
_SLICE_COMMANDS = 8  # ... in at most this many commands: see _slice
_IDLE_SLICE_NS, _IDLE_SLICE_COMMANDS = 1_000_000, 64  # a lower client's pass while a higher one is idle
_DECAY_NS = 250_000_000  # time constant of "recent" device time
_LAG_NS = 50_000_000  # fairshare: the most device time a waiting client may trail the most served by
_DECAY_STEP_NS = 2_000_000  # decay at most this often
_UNTIMED_NS = 50_000  # cost booked for a command when the arbiter runs without timestamps
_CUT_NS = 50_000  # a lower command taken while a higher priority is active runs in pieces of about this much
_CUT_MAX_NS = 10_000_000_000  # ... or of the top priority's own commands' length (_cut_ns), at most this


class Turn(NamedTuple):
    """One client's turn in a drain pass: pop at most ``budget`` of its descriptors. With ``cut_ns``,
    the turn takes one, and a dispatch estimated at over 1.5 times ``cut_ns`` (by the client's worst
    device time per workgroup so far) runs in pieces of about ``cut_ns`` each (engine_policy.c, "Pieces")."""

    client: object
    budget: int
    cut_ns: int = 0


def outranks(priority: str | None, other: str) -> bool:
    """True when ``priority`` (a name, or None for none) drains before ``other``."""
    return priority is not None and _RANK[priority] > _RANK[other]


@dataclass
class Usage:
    """One client's scheduling state."""

    share: int = 100  # ceiling on its recent fraction of device time, percent
    weight: float = 1.0  # fairshare weight
    recent_ns: float = 0.0  # decayed device time
    queued_ns: float = 0.0  # estimated device time of its popped commands not yet retired
    total_ns: float = 0.0  # device time ever, divided by weight (fairshare's virtual time)
    per_command_ns: float = float(_UNTIMED_NS)  # running estimate, for slicing
    last_submit_ns: int = 0
    own_share: bool = False  # set for this client alone (set_active_thread_percentage): defaults pass it by


@dataclass
class Scheduler:
    """The drain policy; owned by the control thread (commands change it through drain tasks)."""

    mode: str = "throughput"
    max_in_flight: int = 2
    plan_for: float = 0.001
    """Seconds a plan holds while the same clients wait (the engine asks again at once when that changes)."""
    """Submissions on the device at once: more work waits in the rings for a larger batch, and a
    higher priority's next submission waits behind at most this many."""
    default_share: int = 100
    default_priority: str = "normal"
    group_share: dict[str, int] = field(default_factory=dict)
    group_priority: dict[str, str] = field(default_factory=dict)
    _usage: dict[int, Usage] = field(default_factory=dict)
    _last_decay_ns: int = field(default_factory=time.monotonic_ns)

    # ---------------------------------------------------------------- clients

    def usage(self, client) -> Usage:
        """The scheduling state of ``client`` (created with the defaults on first use)."""
        found = self._usage.get(client.id)
        if found is None:
            found = self._usage[client.id] = Usage(share=min(self.default_share, client.requested_share))
        return found

    def follow_defaults(self, clients) -> None:
        """Give the running clients that took the default priority or share the defaults now in
        force (a reload of the configuration file; the commands alone change them for new clients).
        A client that is not trusted (another uid than root and the arbiter's, or any client of a
        share socket) and asked for a priority above the new default is lowered to it too: it may
        ask only for the default or lower (serve/hello.py), and one that asked for the old default
        kept it above every client that followed the new one."""
        for client in clients:
            asked_above = (not client.operator_priority and not client.trusted
                           and outranks(client.priority, self.default_priority))
            if not client.own_priority or asked_above:
                client.priority = self.default_priority
            usage = self._usage.get(client.id)
            if usage is not None and not usage.own_share:
                usage.share = min(self.default_share, client.requested_share)

    def forget(self, client) -> None:
        """Drop a reclaimed client's state."""
        self._usage.pop(client.id, None)

    def priority_of(self, client) -> str:
        """The client's priority, or its group's when the group has one."""
        return self.group_priority.get(client.group, client.priority) if client.group else client.priority

    def rank(self, client) -> int:
        """The client's priority as a number; higher drains first."""
        return _RANK[self.priority_of(client)]

    def share_of(self, client) -> int:
        """The client's own ceiling, lowered by its group's."""
        own = self.usage(client).share
        return min(own, self.group_share.get(client.group, 100)) if client.group else own

    # ---------------------------------------------------------------- accounting

    def charge(self, client, ns: int) -> None:
        """Book ``ns`` of device time (0: unmeasured) for one retired command of ``client``."""
        usage = self.usage(client)
        ns = ns or _UNTIMED_NS
        usage.queued_ns = max(usage.queued_ns - usage.per_command_ns, 0.0)
        usage.recent_ns += ns
        usage.total_ns += ns / usage.weight
        usage.per_command_ns += (ns - usage.per_command_ns) / 8

    def charge_many(self, client, total_ns: int, count: int) -> None:
        """Book ``count`` retired commands of ``client`` that took ``total_ns`` together (0: unmeasured),
        as ``count`` calls of :meth:`charge` with their mean would."""
        usage = self.usage(client)
        total_ns = total_ns or count * _UNTIMED_NS
        mean = total_ns / count
        usage.queued_ns = max(usage.queued_ns - count * usage.per_command_ns, 0.0)
        usage.recent_ns += total_ns
        usage.total_ns += total_ns / usage.weight
        usage.per_command_ns = mean + (usage.per_command_ns - mean) * (7 / 8) ** min(count, 64)

    def _decay(self, now_ns: int) -> None:
        factor = math.exp(-(now_ns - self._last_decay_ns) / _DECAY_NS)
        self._last_decay_ns = now_ns
        for usage in self._usage.values():
            usage.recent_ns *= factor

    # ---------------------------------------------------------------- planning

    def plan(self, clients: list, pending: dict[int, bool], busy: dict[int, bool], in_flight: int,
             max_budget: int) -> list[Turn]:
        """Ordered turns for one drain pass.

        ``pending[id]``: descriptors wait in the client's ring; ``busy[id]``: it has work
        waiting or on the device; ``in_flight``: submissions on the device now;
        ``max_budget``: the most one pass pops per client.
        """
        waiting = [c for c in clients if pending.get(c.id)]
        if not waiting or self.mode == UNSCHEDULED:
            return [Turn(c, max_budget) for c in waiting]
        if len(clients) == 1:  # a sole client: no one to yield to, but a newcomer waits one slice at most
            return [Turn(waiting[0], self._slice(waiting[0]) if self.mode == "fairshare" else max_budget)]
        if self.mode == "throughput" and self._all_alike(clients):
            return [Turn(c, max_budget) for c in waiting]  # the common case: nothing to arbitrate
        now = time.monotonic_ns()
        if now - self._last_decay_ns > _DECAY_STEP_NS:
            self._decay(now)
        ranks = {c.id: _RANK[self.priority_of(c)] for c in clients}
        top = max(ranks[c.id] for c in clients
                  if busy.get(c.id) or now - self.usage(c).last_submit_ns < _ACTIVE_NS)
        highest = max(ranks.values())  # of the clients connected, active or not
        if self.mode == "throughput" and all(ranks[c.id] == top == highest for c in waiting) and not self._any_share():
            return [Turn(c, max_budget) for c in waiting]  # the waiting clients are alike
        total_recent = sum(self.usage(c).recent_ns + self.usage(c).queued_ns for c in clients) or 1.0
        least_served = self._least_served([c for c in waiting if ranks[c.id] == top]) if self.mode == "fairshare" else 0
        plan, held = [], []
        lower_left = 0 if in_flight else 1  # lower-priority commands this pass may still take
        for client in sorted(waiting, key=self._order_key):
            headroom = self._headroom(client, clients, busy, total_recent)
            if headroom is not None and headroom <= 0:
                held.append((headroom, client))
                continue  # at its compute share while others want the device
            cut_ns = 0
            if ranks[client.id] < top:  # a higher priority is active: one command in all, cut in pieces
                if not lower_left:
                    continue
                budget, lower_left, cut_ns = 1, 0, self._cut_ns(clients, ranks, top)
            elif self.mode == "fairshare":
                ahead = self.usage(client).total_ns > least_served + 2 * _SLICE_NS
                if in_flight >= self.max_in_flight or (ahead and in_flight):
                    continue  # ahead of the least-served waiting client: let it catch up (on an idle device, after it)
                budget = self._slice(client)
            else:
                budget = max_budget if headroom is None else self._slice(client, headroom)
                if ranks[client.id] < highest:  # a higher priority is connected, idle: what it comes back
                    budget = min(budget, self._slice(client, _IDLE_SLICE_NS, _IDLE_SLICE_COMMANDS))  # to ends soon
            plan.append(Turn(client, min(budget, max_budget), cut_ns))
        if not plan and held and not in_flight:  # work-conserving: the device never idles while work waits
            client = max(held, key=lambda item: item[0])[1]  # (every waiting client at its ceiling: shares
            plan.append(Turn(client, self._slice(client),  # that add up to 100% all meet it at once), cut
                             self._cut_ns(clients, ranks, top) if ranks[client.id] < top else 0))
        return plan

    def _cut_ns(self, clients: list, ranks: dict[int, int], top: int) -> int:
        """The pieces' length for lower work while rank ``top`` is active: ``_CUT_NS``, or the longest
        of the top rank's own commands (its running estimate), if longer. A higher client waits for
        its own commands anyway, and cut finer, the lower work would go one piece per pass between
        them: behind a higher client's long commands, lower clients would wait seconds between
        two of their own."""
        longest = max((self.usage(c).per_command_ns for c in clients if ranks[c.id] == top), default=0.0)
        return int(min(max(_CUT_NS, longest), _CUT_MAX_NS))

    def _least_served(self, rivals: list) -> float:
        """The least device time (per weight) among ``rivals``, the waiting clients of the top
        priority, once none of them trails the most served by more than ``_LAG_NS``: a client
        that was idle, or new, catches up that much at most, not the whole history of the
        others (a newcomer would otherwise hold back, for as long as they had run, every client
        that had run long)."""
        if not rivals:
            return 0.0
        most = max(self.usage(c).total_ns for c in rivals)
        for client in rivals:
            usage = self.usage(client)
            usage.total_ns = max(usage.total_ns, most - _LAG_NS)
        return min(self.usage(c).total_ns for c in rivals)

    def arbitrates(self, clients: list) -> bool:
        """False when every pass would give every waiting client all it has (no plan is needed):
        scheduling off, no client, or throughput mode with every client alike."""
        return not (self.mode == UNSCHEDULED or not clients or (self.mode == "throughput" and self._all_alike(clients)))

    def _all_alike(self, clients: list) -> bool:
        """One priority for every client and no compute-share ceiling anywhere."""
        first = self.priority_of(clients[0])
        return all(self.priority_of(c) == first for c in clients) and not self._any_share()

    def _any_share(self) -> bool:
        return any(u.share < 100 for u in self._usage.values()) or any(v < 100 for v in self.group_share.values())

    def _slice(self, client, ns: float = _SLICE_NS, most: int = _SLICE_COMMANDS) -> int:
        """How many of ``client``'s commands fit in ``ns`` of device time: at least one, and at most
        ``most``. The estimate comes from the client's own past commands, which it chooses: 300 tiny
        dispatches made 65 heavy ones fit in one slice, and a realtime client waited 520 ms behind
        them (fairshare clients 385 ms)."""
        return min(most, max(1, int(ns // max(self.usage(client).per_command_ns, 1.0))))

    def submitted(self, client, count: int) -> None:
        """Note that ``count`` descriptors of ``client`` were popped now (it is active)."""
        usage = self.usage(client)
        usage.last_submit_ns = time.monotonic_ns()
        usage.queued_ns += count * usage.per_command_ns

    def _order_key(self, client) -> tuple:
        """Priority first; then the least served (fairshare) or the longest unserved (throughput)."""
        usage = self.usage(client)
        turn = usage.total_ns if self.mode == "fairshare" else usage.last_submit_ns
        return (-_RANK[self.priority_of(client)], turn, client.id)

    def _headroom(self, client, clients: list, busy: dict[int, bool], total_recent: float) -> float | None:
        """Device time (ns) the client, with its group, may still take before it reaches its
        compute share: None when no ceiling applies now (100%, or no one else wants the device)."""
        share = self.share_of(client) / 100
        if share >= 1:
            return None
        others_want = any(busy.get(c.id) for c in clients
                          if c.id != client.id and not (client.group and c.group == client.group))
        if not others_want:
            return None
        members = [c for c in clients if c.id == client.id or (client.group and c.group == client.group)]
        used = sum(self.usage(c).recent_ns + self.usage(c).queued_ns for c in members)
        return (share * total_recent - used) / (1 - share)  # taking x more: (used + x) / (total + x) = share
