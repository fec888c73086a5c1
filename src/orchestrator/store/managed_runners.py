"""Managed runners: their records (one per name, the token stored only as its SHA-256), their claims of
queued deployments of runner ``managed`` (any organization), and the pool's read-only runner rows.

Rows only: the policy (what a lost lease does, what ``finished`` fails) is ``dispatch.managed``'s.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.deployments import EXECUTING_MESSAGE, Deployment, DispatchState, Status
from orchestrator.domain.managed import (
    MANAGED_DESCRIPTION,
    MANAGED_RUNNER_ID,
    MANAGED_RUNNER_TYPE,
    carries,
    handle,
)
from orchestrator.store.rows import entity
from orchestrator.store.schema import (
    deployments,
    managed_runner_registrations,
    managed_runners,
    orgs,
    runners,
)

#: How many queued deployments one claim looks at (oldest first) for one whose tags the runner carries.
CLAIM_SCAN = 100


@dataclass(frozen=True, kw_only=True)
class ManagedRunner:
    id: uuid.UUID
    name: str
    tags: list[str]
    registered_at: datetime
    last_seen_at: datetime
    claim_deployment_id: uuid.UUID | None
    claim_lease_until: datetime | None
    claim_used_at: datetime | None


def _record(row: sa.Row[tuple[object, ...]]) -> ManagedRunner:
    return entity(ManagedRunner, row)  # not token_hash


def _deployment(row: sa.Row[tuple[object, ...]]) -> Deployment:
    return entity(Deployment, row)


# --- the pool's runner rows -----------------------------------------------------------------------------


async def ensure_pool_rows(conn: AsyncConnection, *, now: datetime, org_id: str | None = None) -> int:
    """Give every organization (or ``org_id``) its read-only runner ``managed`` if it has none yet: rules
    and environments link to runners by row. The number of rows written."""
    missing = ~sa.exists().where(runners.c.org_id == orgs.c.id, runners.c.id == MANAGED_RUNNER_ID)
    select = sa.select(
        orgs.c.id,
        sa.literal(MANAGED_RUNNER_ID),
        sa.literal(MANAGED_DESCRIPTION),
        sa.literal(MANAGED_RUNNER_TYPE),
        sa.literal({"type": MANAGED_RUNNER_TYPE}, type_=runners.c.configuration.type),
        sa.literal("orchestrator"),
        sa.literal({"type": "orchestrator"}, type_=runners.c.state_configuration.type),
        sa.literal(now, type_=runners.c.created_at.type),
        sa.literal(now, type_=runners.c.updated_at.type),
    ).where(missing)
    if org_id is not None:
        select = select.where(orgs.c.id == org_id)
    result = await conn.execute(
        runners.insert().from_select(
            [
                "org_id",
                "id",
                "description",
                "type",
                "configuration",
                "state_type",
                "state_configuration",
                "created_at",
                "updated_at",
            ],
            select,
        )
    )
    return int(result.rowcount or 0)


# --- records --------------------------------------------------------------------------------------------


async def by_name(conn: AsyncConnection, name: str, *, for_update: bool = False) -> ManagedRunner | None:
    stmt = sa.select(managed_runners).where(managed_runners.c.name == name)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return _record(row) if row else None


async def by_token_hash(conn: AsyncConnection, token_hash: str) -> ManagedRunner | None:
    row = (
        await conn.execute(sa.select(managed_runners).where(managed_runners.c.token_hash == token_hash))
    ).first()
    return _record(row) if row else None


async def get(
    conn: AsyncConnection, record_id: uuid.UUID, *, for_update: bool = False
) -> ManagedRunner | None:
    stmt = sa.select(managed_runners).where(managed_runners.c.id == record_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return _record(row) if row else None


async def insert(
    conn: AsyncConnection, *, name: str, tags: list[str], token_hash: str, now: datetime
) -> ManagedRunner:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "name": name,
        "token_hash": token_hash,
        "tags": tags,
        "registered_at": now,
        "last_seen_at": now,
        "claim_deployment_id": None,
        "claim_lease_until": None,
        "claim_used_at": None,
    }
    await conn.execute(managed_runners.insert().values(values))
    return ManagedRunner(**{k: v for k, v in values.items() if k != "token_hash"})


async def delete(conn: AsyncConnection, record_id: uuid.UUID) -> bool:
    result = await conn.execute(managed_runners.delete().where(managed_runners.c.id == record_id))
    return result.rowcount > 0


async def seen(conn: AsyncConnection, record_id: uuid.UUID, *, now: datetime) -> None:
    await conn.execute(
        managed_runners.update().where(managed_runners.c.id == record_id).values(last_seen_at=now)
    )


async def count_online(conn: AsyncConnection, *, since: datetime) -> tuple[int, list[str]]:
    """How many runners were seen since ``since``, and the union of their tags."""
    rows = (
        await conn.execute(sa.select(managed_runners.c.tags).where(managed_runners.c.last_seen_at >= since))
    ).all()
    tags: set[str] = set()
    for (row_tags,) in rows:
        tags.update(row_tags or ())
    return len(rows), sorted(tags)


async def online_tag_sets(conn: AsyncConnection, *, since: datetime) -> list[frozenset[str]]:
    """The tags of each runner seen since ``since``."""
    rows = await conn.execute(
        sa.select(managed_runners.c.tags).where(managed_runners.c.last_seen_at >= since)
    )
    return [frozenset(row_tags or ()) for (row_tags,) in rows]


async def queued_messages(conn: AsyncConnection, *, limit: int) -> list[tuple[uuid.UUID, list[str], str]]:
    """The queued deployments of the pool, oldest first: id, required tags, status message."""
    rows = await conn.execute(
        sa.select(deployments.c.id, deployments.c.required_tags, deployments.c.status_message)
        .where(
            deployments.c.runner_id == MANAGED_RUNNER_ID,
            deployments.c.dispatch_state == DispatchState.QUEUED,
            deployments.c.status == Status.EXECUTING,
        )
        .order_by(deployments.c.created_at, deployments.c.id)
        .limit(limit)
    )
    return [(row.id, list(row.required_tags or ()), row.status_message) for row in rows]


async def set_queued_message(conn: AsyncConnection, deployment_id: uuid.UUID, message: str) -> bool:
    """The status message of a deployment still queued, if it differs (no write otherwise)."""
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.dispatch_state == DispatchState.QUEUED,
            deployments.c.status == Status.EXECUTING,
            deployments.c.status_message != message,
        )
        .values(status_message=message)
    )
    return result.rowcount > 0


# --- claims ---------------------------------------------------------------------------------------------


async def renew(
    conn: AsyncConnection, record_id: uuid.UUID, deployment_id: uuid.UUID, *, until: datetime
) -> bool:
    result = await conn.execute(
        managed_runners.update()
        .where(managed_runners.c.id == record_id, managed_runners.c.claim_deployment_id == deployment_id)
        .values(claim_lease_until=until)
    )
    return result.rowcount > 0


async def release(conn: AsyncConnection, record_id: uuid.UUID) -> None:
    await conn.execute(
        managed_runners.update()
        .where(managed_runners.c.id == record_id)
        .values(claim_deployment_id=None, claim_lease_until=None, claim_used_at=None)
    )


async def mark_used(conn: AsyncConnection, deployment_id: uuid.UUID, *, now: datetime) -> None:
    """The claimed deployment's token was used at the gateway: from now on a lost lease fails it."""
    await conn.execute(
        managed_runners.update()
        .where(
            managed_runners.c.claim_deployment_id == deployment_id,
            managed_runners.c.claim_used_at.is_(None),
        )
        .values(claim_used_at=now)
    )


