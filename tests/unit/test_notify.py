"""In-process wake-ups (``orchestrator.notify``): a subscription misses no notification between its waits,
and every waiter wakes when the process stops."""

from __future__ import annotations

import asyncio

from orchestrator.notify import Notifier


async def test_subscription__a_notify_between_two_waits_is_not_missed() -> None:
    notifier = Notifier()
    with notifier.subscribe(["a", "b"]) as subscription:
        notifier.notify("b")  # while the subscriber is busy (reading), not waiting
        first = await subscription.wait(5)
        second = await subscription.wait(0.01)

    assert (True, False) == (first, second)


async def test_subscription__only_its_keys_wake_it_and_it_ends_with_its_block() -> None:
    notifier = Notifier()
    with notifier.subscribe(["a"]) as subscription:
        notifier.notify("other")
        woken = await subscription.wait(0.01)
    notifier.notify("a")

    assert not woken
    assert {} == dict(notifier._subscriptions)


async def test_close__wakes_subscriptions_and_one_shot_waiters() -> None:
    notifier = Notifier()
    with notifier.subscribe(["a"]) as subscription:
        waiting = asyncio.gather(subscription.wait(30), notifier.wait("b", 30))
        await asyncio.sleep(0)
        notifier.close()
        woken = await asyncio.wait_for(waiting, 5)
        after = await subscription.wait(30)

    assert [True, True] == list(woken)
    assert after
