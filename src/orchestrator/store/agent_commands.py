"""Agent commands (a durable queue per runner), the agents' event inbox and their presence.

The queue is the ``agent_commands`` table: a runner's open commands (``pending``, ``leased``) are handed
out oldest first, one at a time. Claims lock the head row: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (a
replica that finds the head locked answers "nothing now" instead of skipping to the next command, which
would break the order); on SQLite every writing transaction holds the database lock (BEGIN IMMEDIATE), so
claims are serialized.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.rows import inserted
from orchestrator.store.schema import agent_commands, agent_event_inbox, agent_presence, runners

#: PostgreSQL NOTIFY channel on which a committed change to a runner's queue is announced to every replica
#: (payload ``<org id>/<runner id>``).
CHANNEL = "po_agent_commands"


class CommandState(StrEnum):
    PENDING = "pending"
    LEASED = "leased"
    ACKED = "acked"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


OPEN_STATES = (CommandState.PENDING, CommandState.LEASED)


@dataclass(frozen=True, kw_only=True)
class AgentCommand:
    id: str
    org_id: str
    runner_id: str
    deployment_id: uuid.UUID
    type: str
    envelope: dict[str, Any]
    state: str
    attempt: int
    available_at: datetime
    expires_at: datetime
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    reason: str | None
    job_id: str | None
    job_created_at: datetime | None

    def available(self, now: datetime) -> bool:
        """Deliverable now: open, past its retry delay or lease, and not expired."""
        return self.state in OPEN_STATES and self.available_at <= now < self.expires_at


async def announce(conn: AsyncConnection, org_id: str, runner_id: str) -> None:
    """Tell every replica, once the caller's transaction commits, that the runner's queue changed
    (PostgreSQL NOTIFY, transactional: nothing is announced if it rolls back). Nothing on SQLite, which
    has one server process."""
    if conn.dialect.name == "postgresql":
        await conn.execute(sa.select(sa.func.pg_notify(CHANNEL, f"{org_id}/{runner_id}")))


def parse_announcement(payload: str) -> tuple[str, str] | None:
    org_id, sep, runner_id = payload.partition("/")
    return (org_id, runner_id) if sep and org_id and runner_id else None


def _command(row: sa.Row[tuple[object, ...]]) -> AgentCommand:
    return AgentCommand(**row._mapping)


async def insert(conn: AsyncConnection, values: dict[str, Any]) -> bool:
    """Enqueue a command; False if a command of that id exists already (nothing changed)."""
    return await inserted(conn, agent_commands.insert().values(values))


async def get(conn: AsyncConnection, command_id: str, *, for_update: bool = False) -> AgentCommand | None:
    stmt = agent_commands.select().where(agent_commands.c.id == command_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return _command(row) if row else None


def _head_id(org_id: str, runner_id: str) -> sa.ScalarSelect[Any]:
    return (
        sa.select(agent_commands.c.id)
        .where(
            agent_commands.c.org_id == org_id,
            agent_commands.c.runner_id == runner_id,
            agent_commands.c.state.in_(list(OPEN_STATES)),
        )
        .order_by(agent_commands.c.created_at, agent_commands.c.id)
        .limit(1)
        .scalar_subquery()
    )


async def head(conn: AsyncConnection, org_id: str, runner_id: str) -> AgentCommand | None:
    """The runner's oldest open command, unlocked (for a cheap look before claiming)."""
    row = (
        await conn.execute(agent_commands.select().where(agent_commands.c.id == _head_id(org_id, runner_id)))
    ).first()
    return _command(row) if row else None


async def lock_head(conn: AsyncConnection, org_id: str, runner_id: str) -> AgentCommand | None:
    """The runner's oldest open command, locked; None if there is none or another claim holds it."""
    row = (
        await conn.execute(
            agent_commands.select()
            .where(agent_commands.c.id == _head_id(org_id, runner_id))
            .with_for_update(skip_locked=True)
        )
    ).first()
    if row is None:
        return None
    command = _command(row)
    # PostgreSQL re-reads a row it waited for; a row closed meanwhile is no longer the head.
    return command if command.state in OPEN_STATES else None


async def lease(
    conn: AsyncConnection, command_id: str, *, attempt: int, until: datetime, now: datetime
) -> None:
    await conn.execute(
        agent_commands.update()
        .where(agent_commands.c.id == command_id)
        .values(state=CommandState.LEASED, attempt=attempt, available_at=until, updated_at=now)
    )


async def reschedule(
    conn: AsyncConnection, command_id: str, *, available_at: datetime, now: datetime
) -> None:
    """Back to pending, deliverable again from ``available_at`` (a retry)."""
    await conn.execute(
        agent_commands.update()
        .where(agent_commands.c.id == command_id)
        .values(state=CommandState.PENDING, available_at=available_at, updated_at=now)
    )


async def release_lease(conn: AsyncConnection, command_id: str, *, attempt: int, now: datetime) -> bool:
    """Back to pending and deliverable at once, if it is still leased as ``attempt`` (not answered, not
    delivered again since); False otherwise."""
    result = await conn.execute(
        agent_commands.update()
        .where(
            agent_commands.c.id == command_id,
            agent_commands.c.attempt == attempt,
            agent_commands.c.state == CommandState.LEASED,
        )
        .values(state=CommandState.PENDING, available_at=now, updated_at=now)
    )
    return result.rowcount > 0


async def close(
    conn: AsyncConnection, command_id: str, *, state: CommandState, now: datetime, reason: str | None = None
) -> bool:
    """Close an open command (acked, rejected, expired, cancelled); False if it was closed already."""
    result = await conn.execute(
        agent_commands.update()
        .where(agent_commands.c.id == command_id, agent_commands.c.state.in_(list(OPEN_STATES)))
        .values(state=state, completed_at=now, updated_at=now, reason=reason)
    )
    return result.rowcount > 0


