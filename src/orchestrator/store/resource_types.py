"""Resource types of an organization."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import ResourceType
from orchestrator.errors import ConflictError
from orchestrator.store import modules as module_store
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, paged, to_page
from orchestrator.store.schema import modules, resource_types


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
    now = datetime.now(UTC)
    values = {
        "org_id": org_id,
        "id": type_id,
        "description": description,
        "output_schema": output_schema,
        "is_developer_accessible": is_developer_accessible,
        "built_in": built_in,
        "created_at": now,
        "updated_at": now,
    }
    with conflict_on_integrity(f"resource type '{type_id}' already exists"):
        await conn.execute(resource_types.insert().values(values))
    return ResourceType(**values)  # type: ignore[arg-type]


async def get_resource_type(conn: AsyncConnection, org_id: str, type_id: str) -> ResourceType | None:
    row = (
        await conn.execute(
            resource_types.select().where(resource_types.c.org_id == org_id, resource_types.c.id == type_id)
        )
    ).first()
    return _resource_type(row) if row else None


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
    rows = (await conn.execute(paged(stmt, [resource_types.c.id], after, limit))).all()
    return to_page([_resource_type(r) for r in rows], limit, lambda t: (t.id,))


async def update_resource_type(
    conn: AsyncConnection, org_id: str, type_id: str, **changes: Any
) -> ResourceType | None:
    """Change ``description``, ``output_schema`` or ``is_developer_accessible``; built-in types are fixed."""
    current = await get_resource_type(conn, org_id, type_id)
    if current is None:
        return None
    if current.built_in:
        raise ConflictError(f"resource type '{type_id}' is built in and cannot be changed")
    if changes:
        await conn.execute(
            resource_types.update()
            .where(resource_types.c.org_id == org_id, resource_types.c.id == type_id)
            .values(**changes, updated_at=datetime.now(UTC))
        )
    return await get_resource_type(conn, org_id, type_id)


async def delete_resource_type(conn: AsyncConnection, org_id: str, type_id: str) -> bool:
    """Delete a custom type that no module provisions or asks for (as dependency or co-provisioned)."""
    current = await get_resource_type(conn, org_id, type_id)
    if current is None:
        return False
    if current.built_in:
        raise ConflictError(f"resource type '{type_id}' is built in and cannot be deleted")
    provisioning = (
        (
            await conn.execute(
                sa.select(modules.c.id)
                .where(modules.c.org_id == org_id, modules.c.resource_type == type_id)
                .order_by(modules.c.id)
                .limit(20)
            )
        )
        .scalars()
        .all()
    )
    if provisioning:
        raise ConflictError(
            f"resource type '{type_id}' is provisioned by the modules: {', '.join(provisioning)}"
        )
    requesting = await module_store.modules_requesting_type(conn, org_id, type_id)
    if requesting:
        raise ConflictError(
            f"resource type '{type_id}' is a dependency or co-provisioned resource of the modules: "
            f"{', '.join(requesting)}"
        )
    with conflict_on_integrity(f"resource type '{type_id}' is in use"):
        result = await conn.execute(
            resource_types.delete().where(resource_types.c.org_id == org_id, resource_types.c.id == type_id)
        )
    return result.rowcount > 0
