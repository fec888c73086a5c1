"""Resource types of an organization."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import ResourceType
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import created_now, insert_row, org_entity, update_org_row
from orchestrator.store.schema import resource_types


def _resource_type(row: sa.Row[tuple[object, ...]]) -> ResourceType:
    return ResourceType(**row._mapping)


async def create_resource_type(
    conn: AsyncConnection,
    *,
    org_id: str,
    type_id: str,
    description: str | None,
    output_schema: dict[str, Any],
    is_developer_accessible: bool,
    built_in: bool = False,
) -> ResourceType:
    values = {
        "org_id": org_id,
        "id": type_id,
        "description": description,
        "output_schema": output_schema,
        "is_developer_accessible": is_developer_accessible,
        "built_in": built_in,
        **created_now(),
    }
    return await insert_row(
        conn, resource_types, values, ResourceType, conflict=f"resource type '{type_id}' already exists"
    )


async def get_resource_type(conn: AsyncConnection, org_id: str, type_id: str) -> ResourceType | None:
    return await org_entity(conn, resource_types, ResourceType, org_id, type_id)


async def get_resource_types(
    conn: AsyncConnection, org_id: str, type_ids: Iterable[str]
) -> dict[str, ResourceType]:
    """The existing ones among ``type_ids``, by id."""
    wanted = sorted(set(type_ids))
    if not wanted:
        return {}
    rows = (
        await conn.execute(
            resource_types.select().where(resource_types.c.org_id == org_id, resource_types.c.id.in_(wanted))
        )
    ).all()
    return {row.id: _resource_type(row) for row in rows}


async def list_resource_types(
    conn: AsyncConnection, org_id: str, *, after: tuple[str, ...] | None, limit: int
) -> Page[ResourceType]:
    stmt = resource_types.select().where(resource_types.c.org_id == org_id)
    return await fetch_page(conn, stmt, [resource_types.c.id], after, limit, _resource_type)


async def update_resource_type(
    conn: AsyncConnection, org_id: str, type_id: str, **changes: Any
) -> ResourceType | None:
    """Change ``description``, ``output_schema`` or ``is_developer_accessible``."""
    if changes:
        await update_org_row(conn, resource_types, org_id, type_id, changes)
    return await get_resource_type(conn, org_id, type_id)


async def delete_resource_type(conn: AsyncConnection, org_id: str, type_id: str) -> bool:
    """Delete a type (whether it may go is ``dispatch.catalogue.delete_resource_type``'s decision)."""
    with conflict_on_integrity(f"resource type '{type_id}' is in use"):
        result = await conn.execute(
            resource_types.delete().where(resource_types.c.org_id == org_id, resource_types.c.id == type_id)
        )
    return result.rowcount > 0
