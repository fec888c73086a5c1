"""The key check value of the server key (``secretbox.key_check_value``), recorded once per database."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.rows import inserted
from orchestrator.store.schema import key_checks

SERVER_KEY = "server"


async def get(conn: AsyncConnection, key_id: str = SERVER_KEY) -> str | None:
    found: str | None = (
        await conn.execute(sa.select(key_checks.c.check_value).where(key_checks.c.id == key_id))
    ).scalar_one_or_none()
    return found


async def record_once(
    conn: AsyncConnection, check_value: str, *, now: datetime, key_id: str = SERVER_KEY
) -> str:
    """The recorded check value; ``check_value`` is recorded if there is none yet (a new database, or one
    upgraded from before check values). Of replicas starting at once on a new database, the first wins."""
    stored = await get(conn, key_id)
    if stored is not None:
        return stored
    await inserted(conn, key_checks.insert().values(id=key_id, check_value=check_value, created_at=now))
    recorded = await get(conn, key_id)
    assert recorded is not None
    return recorded
