"""In-process wake-ups: a result that completes a deployment wakes its waiters at once; background loops
sleep until their next round or until the process stops.

Waiters also re-read the database on a short interval, so a result applied by another replica is seen too.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from types import TracebackType


class Notifier:
    """Keyed one-shot broadcasts: ``wait(key, seconds)`` returns when ``notify(key)`` is called."""

    def __init__(self) -> None:
        self._events: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._subscriptions: defaultdict[str, set[Subscription]] = defaultdict(set)
        #: Set by ``close``: the process is stopping, nobody waits any more.
        self.closed = False

    def notify(self, key: str) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()
        for subscription in self._subscriptions.get(key, ()):
            subscription.event.set()

    def close(self) -> None:
        """The process is stopping: wake every waiter now, and let no one wait from now on."""
        self.closed = True
        events, self._events = self._events, defaultdict(asyncio.Event)
        for event in events.values():
            event.set()
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription.event.set()

    def subscribe(self, keys: Iterable[str]) -> Subscription:
        """Wake-ups of ``keys`` from now on, none missed between two waits (a loop that reads, then
        waits); use it as a context manager, which ends it."""
        subscription = Subscription(self, tuple(keys))
        for key in subscription.keys:
            self._subscriptions[key].add(subscription)
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        for key in subscription.keys:
            subscribed = self._subscriptions.get(key)
            if subscribed is not None:
                subscribed.discard(subscription)
                if not subscribed:
                    del self._subscriptions[key]

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


class Subscription:
    """A waiter's wake-ups of some keys (``Notifier.subscribe``): a ``notify`` since the last ``wait``
    returned makes the next ``wait`` return at once."""

    def __init__(self, notifier: Notifier, keys: tuple[str, ...]) -> None:
        self.notifier = notifier
        self.keys = keys
        self.event = asyncio.Event()

    async def wait(self, seconds: float) -> bool:
        """True if one of the keys was notified (since the last wait) within ``seconds``, or the notifier
        is closed."""
        if self.notifier.closed:
            return True
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            return False
        finally:
            self.event.clear()
        return True

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.notifier._unsubscribe(self)


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile; whether it is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
    return stop.is_set()