async def claim(
    conn: AsyncConnection, record: ManagedRunner, *, now: datetime, lease: timedelta
) -> Deployment | None:
    """Claim the oldest queued deployment of runner ``managed`` (any organization) whose required tags
    ``record`` carries: it becomes launched with handle ``managed:<record id>``, and the record holds it
    until ``now + lease``. Exactly one runner gets a deployment: PostgreSQL locks the candidates (FOR UPDATE
    SKIP LOCKED), SQLite's one writer serializes claims, and the update is conditional."""
    candidates = (
        await conn.execute(
            sa.select(deployments)
            .where(
                deployments.c.runner_id == MANAGED_RUNNER_ID,
                deployments.c.dispatch_state == DispatchState.QUEUED,
                deployments.c.status == Status.EXECUTING,
            )
            .order_by(deployments.c.created_at, deployments.c.id)
            .limit(CLAIM_SCAN)
            .with_for_update(skip_locked=True)
        )
    ).all()
    for row in candidates:
        deployment = _deployment(row)
        if not carries(record.tags, deployment.required_tags):
            continue
        taken = await conn.execute(
            deployments.update()
            .where(
                deployments.c.id == deployment.id,
                deployments.c.dispatch_state == DispatchState.QUEUED,
                deployments.c.status == Status.EXECUTING,
            )
            .values(
                dispatch_state=DispatchState.LAUNCHED,
                handle=handle(str(record.id)),
                # A waiting note (``note_waiting``) ends: a runner has it.
                status_message=EXECUTING_MESSAGE,
                launched_at=now,
                dispatch_attempts=deployment.dispatch_attempts + 1,
                # Only the deployment timeout is the dispatcher's to check.
                next_check_at=deployment.timeout_at,
                updated_at=now,
            )
        )
        if taken.rowcount == 0:
            continue
        held = await conn.execute(
            managed_runners.update()
            .where(managed_runners.c.id == record.id, managed_runners.c.claim_deployment_id.is_(None))
            .values(claim_deployment_id=deployment.id, claim_lease_until=now + lease, claim_used_at=None)
        )
        if held.rowcount == 0:
            raise ClaimRaceError()
        row2 = (await conn.execute(sa.select(deployments).where(deployments.c.id == deployment.id))).one()
        return _deployment(row2)
    return None


