"""Terraform state kept by the orchestrator (state storage ``orchestrator``): versions (their description,
pages newest first, retention) and the lock."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.state_versions import Kind, StateVersion, Summary
from orchestrator.errors import InvalidInputError
from orchestrator.store.pages import Page, to_page
from orchestrator.store.rows import entity, inserted
from orchestrator.store.schema import tf_state_locks, tf_states

#: Built once: Terraform reads the state several times a deployment (init, apply).
_LATEST = (
    sa.select(tf_states.c.version, tf_states.c.data)
    .where(tf_states.c.env_uuid == sa.bindparam("env_uuid"))
    .order_by(tf_states.c.version.desc())
    .limit(1)
)
_LOCK = sa.select(tf_state_locks).where(tf_state_locks.c.env_uuid == sa.bindparam("env_uuid"))


async def latest(conn: AsyncConnection, env_uuid: uuid.UUID) -> tuple[int, str] | None:
    """(version, sealed data) of the newest state, or None."""
    row = (await conn.execute(_LATEST, {"env_uuid": env_uuid})).first()
    return (row.version, row.data) if row else None


async def versions(conn: AsyncConnection, env_uuid: uuid.UUID) -> list[int]:
    return list(
        (
            await conn.execute(
                sa.select(tf_states.c.version)
                .where(tf_states.c.env_uuid == env_uuid)
                .order_by(tf_states.c.version)
            )
        ).scalars()
    )


async def add_version(
    conn: AsyncConnection,
    *,
    org_id: str,
    env_uuid: uuid.UUID,
    data: str,
    md5: str,
    size: int,
    deployment_id: uuid.UUID | None,
    now: datetime,
    summary: Summary | None = None,
    kind: str = Kind.TERRAFORM,
    rolled_back_from: int | None = None,
    created_by: str | None = None,
) -> int:
    """Add the environment's next version (sealed ``data``); its number."""
    current = (
        await conn.execute(
            sa.select(sa.func.max(tf_states.c.version)).where(tf_states.c.env_uuid == env_uuid)
        )
    ).scalar_one_or_none()
    version = (current or 0) + 1
    await conn.execute(
        tf_states.insert().values(
            env_uuid=env_uuid,
            version=version,
            org_id=org_id,
            data=data,
            md5=md5,
            size=size,
            deployment_id=deployment_id,
            created_at=now,
            serial=summary.serial if summary else None,
            lineage=summary.lineage if summary else None,
            resources=summary.resources if summary else None,
            kind=kind,
            rolled_back_from=rolled_back_from,
            created_by=created_by,
        )
    )
    return version


#: The columns of a version's description (everything but the sealed document).
_DESCRIPTION = [column for column in tf_states.c if column.name != "data"]


def _version(row: sa.Row[tuple[object, ...]]) -> StateVersion:
    return entity(StateVersion, row)


async def list_page(
    conn: AsyncConnection, env_uuid: uuid.UUID, *, after: tuple[str, ...] | None, limit: int
) -> Page[StateVersion]:
    """The environment's versions, newest first; ``after``: the page key (a version number) to go on
    after."""
    stmt = sa.select(*_DESCRIPTION).where(tf_states.c.env_uuid == env_uuid)
    if after is not None:
        try:
            last = int(after[0])
        except (ValueError, IndexError) as exc:
            raise InvalidInputError("page: invalid page token") from exc
        stmt = stmt.where(tf_states.c.version < last)
    stmt = stmt.order_by(tf_states.c.version.desc()).limit(limit + 1)
    items = [_version(row) for row in (await conn.execute(stmt)).all()]
    return to_page(items, limit, lambda item: (item.version,))


async def get_version(conn: AsyncConnection, env_uuid: uuid.UUID, version: int) -> StateVersion | None:
    row = (
        await conn.execute(
            sa.select(*_DESCRIPTION).where(tf_states.c.env_uuid == env_uuid, tf_states.c.version == version)
        )
    ).first()
    return _version(row) if row else None


async def sealed_data(conn: AsyncConnection, env_uuid: uuid.UUID, version: int) -> str | None:
    """The sealed document of a version, or None."""
    found: str | None = (
        await conn.execute(
            sa.select(tf_states.c.data).where(
                tf_states.c.env_uuid == env_uuid, tf_states.c.version == version
            )
        )
    ).scalar_one_or_none()
    return found


async def newest_version(conn: AsyncConnection, env_uuid: uuid.UUID) -> int | None:
    """The number of the current (newest) version, or None when there is none."""
    found: int | None = (
        await conn.execute(
            sa.select(sa.func.max(tf_states.c.version)).where(tf_states.c.env_uuid == env_uuid)
        )
    ).scalar_one_or_none()
    return found


async def prune(conn: AsyncConnection, env_uuid: uuid.UUID, *, keep: int, newest: int | None = None) -> int:
    """Delete the versions beyond the newest ``keep`` (at least 1: the current one always stays); how
    many went. ``newest``: the newest version's number, when the caller knows it."""
    if newest is None:
        newest = await newest_version(conn, env_uuid)
    if newest is None:
        return 0
    result = await conn.execute(
        tf_states.delete().where(
            tf_states.c.env_uuid == env_uuid, tf_states.c.version <= newest - max(keep, 1)
        )
    )
    return result.rowcount


async def get_lock(conn: AsyncConnection, env_uuid: uuid.UUID) -> dict[str, Any] | None:
    row = (await conn.execute(_LOCK, {"env_uuid": env_uuid})).first()
    return dict(row._mapping) if row else None


async def try_lock(
    conn: AsyncConnection,
    *,
    org_id: str,
    env_uuid: uuid.UUID,
    lock_id: str,
    info: dict[str, Any],
    deployment_id: uuid.UUID | None,
    now: datetime,
) -> dict[str, Any] | None:
    """Take the lock; None on success, else the holder's row (``lock_id``, ``info``, ``deployment_id``).
    The primary key arbitrates races."""
    lock = tf_state_locks.insert().values(
        env_uuid=env_uuid,
        org_id=org_id,
        lock_id=lock_id,
        info=info,
        deployment_id=deployment_id,
        created_at=now,
    )
    if await inserted(conn, lock):
        return None
    holder = await get_lock(conn, env_uuid)
    return holder if holder else {"lock_id": "", "info": {}, "deployment_id": None}


async def release_held_by(conn: AsyncConnection, env_uuid: uuid.UUID, deployment_id: uuid.UUID) -> bool:
    """Drop a lock the deployment still holds (it ended without unlocking: killed, timed out)."""
    result = await conn.execute(
        tf_state_locks.delete().where(
            tf_state_locks.c.env_uuid == env_uuid, tf_state_locks.c.deployment_id == deployment_id
        )
    )
    return result.rowcount > 0


async def unlock_held(conn: AsyncConnection, env_uuid: uuid.UUID, lock_id: str) -> None:
    """Drop the lock if it is held under ``lock_id``."""
    await conn.execute(
        tf_state_locks.delete().where(
            tf_state_locks.c.env_uuid == env_uuid, tf_state_locks.c.lock_id == lock_id
        )
    )


async def unlock(conn: AsyncConnection, env_uuid: uuid.UUID) -> None:
    await conn.execute(tf_state_locks.delete().where(tf_state_locks.c.env_uuid == env_uuid))


async def delete_env(conn: AsyncConnection, env_uuid: uuid.UUID) -> None:
    await conn.execute(tf_state_locks.delete().where(tf_state_locks.c.env_uuid == env_uuid))
    await conn.execute(tf_states.delete().where(tf_states.c.env_uuid == env_uuid))
