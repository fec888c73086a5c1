"""The OIDC issuer's signing keys (``identity/`` holds the policy: when a key is made, signs, goes).

Rows only: ``private_key_sealed`` arrives sealed and leaves sealed; this module never sees a key in clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.schema import signing_keys


@dataclass(frozen=True, kw_only=True)
class SigningKeyRow:
    kid: str
    #: 1 for the first key, each next key one more.
    generation: int
    algorithm: str
    #: The public key as a JWK, JSON text.
    public_jwk: str
    #: The private key sealed with the server key (``secretbox``), context ``signing-key:<kid>``.
    private_key_sealed: str
    created_at: datetime
    signs_from: datetime


async def all_keys(conn: AsyncConnection) -> list[SigningKeyRow]:
    """Every stored key, oldest generation first."""
    rows = await conn.execute(signing_keys.select().order_by(signing_keys.c.generation))
    return [SigningKeyRow(**row._mapping) for row in rows]


async def insert(conn: AsyncConnection, key: SigningKeyRow) -> bool:
    """Insert the key; False (and nothing written) when another replica stored a key of its generation
    first: then that one is the key of this generation."""
    insert_ = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    values = {
        "kid": key.kid,
        "generation": key.generation,
        "algorithm": key.algorithm,
        "public_jwk": key.public_jwk,
        "private_key_sealed": key.private_key_sealed,
        "created_at": key.created_at,
        "signs_from": key.signs_from,
    }
    result = await conn.execute(insert_(signing_keys).values(**values).on_conflict_do_nothing())
    return bool(result.rowcount)


async def delete(conn: AsyncConnection, kids: Sequence[str]) -> int:
    """Delete the keys named; how many were there."""
    if not kids:
        return 0
    result = await conn.execute(sa.delete(signing_keys).where(signing_keys.c.kid.in_(list(kids))))
    return int(result.rowcount)
