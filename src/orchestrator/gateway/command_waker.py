"""Which long polls to wake, and which runners surely have nothing to deliver.

A waiting long poll (``gateway.long_poll``) holds no database connection: it waits on an in-process event
of its runner, set by ``CommandWaker.notify(org, runner)``, called

- on this process after a change to the runner's queue commits here (the dispatcher enqueueing a command,
  an ack, a retry without delay, a reject);
- on PostgreSQL, for changes committed by any replica: they are announced with NOTIFY in their transaction
  (``store.agent_commands.announce``) and heard by each replica's LISTEN connection (``store.listener``,
  ``AgentGateway.announced``);
- by the polling fallback (``LongPoll.wake_ready``, from ``AgentGateway.run``), which looks every
  ``PO_AGENT_POLL_FALLBACK_SECONDS`` for runners waiting here that have a deliverable command: retry
  delays and leases running out, and anything a lost notification missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

_Runner = tuple[str, str]


class CommandWaker:
    """Wakes long polls waiting for a runner's next command (in-process, one event per waiting runner),
    and knows which runners surely have nothing to deliver, so that most polls touch no database.

    "Surely nothing": the runner was not in the last snapshot of runners with a deliverable command
    (``record_ready``, taken by the polling fallback) and no ``notify`` for it came since that snapshot's
    query began. A command that becomes deliverable without a notification (a lease or retry delay running
    out) shows in the next snapshot, which wakes the poll.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._events: dict[_Runner, asyncio.Event] = {}
        self._changed: dict[_Runner, float] = {}
        self._all_changed_at = float("-inf")
        self._ready: frozenset[_Runner] | None = None
        self._ready_at = float("-inf")

    def ticket(self, org_id: str, runner_id: str) -> asyncio.Event:
        """Take this before looking for a command: a ``notify`` from then on sets it."""
        key = (org_id, runner_id)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        return event

    def notify(self, org_id: str, runner_id: str) -> None:
        """The runner's queue changed: wake its waiting polls."""
        key = (org_id, runner_id)
        self._changed[key] = self._clock()
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        """Anything may have changed: wake every waiting long poll (each looks at its queue again)."""
        self._all_changed_at = self._clock()
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def waiting(self) -> set[_Runner]:
        return set(self._events)

    def now(self) -> float:
        return self._clock()

    def record_ready(self, ready: set[_Runner], *, as_of: float) -> None:
        """The runners with a deliverable command, as read by a query that began at ``as_of``."""
        if as_of < self._ready_at:
            return
        self._ready, self._ready_at = frozenset(ready), as_of
        self._changed = {key: at for key, at in self._changed.items() if at >= as_of}

    def may_have_command(self, org_id: str, runner_id: str, *, max_age: float) -> bool:
        """False only if the runner surely has nothing deliverable (per a snapshot at most ``max_age``
        seconds old and the notifications since)."""
        if self._ready is None or self._clock() - self._ready_at > max_age:
            return True
        key = (org_id, runner_id)
        return (
            key in self._ready
            or self._changed.get(key, float("-inf")) >= self._ready_at
            or self._all_changed_at >= self._ready_at
        )