async def cancel_for_deployment(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, now: datetime, reason: str
) -> None:
    """Nothing more is delivered for a deployment that is final."""
    await conn.execute(
        agent_commands.update()
        .where(
            agent_commands.c.deployment_id == deployment_id,
            agent_commands.c.state.in_(list(OPEN_STATES)),
        )
        .values(state=CommandState.CANCELLED, completed_at=now, updated_at=now, reason=reason)
    )


def expired_exists(now: datetime) -> sa.Exists:
    """Whether any open command is past its TTL, as a condition for ``deployments.work_due``."""
    return sa.exists(
        sa.select(agent_commands.c.id).where(
            agent_commands.c.state.in_(list(OPEN_STATES)), agent_commands.c.expires_at <= now
        )
    )


async def lock_expired(conn: AsyncConnection, *, now: datetime, limit: int) -> list[AgentCommand]:
    """Open commands past their TTL, locked (others' claims skip them)."""
    rows = (
        await conn.execute(
            agent_commands.select()
            .where(agent_commands.c.state.in_(list(OPEN_STATES)), agent_commands.c.expires_at <= now)
            .order_by(agent_commands.c.expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    return [_command(r) for r in rows]


async def runners_with_available(conn: AsyncConnection, *, now: datetime) -> set[tuple[str, str]]:
    """(org, runner) of every runner with a command deliverable now (the long polls' polling fallback)."""
    rows = (
        await conn.execute(
            sa.select(agent_commands.c.org_id, agent_commands.c.runner_id)
            .where(
                agent_commands.c.state.in_(list(OPEN_STATES)),
                agent_commands.c.available_at <= now,
                agent_commands.c.expires_at > now,
            )
            .distinct()
        )
    ).all()
    return {(r.org_id, r.runner_id) for r in rows}


async def for_deployment(conn: AsyncConnection, deployment_id: uuid.UUID) -> list[AgentCommand]:
    rows = (
        await conn.execute(
            agent_commands.select()
            .where(agent_commands.c.deployment_id == deployment_id)
            .order_by(agent_commands.c.created_at)
        )
    ).all()
    return [_command(r) for r in rows]


async def record_job_created(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, job_id: str, now: datetime
) -> None:
    await conn.execute(
        agent_commands.update()
        .where(agent_commands.c.deployment_id == deployment_id, agent_commands.c.job_created_at.is_(None))
        .values(job_id=job_id, job_created_at=now, updated_at=now)
    )


# --- events ---------------------------------------------------------------------------------------------


async def record_event(
    conn: AsyncConnection,
    *,
    org_id: str,
    runner_id: str,
    event_id: str,
    event_type: str,
    deployment_id: uuid.UUID,
    now: datetime,
) -> bool:
    """Note an event as applied; False if it was applied before (then apply nothing)."""
    return await inserted(
        conn,
        agent_event_inbox.insert().values(
            org_id=org_id,
            runner_id=runner_id,
            event_id=event_id,
            type=event_type,
            deployment_id=deployment_id,
            received_at=now,
        ),
    )


async def count_events(conn: AsyncConnection, org_id: str, runner_id: str) -> int:
    return int(
        (
            await conn.execute(
                sa.select(sa.func.count())
                .select_from(agent_event_inbox)
                .where(agent_event_inbox.c.org_id == org_id, agent_event_inbox.c.runner_id == runner_id)
            )
        ).scalar_one()
    )


# --- presence -------------------------------------------------------------------------------------------


async def touch_presences(conn: AsyncConnection, seen: dict[tuple[str, str], datetime]) -> int:
    """Record when each runner's agent last asked for a command (one upsert per runner; runners deleted
    meanwhile are skipped, also one deleted while this runs); how many were recorded."""
    if not seen:
        return 0
    for attempt in (1, 2):
        values = await _existing_presences(conn, seen)
        if not values:
            return 0
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        stmt = insert(agent_presence)
        upsert = stmt.on_conflict_do_update(
            index_elements=[agent_presence.c.org_id, agent_presence.c.runner_id],
            set_={"last_seen_at": stmt.excluded.last_seen_at},
        )
        try:
            async with conn.begin_nested():
                await conn.execute(upsert, values)
        except sqlalchemy.exc.IntegrityError:
            # A runner was deleted after it was looked up: look again, once.
            if attempt == 2:
                raise
            continue
        return len(values)
    return 0


async def _existing_presences(
    conn: AsyncConnection, seen: dict[tuple[str, str], datetime]
) -> list[dict[str, Any]]:
    keys = list(seen)
    existing = {
        (row.org_id, row.id)
        for row in (
            await conn.execute(
                sa.select(runners.c.org_id, runners.c.id).where(
                    sa.tuple_(runners.c.org_id, runners.c.id).in_(keys)
                )
            )
        ).all()
    }
    return [
        {"org_id": org_id, "runner_id": runner_id, "last_seen_at": seen[(org_id, runner_id)]}
        for org_id, runner_id in keys
        if (org_id, runner_id) in existing
    ]


async def last_seen(conn: AsyncConnection, org_id: str, runner_id: str) -> datetime | None:
    value = (
        await conn.execute(
            sa.select(agent_presence.c.last_seen_at).where(
                agent_presence.c.org_id == org_id, agent_presence.c.runner_id == runner_id
            )
        )
    ).scalar_one_or_none()
    return value


async def open_count(conn: AsyncConnection) -> int:
    """How many commands are open (pending or leased), of every runner."""
    stmt = (
        sa.select(sa.func.count()).select_from(agent_commands).where(agent_commands.c.state.in_(OPEN_STATES))
    )
    return int((await conn.execute(stmt)).scalar_one())
