"""A deployment's phases (issue 22), in order: ``queued`` and ``launching`` recorded by the orchestrator, the
runner's (init, plan, apply or destroy, reporting) from the phase its log chunks name. Not secret."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.rows import insert_if_absent
from orchestrator.store.schema import deployment_phases

_c = deployment_phases.c
_latest = deployment_phases.alias("latest").c


@dataclass(frozen=True, kw_only=True)
class PhaseStart:
    """A phase a deployment entered, and when."""

    phase: str
    started_at: datetime


async def append(
    conn: AsyncConnection, *, deployment_id: uuid.UUID, org_id: str, phase: str, now: datetime
) -> bool:
    """Record that the deployment entered ``phase`` at ``now``, unless that is its latest phase already;
    whether it was recorded. Of two appends at once, one takes the next position and the other records
    nothing (False)."""
    latest = (
        await conn.execute(
            sa.select(_c.position, _c.phase)
            .where(_c.deployment_id == deployment_id)
            .order_by(_c.position.desc())
            .limit(1)
        )
    ).first()
    if latest is not None and latest.phase == phase:
        return False
    return await insert_if_absent(
        conn,
        deployment_phases,
        {
            "deployment_id": deployment_id,
            "position": 1 if latest is None else latest.position + 1,
            "org_id": org_id,
            "phase": phase,
            "started_at": now,
        },
    )


_LATEST = sa.select(_c.deployment_id, _c.position, _c.phase).where(
    _c.deployment_id.in_(sa.bindparam("deployment_ids", expanding=True)),
    _c.position
    == sa.select(sa.func.max(_latest.position))
    .where(_latest.deployment_id == _c.deployment_id)
    .correlate(deployment_phases)
    .scalar_subquery(),
)


async def latest_many(
    conn: AsyncConnection, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[int, str]]:
    """The latest phase of each deployment (one statement) as (position, phase); a deployment without
    any is left out."""
    if not deployment_ids:
        return {}
    rows = await conn.execute(_LATEST, {"deployment_ids": list(deployment_ids)})
    return {row.deployment_id: (row.position, row.phase) for row in rows}


@dataclass(frozen=True, kw_only=True, slots=True)
class NewPhase:
    """A phase row to insert (``insert_many``): the caller chose its position."""

    deployment_id: uuid.UUID
    position: int
    org_id: str
    phase: str
    started_at: datetime


async def insert_many(conn: AsyncConnection, rows: Sequence[NewPhase]) -> set[tuple[uuid.UUID, int]]:
    """Insert ``rows`` in one statement, each unless its position is taken (another append won it); the
    (deployment, position) of those inserted."""
    if not rows:
        return set()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = (
        dialect.insert(deployment_phases)
        .values(
            [
                {
                    "deployment_id": row.deployment_id,
                    "position": row.position,
                    "org_id": row.org_id,
                    "phase": row.phase,
                    "started_at": row.started_at,
                }
                for row in rows
            ]
        )
        .on_conflict_do_nothing(index_elements=["deployment_id", "position"])
        .returning(_c.deployment_id, _c.position)
    )
    return {(row.deployment_id, row.position) for row in await conn.execute(stmt)}


async def latest(conn: AsyncConnection, deployment_id: uuid.UUID) -> str | None:
    """The deployment's latest phase (None: none recorded)."""
    stmt = sa.select(_c.phase).where(_c.deployment_id == deployment_id).order_by(_c.position.desc()).limit(1)
    return (await conn.execute(stmt)).scalar_one_or_none()


async def of(conn: AsyncConnection, deployment_id: uuid.UUID) -> list[PhaseStart]:
    """The deployment's phases, oldest first."""
    return (await of_many(conn, [deployment_id])).get(deployment_id, [])


async def of_many(
    conn: AsyncConnection, deployment_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[PhaseStart]]:
    """The phases of each deployment (one read for a page of them), oldest first; a deployment without
    any is left out."""
    if not deployment_ids:
        return {}
    rows = (
        await conn.execute(
            sa.select(_c.deployment_id, _c.phase, _c.started_at)
            .where(_c.deployment_id.in_(list(deployment_ids)))
            .order_by(_c.deployment_id, _c.position)
        )
    ).all()
    found: dict[uuid.UUID, list[PhaseStart]] = {}
    for row in rows:
        found.setdefault(row.deployment_id, []).append(PhaseStart(phase=row.phase, started_at=row.started_at))
    return found
