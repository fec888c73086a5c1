"""CommandWaker: waking waiting long polls, and when a poll may skip the database (a runner surely without
a deliverable command)."""

from __future__ import annotations

import asyncio

from orchestrator.gateway.command_waker import CommandWaker

A = ("acme", "a")
B = ("acme", "b")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def waker() -> tuple[CommandWaker, Clock]:
    clock = Clock()
    return CommandWaker(clock=clock), clock


async def test_notify__wakes_the_runners_waiting_polls_only() -> None:
    made, _ = waker()
    a, b = made.ticket(*A), made.ticket(*B)
    same = made.ticket(*A)

    made.notify(*A)
    await asyncio.sleep(0)

    assert a is same
    assert (True, False) == (a.is_set(), b.is_set())
    assert {B} == made.waiting()


async def test_notify_all__wakes_every_waiting_poll() -> None:
    made, _ = waker()
    events = [made.ticket(*A), made.ticket(*B)]

    made.notify_all()

    assert all(event.is_set() for event in events)
    assert set() == made.waiting()


def test_may_have_command__without_a_snapshot_every_runner_may() -> None:
    made, _ = waker()

    assert made.may_have_command(*A, max_age=3)


def test_may_have_command__only_runners_in_the_snapshot_may() -> None:
    made, clock = waker()
    made.record_ready({A}, as_of=clock.now)
    clock.now += 1

    assert (True, False) == (made.may_have_command(*A, max_age=3), made.may_have_command(*B, max_age=3))


def test_may_have_command__a_notification_since_the_query_began_counts() -> None:
    """A command committed while the snapshot's query ran may be missing from it: its notification,
    even one that came before the snapshot was recorded, keeps the runner in."""
    made, clock = waker()
    as_of = clock.now
    clock.now += 0.01
    made.notify(*B)
    clock.now += 0.01
    made.record_ready(set(), as_of=as_of)

    assert made.may_have_command(*B, max_age=3)
    assert not made.may_have_command(*A, max_age=3)


def test_may_have_command__a_notification_before_the_query_is_covered_by_it() -> None:
    made, clock = waker()
    made.notify(*B)
    clock.now += 0.01
    made.record_ready(set(), as_of=clock.now)

    assert not made.may_have_command(*B, max_age=3)


def test_may_have_command__a_stale_snapshot_answers_nothing() -> None:
    made, clock = waker()
    made.record_ready(set(), as_of=clock.now)
    clock.now += 3.5

    assert made.may_have_command(*A, max_age=3)


def test_may_have_command__notify_all_reopens_every_runner() -> None:
    made, clock = waker()
    made.record_ready(set(), as_of=clock.now)
    clock.now += 0.5
    made.notify_all()

    assert made.may_have_command(*A, max_age=3)


def test_record_ready__an_older_snapshot_never_replaces_a_newer_one() -> None:
    made, clock = waker()
    made.record_ready(set(), as_of=clock.now)
    made.record_ready({A}, as_of=clock.now - 1)

    assert not made.may_have_command(*A, max_age=3)
