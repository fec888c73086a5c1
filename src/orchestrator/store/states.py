"""Terraform state kept by the orchestrator (state storage ``orchestrator``): versions and the lock."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.rows import inserted
from orchestrator.store.schema import tf_state_locks, tf_states


async def latest(conn: AsyncConnection, env_uuid: uuid.UUID) -> tuple[int, str] | None:
    """(version, sealed data) of the newest state, or None."""
    row = (
        await conn.execute(
            sa.select(tf_states.c.version, tf_states.c.data)
            .where(tf_states.c.env_uuid == env_uuid)
            .order_by(tf_states.c.version.desc())
            .limit(1)
        )
    ).first()
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
) -> int:
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
        )
    )
    return version


async def get_lock(conn: AsyncConnection, env_uuid: uuid.UUID) -> dict[str, Any] | None:
    row = (await conn.execute(sa.select(tf_state_locks).where(tf_state_locks.c.env_uuid == env_uuid))).first()
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


async def unlock(conn: AsyncConnection, env_uuid: uuid.UUID) -> None:
    await conn.execute(tf_state_locks.delete().where(tf_state_locks.c.env_uuid == env_uuid))


async def delete_env(conn: AsyncConnection, env_uuid: uuid.UUID) -> None:
    await conn.execute(tf_state_locks.delete().where(tf_state_locks.c.env_uuid == env_uuid))
    await conn.execute(tf_states.delete().where(tf_states.c.env_uuid == env_uuid))
