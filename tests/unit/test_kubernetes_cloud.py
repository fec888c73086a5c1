"""The access cache of the cloud Kubernetes launchers (launchers/kubernetes_cloud.py): one exchange per
key until shortly before the token expires; failures are not cached."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.launchers.base import LaunchError, LaunchTarget
from orchestrator.launchers.kubernetes import ClusterAccess
from orchestrator.launchers.kubernetes_cloud import AccessCache, ExpiringAccess, access_key, redacted


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingSource:
    """Mints ``token-<n>`` valid ``lifetime`` seconds from the clock; fails while ``failing``."""

    def __init__(self, clock: Clock, lifetime: float = 600.0) -> None:
        self.clock, self.lifetime = clock, lifetime
        self.exchanges = 0
        self.failing = False

    async def cluster_access(self) -> ExpiringAccess:
        self.exchanges += 1
        await asyncio.sleep(0)
        if self.failing:
            raise LaunchError("the cloud refused")
        access = ClusterAccess(server="https://cluster.example", token=f"token-{self.exchanges}")
        return ExpiringAccess(access=access, expires_at=self.clock() + self.lifetime)


async def test_access_cache__reuses_until_the_margin() -> None:
    """The second call reuses the access; once within the margin of its expiry, it is exchanged again."""
    clock = Clock()
    source = CountingSource(clock)
    cache = AccessCache(margin_seconds=60, clock=clock)

    first = await cache.get("k", source)
    clock.now += 539
    second = await cache.get("k", source)
    clock.now += 2
    third = await cache.get("k", source)

    assert (first.token, second.token, third.token) == ("token-1", "token-1", "token-2")
    assert source.exchanges == 2


async def test_access_cache__concurrent_calls_share_one_exchange() -> None:
    clock = Clock()
    source = CountingSource(clock)
    cache = AccessCache(clock=clock)

    accesses = await asyncio.gather(*(cache.get("k", source) for _ in range(5)))

    assert {a.token for a in accesses} == {"token-1"}
    assert source.exchanges == 1


async def test_access_cache__failures_are_not_cached_and_forget_drops() -> None:
    clock = Clock()
    source = CountingSource(clock)
    cache = AccessCache(clock=clock)
    source.failing = True
    with pytest.raises(LaunchError):
        await cache.get("k", source)
    source.failing = False

    before = await cache.get("k", source)
    cache.forget("k")
    after = await cache.get("k", source)

    assert (before.token, after.token) == ("token-2", "token-3")


async def test_access_cache__keys_are_apart_and_expired_entries_pruned() -> None:
    clock = Clock()
    source = CountingSource(clock, lifetime=300)
    cache = AccessCache(margin_seconds=60, clock=clock)
    await cache.get("a", source)
    clock.now += 250
    await cache.get("b", source)

    assert len(cache) == 1
    assert source.exchanges == 2


def test_access_key__changes_with_the_configuration() -> None:
    def target(config: dict[str, object]) -> LaunchTarget:
        return LaunchTarget(org_id="o", runner_id="r", runner_type="kubernetes-gke", configuration=config)

    assert access_key(target({"a": 1, "b": 2})) == access_key(target({"b": 2, "a": 1}))
    assert access_key(target({"a": 1})) != access_key(target({"a": 2}))


def test_redacted__removes_each_secret() -> None:
    assert redacted("bad token abc.def for abc.def", ["abc.def", ""]) == "bad token [redacted] for [redacted]"
