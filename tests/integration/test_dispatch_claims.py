"""Several dispatchers (replicas) share one database: each deployment is claimed by exactly one of them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI

from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import deployments as store
from orchestrator.store.schema import deployments
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    """The app without its own dispatcher: the test plays the replicas."""
    application = create_app(settings, run_dispatcher=False)
    async with application.router.lifespan_context(application):
        yield application


RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())


async def make_pending(app: FastAPI, org: Org, count: int) -> set[str]:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    await org.admin.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    ids = set()
    for i in range(count):
        env = (
            await org.admin.post(
                f"{base}/projects/shop/envs", json={"id": f"e{i}", "env_type_id": "development"}
            )
        ).json()
        deployment_id = await insert_deployment(app, org.id, env, status="executing")
        ids.add(deployment_id)
    # Back to "pending, never launched", as the API creates them.
    async with app.state.services.engine.begin() as conn:
        for deployment_id in ids:
            await conn.execute(
                deployments.update()
                .where(deployments.c.id == uuid.UUID(deployment_id))
                .values(dispatch_state="pending", next_check_at=None, launched_at=None)
            )
    return ids


async def test_claims__each_pending_deployment_claimed_once(app: FastAPI, org: Org) -> None:
    ids = await make_pending(app, org, 30)
    engine = app.state.services.engine

    async def drain(owner: str) -> list[str]:
        claimed: list[str] = []
        while True:
            async with engine.begin() as conn:
                batch = await store.claim_pending(
                    conn, owner=owner, now=datetime.now(UTC), lease=timedelta(minutes=5), limit=3
                )
            if not batch:
                return claimed
            claimed += [str(d.id) for d in batch]

    batches = await asyncio.gather(*(drain(f"replica-{i}") for i in range(6)))
    claimed = [deployment_id for batch in batches for deployment_id in batch]

    assert len(ids) == len(claimed) == len(set(claimed))
    assert ids == set(claimed)


async def test_claims__expired_lease_is_taken_over(app: FastAPI, org: Org) -> None:
    await make_pending(app, org, 1)
    engine = app.state.services.engine
    now = datetime.now(UTC)

    async with engine.begin() as conn:
        first = await store.claim_pending(
            conn, owner="crashed", now=now, lease=timedelta(seconds=30), limit=5
        )
    async with engine.begin() as conn:
        while_leased = await store.claim_pending(
            conn, owner="other", now=now, lease=timedelta(seconds=30), limit=5
        )
    async with engine.begin() as conn:
        after_expiry = await store.claim_pending(
            conn, owner="other", now=now + timedelta(seconds=31), lease=timedelta(seconds=30), limit=5
        )

    assert 1 == len(first)
    assert [] == while_leased
    assert [first[0].id] == [d.id for d in after_expiry]
    assert "other" == after_expiry[0].dispatch_owner


async def test_renew_leases__extends_its_own_live_leases_only(app: FastAPI, org: Org) -> None:
    await make_pending(app, org, 3)
    engine = app.state.services.engine
    now = datetime.now(UTC)
    lease = timedelta(seconds=30)
    async with engine.begin() as conn:
        mine = await store.claim_pending(conn, owner="me", now=now, lease=lease, limit=1)
        theirs = await store.claim_pending(conn, owner="them", now=now, lease=lease, limit=1)
        lapsed = await store.claim_pending(
            conn, owner="me", now=now - timedelta(seconds=60), lease=lease, limit=1
        )

    later = now + timedelta(seconds=20)
    async with engine.begin() as conn:
        renewed = await store.renew_leases(conn, owner="me", now=later, lease=lease)
        until = {
            row.id: row.dispatch_lease_until
            for row in await conn.execute(sa.select(deployments.c.id, deployments.c.dispatch_lease_until))
        }

    assert 1 == renewed
    assert later + lease == _utc(until[mine[0].id])
    assert now + lease == _utc(until[theirs[0].id])
    # A lease that ran out stays out: another server may have taken the deployment over.
    assert now - timedelta(seconds=30) == _utc(until[lapsed[0].id])


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