class ClaimRaceError(Exception):
    """The record took another claim meanwhile (two claims of one runner at once): roll back."""


async def requeue(conn: AsyncConnection, deployment_id: uuid.UUID, *, now: datetime) -> bool:
    """A claimed deployment whose runner was lost before it began: queued again for another runner."""
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.status == Status.EXECUTING,
            deployments.c.dispatch_state == DispatchState.LAUNCHED,
        )
        .values(
            dispatch_state=DispatchState.QUEUED,
            handle=None,
            launched_at=None,
            next_check_at=None,
            updated_at=now,
        )
    )
    return result.rowcount > 0


async def lapsed(conn: AsyncConnection, *, now: datetime, limit: int) -> list[ManagedRunner]:
    """Records whose claim's lease ran out (locked: another replica skips them)."""
    rows = (
        await conn.execute(
            sa.select(managed_runners)
            .where(managed_runners.c.claim_lease_until < now)
            .order_by(managed_runners.c.claim_lease_until)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    return [_record(r) for r in rows]


async def queued_timed_out(conn: AsyncConnection, *, now: datetime, limit: int) -> list[Deployment]:
    """Queued deployments no managed runner claimed before their timeout."""
    rows = (
        await conn.execute(
            sa.select(deployments)
            .where(
                deployments.c.dispatch_state == DispatchState.QUEUED,
                deployments.c.status == Status.EXECUTING,
                deployments.c.timeout_at <= now,
            )
            .order_by(deployments.c.timeout_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    return [_deployment(r) for r in rows]


async def deployment(conn: AsyncConnection, deployment_id: uuid.UUID) -> Deployment | None:
    row = (await conn.execute(sa.select(deployments).where(deployments.c.id == deployment_id))).first()
    return _deployment(row) if row else None


async def prune(conn: AsyncConnection, *, cutoff: datetime, limit: int) -> list[ManagedRunner]:
    """Delete records not seen since ``cutoff`` that hold no claim; the deleted ones."""
    rows = (
        await conn.execute(
            sa.select(managed_runners)
            .where(managed_runners.c.last_seen_at < cutoff, managed_runners.c.claim_deployment_id.is_(None))
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    gone = [_record(r) for r in rows]
    if gone:
        await conn.execute(
            managed_runners.delete().where(
                managed_runners.c.id.in_([r.id for r in gone]),
                managed_runners.c.claim_deployment_id.is_(None),
            )
        )
    return gone


async def any_queued(conn: AsyncConnection) -> bool:
    """A cheap read: is any deployment waiting for a managed runner?"""
    found = await conn.execute(
        sa.select(deployments.c.id)
        .where(deployments.c.dispatch_state == DispatchState.QUEUED, deployments.c.status == Status.EXECUTING)
        .limit(1)
    )
    return found.first() is not None


# --- registration credentials (issue 26) ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Registration:
    id: uuid.UUID
    tags: list[str]
    description: str
    created_at: datetime


async def insert_registration(
    conn: AsyncConnection, *, secret_hash: str, tags: list[str], description: str, now: datetime
) -> Registration:
    record = Registration(id=uuid.uuid4(), tags=tags, description=description, created_at=now)
    await conn.execute(
        sa.insert(managed_runner_registrations).values(
            id=record.id, secret_hash=secret_hash, tags=tags, description=description, created_at=now
        )
    )
    return record


async def list_registrations(conn: AsyncConnection) -> list[Registration]:
    table = managed_runner_registrations
    rows = await conn.execute(sa.select(table).order_by(table.c.created_at, table.c.id))
    return [entity(Registration, row) for row in rows]


async def registration_by_secret_hash(conn: AsyncConnection, secret_hash: str) -> Registration | None:
    table = managed_runner_registrations
    row = (await conn.execute(sa.select(table).where(table.c.secret_hash == secret_hash))).one_or_none()
    return entity(Registration, row) if row is not None else None


async def delete_registration(conn: AsyncConnection, registration_id: uuid.UUID) -> bool:
    table = managed_runner_registrations
    result = await conn.execute(sa.delete(table).where(table.c.id == registration_id))
    return bool(result.rowcount)
