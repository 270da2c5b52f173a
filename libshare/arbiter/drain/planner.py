"""The planner: what the engine is told of the scheduling policy, and the plan of each of its passes.

The engine drains every waiting client, all it has, when the clients are alike (one
priority, no compute share, throughput mode): the common case never takes the GIL.
Otherwise it is *planned*: before each pass it calls :meth:`Planner.plan` on its own
thread, and the scheduler (``libshare/arbiter/policy/scheduler.py``) sets that pass's turns
(which clients, how many descriptors each, in which order, which dispatches run in pieces)
from the device time the engine measured since the last plan. The scheduler also sets how
many submissions may be on the device at once and for how long a plan holds. What the engine
does with a plan, and when it asks for the next, is in ``libshare/arbiter/policy/engine_policy.c``.

The rest of what the engine is told lives here too: whether it timestamps every command
(per-client device time for the scheduler and ``ps``) and the watchdog's limit. The engine
is told again only when something changed (:meth:`Planner.update`, after each batch of
control tasks that may have changed the clients or the scheduler's settings): telling it
wakes it and drops its current plan.

A scheduler that fails to plan costs one pass of its policy, never a client's turn: that
pass drains every waiting client, and the failure is logged.
"""

from __future__ import annotations

import logging
import threading

from libshare.arbiter.engine.binding import POP, Engine
from libshare.arbiter.policy.scheduler import Scheduler

log = logging.getLogger("libshare.arbiter")

_SPIN = 50e-6  # seconds the engine watches the rings after work before it sleeps
_SPIN_CLIENTS = 16  # with more clients than this, work arrives often enough without spinning


class Planner:
    """The engine's policy and plans (owned by Drainer, which passes the scheduler, the lock it plans
    under and its clients by id, and :meth:`attach`-es each engine it makes)."""

    def __init__(self, scheduler: Scheduler, scheduling: threading.Lock, clients: dict, timed: bool = True):
        self.scheduler = scheduler
        self.scheduling = scheduling
        """Held while the scheduler plans (on the engine's thread) or its client list changes."""
        self.plans = 0
        """How many times the engine has asked the scheduler for a plan (each call takes the GIL)."""
        self._clients = clients  # the owner's, by id: changed under ``scheduling``
        self._engine: Engine | None = None
        self._watchdog: float | None = None
        self._timed = timed
        self._told: dict | None = None  # the policy the engine has

    @property
    def watchdog(self) -> float | None:
        """Seconds a submission may run before the server faults (None: no limit)."""
        return self._watchdog

    @watchdog.setter
    def watchdog(self, seconds: float | None) -> None:
        self._watchdog = seconds
        self.update()

    @property
    def timed(self) -> bool:
        """Timestamp every command (per-client device time for the scheduler and ps)."""
        return self._timed

    @timed.setter
    def timed(self, value: bool) -> None:
        self._timed = bool(value)
        self.update()

    def attach(self, engine: Engine) -> None:
        """Tell a new engine the whole policy; later changes go to it."""
        self._engine = engine
        self._tell(fresh=True)

    def update(self) -> None:
        """Tell the engine whether the scheduler must plan each pass, and the rest of its policy
        (only what changed: telling it wakes it and drops its current plan)."""
        if self._engine is not None:
            self._tell(fresh=False)

    def _tell(self, fresh: bool) -> None:
        with self.scheduling:
            planned = self.scheduler.arbitrates([c for c in self._clients.values() if not c.closing])
        policy = dict(planned=planned, timed=self._timed, watchdog=self._watchdog, spin=_SPIN,
                      spin_clients=_SPIN_CLIENTS, max_in_flight=self.scheduler.max_in_flight,
                      plan_for=self.scheduler.plan_for)
        if fresh or policy != self._told:
            self._engine.set_policy(**policy)
            self._told = policy

    # ---------------------------------------------------------------- the engine's thread

    def plan(self) -> None:
        """The turns of the engine's next pass, from the scheduler (called on the engine's thread).

        Should the scheduler fail, the pass drains every waiting client (logged): a policy bug must
        not starve anyone."""
        self.plans += 1
        try:
            self._plan_turns()
        except Exception:
            log.exception("the scheduler failed to plan a pass; this one drains every waiting client")
            self._engine.set_plan([(c.slot, POP, 0, 0) for c in list(self._clients.values()) if not c.closing])

    def _plan_turns(self) -> None:
        with self.scheduling:
            scheduler, engine = self.scheduler, self._engine
            clients, pending, busy = [], {}, {}
            for client in list(self._clients.values()):
                if client.closing:
                    continue
                usage = engine.stats(client.slot, take=True)
                if usage is None:
                    continue
                if usage.popped_since:
                    scheduler.submitted(client, usage.popped_since)
                if usage.charged_since:
                    scheduler.charge_many(client, usage.charged_ns_since, usage.charged_since)
                clients.append(client)
                pending[client.id] = usage.pending > 0
                busy[client.id] = usage.pending > 0 or usage.outstanding > 0
            plan = scheduler.plan(clients, pending, busy, engine.in_flight(), POP)
            engine.set_plan([(turn.client.slot, turn.budget, scheduler.rank(turn.client), turn.cut_ns // 1000)
                             for turn in plan if turn.budget > 0])
