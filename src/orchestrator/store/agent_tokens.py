"""Agent tokens (JWTs) the gateway replicas have accepted, kept until they expire.

Each replica keeps the uses it accepted in memory and writes them here in batches (``record``), and reads
the other replicas' batches (``recorded_since``), so that a token replayed to another replica, or to this
one after a restart, is recognised (``gateway.token_uses``). Expired rows go with ``prune``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.schema import agent_token_uses


@dataclass(frozen=True, kw_only=True)
class TokenUse:
    #: Hex SHA-256 naming the token (``protocol.agent_auth.use_key``).
    digest: str
    replica: str
    first_used_at: datetime
    expires_at: datetime
    #: Until when the same token is accepted again (tokens without ``jti``); None: never.
    reusable_until: datetime | None


async def record(conn: AsyncConnection, uses: Sequence[TokenUse]) -> None:
    """Insert the uses; a digest another replica recorded first keeps its row."""
    if not uses:
        return
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(agent_token_uses).on_conflict_do_nothing(index_elements=[agent_token_uses.c.digest])
    await conn.execute(
        stmt,
        [
            {
                "digest": use.digest,
                "replica": use.replica,
                "first_used_at": use.first_used_at,
                "expires_at": use.expires_at,
                "reusable_until": use.reusable_until,
            }
            for use in uses
        ],
    )


async def recorded_since(
    conn: AsyncConnection, since: datetime, *, now: datetime, other_than: str
) -> list[TokenUse]:
    """Unexpired uses first seen at or after ``since`` by replicas other than ``other_than``."""
    c = agent_token_uses.c
    rows = (
        await conn.execute(
            agent_token_uses.select().where(
                c.first_used_at >= since, c.expires_at > now, c.replica != other_than
            )
        )
    ).all()
    return [TokenUse(**row._mapping) for row in rows]


async def prune(conn: AsyncConnection, *, now: datetime) -> int:
    """Delete the uses of tokens that expired before ``now``; how many."""
    result = await conn.execute(agent_token_uses.delete().where(agent_token_uses.c.expires_at < now))
    return int(result.rowcount)
