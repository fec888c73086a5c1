"""In-process wake-ups: a result that completes a deployment wakes its waiters at once; background loops
sleep until their next round or until the process stops.

Waiters also re-read the database on a short interval, so a result applied by another replica is seen too.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class Notifier:
    """Keyed one-shot broadcasts: ``wait(key, seconds)`` returns when ``notify(key)`` is called."""

    def __init__(self) -> None:
        self._events: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        #: Set by ``close``: the process is stopping, nobody waits any more.
        self.closed = False

    def notify(self, key: str) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def close(self) -> None:
        """The process is stopping: wake every waiter now, and let no one wait from now on."""
        self.closed = True
        events, self._events = self._events, defaultdict(asyncio.Event)
        for event in events.values():
            event.set()

    async def wait(self, key: str, seconds: float) -> bool:
        """True if notified within ``seconds`` (or closed)."""
        if self.closed:
            return True
        event = self._events[key]
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        return True


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile; whether it is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
    return stop.is_set()
