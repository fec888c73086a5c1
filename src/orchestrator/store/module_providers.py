"""Module providers: OpenTofu provider configurations, keyed ``(provider_type, id)`` per organization."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import ModuleProvider
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import created_now, insert_row
from orchestrator.store.schema import module_providers


def _provider(row: sa.Row[tuple[object, ...]]) -> ModuleProvider:
    return ModuleProvider(**row._mapping)


def _key(org_id: str, provider_type: str, provider_id: str) -> sa.ColumnElement[bool]:
    return sa.and_(
        module_providers.c.org_id == org_id,
        module_providers.c.provider_type == provider_type,
        module_providers.c.id == provider_id,
    )


async def create_provider(
    conn: AsyncConnection,
    *,
    org_id: str,
    provider_type: str,
    provider_id: str,
    description: str | None,
    source: str,
    version_constraint: str,
    configuration: dict[str, Any],
    configuration_sealed: str | None,
) -> ModuleProvider:
    """``configuration`` as answered (credentials as "SECRET"), ``configuration_sealed`` the whole one."""
    values = {
        "org_id": org_id,
        "provider_type": provider_type,
        "id": provider_id,
        "description": description,
        "source": source,
        "version_constraint": version_constraint,
        "configuration": configuration,
        "configuration_sealed": configuration_sealed,
        **created_now(),
    }
    return await insert_row(
        conn,
        module_providers,
        values,
        ModuleProvider,
        conflict=f"module provider '{provider_type}.{provider_id}' already exists",
    )


async def get_provider(
    conn: AsyncConnection, org_id: str, provider_type: str, provider_id: str
) -> ModuleProvider | None:
    row = (
        await conn.execute(module_providers.select().where(_key(org_id, provider_type, provider_id)))
    ).first()
    return _provider(row) if row else None


async def get_providers(
    conn: AsyncConnection, org_id: str, keys: Iterable[tuple[str, str]]
) -> dict[str, ModuleProvider]:
    """The existing ones among ``(provider_type, id)`` pairs, by ``provider_type.id``."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    rows = (
        await conn.execute(
            module_providers.select().where(
                module_providers.c.org_id == org_id,
                sa.tuple_(module_providers.c.provider_type, module_providers.c.id).in_(wanted),
            )
        )
    ).all()
    found = [_provider(row) for row in rows]
    return {p.key: p for p in found}


async def list_providers(
    conn: AsyncConnection,
    org_id: str,
    *,
    provider_type: str | None,
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[ModuleProvider]:
    stmt = module_providers.select().where(module_providers.c.org_id == org_id)
    if provider_type is not None:
        stmt = stmt.where(module_providers.c.provider_type == provider_type)
    key = [module_providers.c.provider_type, module_providers.c.id]
    return await fetch_page(conn, stmt, key, after, limit, _provider)


async def update_provider(
    conn: AsyncConnection, org_id: str, provider_type: str, provider_id: str, **changes: Any
) -> ModuleProvider | None:
    """Change ``description``, ``version_constraint`` or ``configuration`` with ``configuration_sealed``
    (type, id and source are fixed)."""
    if changes:
        await conn.execute(
            module_providers.update()
            .where(_key(org_id, provider_type, provider_id))
            .values(**changes, updated_at=datetime.now(UTC))
        )
    return await get_provider(conn, org_id, provider_type, provider_id)


async def unsealed(conn: AsyncConnection) -> list[ModuleProvider]:
    """Providers whose configuration is stored in clear (rows from before sealing), every organization's."""
    rows = (
        await conn.execute(module_providers.select().where(module_providers.c.configuration_sealed.is_(None)))
    ).all()
    return [_provider(row) for row in rows]


async def seal(
    conn: AsyncConnection, provider: ModuleProvider, *, configuration: dict[str, Any], sealed: str
) -> bool:
    """Replace a clear configuration by its answered form and the sealed whole; False if another server
    sealed it first."""
    result = await conn.execute(
        module_providers.update()
        .where(
            _key(provider.org_id, provider.provider_type, provider.id),
            module_providers.c.configuration_sealed.is_(None),
        )
        .values(configuration=configuration, configuration_sealed=sealed)
    )
    return result.rowcount > 0


async def delete_provider(conn: AsyncConnection, org_id: str, provider_type: str, provider_id: str) -> bool:
    """Delete a provider (whether it may go is ``dispatch.catalogue.delete_provider``'s decision)."""
    result = await conn.execute(module_providers.delete().where(_key(org_id, provider_type, provider_id)))
    return result.rowcount > 0
