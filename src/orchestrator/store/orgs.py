"""Organizations and API tokens."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import ApiToken, Organization
from orchestrator.errors import InvalidInputError
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import created_now, entity, insert_row
from orchestrator.store.schema import api_tokens, orgs


def _org(row: sa.Row[tuple[object, ...]]) -> Organization:
    return entity(Organization, row)


async def create_org(conn: AsyncConnection, *, org_id: str, created_by: str) -> Organization:
    values = {
        "id": org_id,
        "uuid": uuid.uuid4(),
        "status": "active",
        "created_by": created_by,
        **created_now(),
    }
    return await insert_row(
        conn, orgs, values, Organization, conflict=f"organization '{org_id}' already exists"
    )


async def get_org(conn: AsyncConnection, org_id: str) -> Organization | None:
    row = (await conn.execute(orgs.select().where(orgs.c.id == org_id))).first()
    return _org(row) if row else None


async def list_orgs(
    conn: AsyncConnection, *, only: str | None, after: tuple[str, ...] | None, limit: int
) -> Page[Organization]:
    stmt = orgs.select()
    if only is not None:
        stmt = stmt.where(orgs.c.id == only)
    return await fetch_page(conn, stmt, [orgs.c.id], after, limit, _org)


def _token(row: sa.Row[tuple[object, ...]]) -> ApiToken:
    return entity(ApiToken, row)


async def create_token(
    conn: AsyncConnection,
    *,
    org_id: str | None,
    role: str,
    description: str,
    token_hash: str,
    prefix: str,
    expires_at: datetime | None = None,
    token_id: uuid.UUID | None = None,
) -> ApiToken:
    values = {
        "id": token_id or uuid.uuid4(),
        "org_id": org_id,
        "role": role,
        "description": description,
        "token_hash": token_hash,
        "prefix": prefix,
        "created_at": datetime.now(UTC),
        "expires_at": expires_at,
    }
    return await insert_row(conn, api_tokens, values, ApiToken, conflict="token already exists")


async def replace_platform_token(conn: AsyncConnection, *, token_id: uuid.UUID, token_hash: str) -> None:
    """Install the bootstrap token: one fixed row, replaced whenever the configured value changes."""
    await conn.execute(api_tokens.delete().where(api_tokens.c.id == token_id))
    await conn.execute(api_tokens.delete().where(api_tokens.c.token_hash == token_hash))
    await create_token(
        conn,
        org_id=None,
        role="platform-admin",
        description="bootstrap token (PO_BOOTSTRAP_TOKEN)",
        token_hash=token_hash,
        prefix="bootstrap",
        token_id=token_id,
    )


async def rehash_token(conn: AsyncConnection, token_id: uuid.UUID, *, old_hash: str, new_hash: str) -> bool:
    """Replace a token's stored hash (an upgrade to another hash of the same token); False if the row
    no longer holds ``old_hash`` (another request upgraded it first, or it was deleted)."""
    result = await conn.execute(
        api_tokens.update()
        .where(api_tokens.c.id == token_id, api_tokens.c.token_hash == old_hash)
        .values(token_hash=new_hash)
    )
    return result.rowcount > 0


async def find_token(conn: AsyncConnection, token_hash: str) -> ApiToken | None:
    row = (await conn.execute(api_tokens.select().where(api_tokens.c.token_hash == token_hash))).first()
    return _token(row) if row else None


async def list_tokens(
    conn: AsyncConnection, org_id: str, *, after: tuple[str, ...] | None, limit: int
) -> Page[ApiToken]:
    stmt = api_tokens.select().where(api_tokens.c.org_id == org_id)
    try:
        after_key = (uuid.UUID(after[0]),) if after else None
    except ValueError as exc:
        raise InvalidInputError("page: invalid page token") from exc
    return await fetch_page(conn, stmt, [api_tokens.c.id], after_key, limit, _token)


async def delete_token(conn: AsyncConnection, org_id: str, token_id: uuid.UUID) -> bool:
    result = await conn.execute(
        api_tokens.delete().where(api_tokens.c.org_id == org_id, api_tokens.c.id == token_id)
    )
    return result.rowcount > 0
