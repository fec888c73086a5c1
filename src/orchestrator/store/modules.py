"""Modules and their immutable versions.

A module row holds the current content; every change of content inserts a ``module_versions`` row with
the same content and points ``modules.version_id`` at it, in the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import (
    Module,
    ModuleContent,
    ModuleParam,
    ModuleVersion,
    ResourceRequest,
    mentions_type,
)
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, fetch_page, newest_first, newest_key, to_page
from orchestrator.store.rows import entity, first_values
from orchestrator.store.schema import module_versions, modules

_CONTENT_COLUMNS = (
    "description",
    "module_source",
    "module_source_code",
    "module_params",
    "module_inputs",
    "provider_mapping",
    "dependencies",
    "coprovisioned",
)


def _request_json(request: ResourceRequest, *, coprovisioned: bool) -> dict[str, Any]:
    # Stored in upstream's manifest shape ({type, class?, id?, params?}), as the API answers it.
    out: dict[str, Any] = {"type": request.type}
    if request.resource_class is not None:
        out["class"] = request.resource_class
    if request.resource_id is not None:
        out["id"] = request.resource_id
    if request.params:
        out["params"] = request.params
    if coprovisioned:
        out["is_dependent_on_current"] = request.is_dependent_on_current
        out["copy_dependents_from_current"] = request.copy_dependents_from_current
    return out


def _request(data: Mapping[str, Any]) -> ResourceRequest:
    return ResourceRequest(
        type=data["type"],
        resource_class=data.get("class"),
        resource_id=data.get("id"),
        params=data.get("params") or {},
        is_dependent_on_current=data.get("is_dependent_on_current", False),
        copy_dependents_from_current=data.get("copy_dependents_from_current", False),
    )


def _content_values(content: ModuleContent) -> dict[str, Any]:
    return {
        "description": content.description,
        "module_source": content.module_source,
        "module_source_code": content.module_source_code,
        "module_params": {
            name: {"type": p.type, "is_optional": p.is_optional, "description": p.description}
            for name, p in content.module_params.items()
        },
        "module_inputs": content.module_inputs,
        "provider_mapping": content.provider_mapping,
        "dependencies": {
            alias: _request_json(d, coprovisioned=False) for alias, d in content.dependencies.items()
        },
        "coprovisioned": [_request_json(c, coprovisioned=True) for c in content.coprovisioned],
    }


def _content(m: Mapping[Any, Any]) -> ModuleContent:
    return ModuleContent(
        description=m["description"],
        module_source=m["module_source"],
        module_source_code=m["module_source_code"],
        module_params={
            name: ModuleParam(
                type=p["type"], is_optional=p.get("is_optional", False), description=p.get("description")
            )
            for name, p in m["module_params"].items()
        },
        module_inputs=m["module_inputs"],
        provider_mapping=m["provider_mapping"],
        dependencies={alias: _request(d) for alias, d in m["dependencies"].items()},
        coprovisioned=tuple(_request(c) for c in m["coprovisioned"]),
    )


def _module(row: sa.Row[tuple[object, ...]]) -> Module:
    return entity(Module, row, content=_content(row._mapping))


def _version(row: sa.Row[tuple[object, ...]]) -> ModuleVersion:
    return entity(ModuleVersion, row, content=_content(row._mapping))


async def _insert_version(
    conn: AsyncConnection,
    *,
    version_id: uuid.UUID,
    org_id: str,
    module_id: str,
    resource_type: str,
    content: ModuleContent,
    now: datetime,
) -> None:
    await conn.execute(
        module_versions.insert().values(
            id=version_id,
            org_id=org_id,
            module_id=module_id,
            resource_type=resource_type,
            created_at=now,
            **_content_values(content),
        )
    )


async def create_module(
    conn: AsyncConnection, *, org_id: str, module_id: str, resource_type: str, content: ModuleContent
) -> Module:
    """Insert a module and its first version (checked by ``dispatch.catalogue.create_module``)."""
    now = datetime.now(UTC)
    version_id = uuid.uuid4()
    with conflict_on_integrity(f"module '{module_id}' already exists"):
        await conn.execute(
            modules.insert().values(
                org_id=org_id,
                id=module_id,
                uuid=uuid.uuid4(),
                resource_type=resource_type,
                version_id=version_id,
                created_at=now,
                updated_at=now,
                **_content_values(content),
            )
        )
    await _insert_version(
        conn,
        version_id=version_id,
        org_id=org_id,
        module_id=module_id,
        resource_type=resource_type,
        content=content,
        now=now,
    )
    module = await get_module(conn, org_id, module_id)
    assert module is not None
    return module


async def get_module(
    conn: AsyncConnection, org_id: str, module_id: str, *, for_update: bool = False
) -> Module | None:
    stmt = modules.select().where(modules.c.org_id == org_id, modules.c.id == module_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return _module(row) if row else None


async def get_modules(conn: AsyncConnection, org_id: str, module_ids: Iterable[str]) -> dict[str, Module]:
    """The existing ones among ``module_ids``, by id."""
    wanted = sorted(set(module_ids))
    if not wanted:
        return {}
    rows = (
        await conn.execute(modules.select().where(modules.c.org_id == org_id, modules.c.id.in_(wanted)))
    ).all()
    return {row.id: _module(row) for row in rows}


async def list_modules(
    conn: AsyncConnection,
    org_id: str,
    *,
    resource_type: str | None,
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[Module]:
    stmt = modules.select().where(modules.c.org_id == org_id)
    if resource_type is not None:
        stmt = stmt.where(modules.c.resource_type == resource_type)
    return await fetch_page(conn, stmt, [modules.c.id], after, limit, _module)


async def update_module(conn: AsyncConnection, current: Module, content: ModuleContent) -> Module:
    """Make ``content`` current, as a new version (checked by ``dispatch.catalogue.update_module``)."""
    org_id, module_id = current.org_id, current.id
    now = datetime.now(UTC)
    version_id = uuid.uuid4()
    await _insert_version(
        conn,
        version_id=version_id,
        org_id=org_id,
        module_id=module_id,
        resource_type=current.resource_type,
        content=content,
        now=now,
    )
    await conn.execute(
        modules.update()
        .where(modules.c.org_id == org_id, modules.c.id == module_id)
        .values(version_id=version_id, updated_at=now, **_content_values(content))
    )
    updated = await get_module(conn, org_id, module_id)
    assert updated is not None
    return updated


async def delete_module(conn: AsyncConnection, org_id: str, module_id: str) -> bool:
    """Delete a module with all its versions (that no rule names it is ``dispatch.catalogue``'s check)."""
    with conflict_on_integrity(f"module '{module_id}' is in use"):
        result = await conn.execute(
            modules.delete().where(modules.c.org_id == org_id, modules.c.id == module_id)
        )
    return result.rowcount > 0


async def modules_of_type(conn: AsyncConnection, org_id: str, type_id: str, *, limit: int) -> list[str]:
    """Ids of the modules provisioning ``type_id``, the first ``limit`` by id."""
    where = (modules.c.org_id == org_id, modules.c.resource_type == type_id)
    return await first_values(conn, modules.c.id, *where, limit=limit)


async def list_versions(
    conn: AsyncConnection, org_id: str, module_id: str, *, after: tuple[str, ...] | None, limit: int
) -> Page[ModuleVersion]:
    """The versions of a module, newest first."""
    stmt = module_versions.select().where(
        module_versions.c.org_id == org_id, module_versions.c.module_id == module_id
    )
    stmt = newest_first(stmt, module_versions.c.created_at, module_versions.c.id, after, limit)
    rows = (await conn.execute(stmt)).all()
    return to_page([_version(r) for r in rows], limit, newest_key)


async def get_version(
    conn: AsyncConnection, org_id: str, module_id: str, version_id: uuid.UUID
) -> ModuleVersion | None:
    row = (
        await conn.execute(
            module_versions.select().where(
                module_versions.c.org_id == org_id,
                module_versions.c.module_id == module_id,
                module_versions.c.id == version_id,
            )
        )
    ).first()
    return _version(row) if row else None


async def _all_contents(conn: AsyncConnection, org_id: str) -> list[tuple[str, ModuleContent]]:
    # The references live in JSON columns; an organization holds tens to hundreds of modules, so filtering
    # in Python is simpler than per-dialect JSON queries.
    rows = (
        await conn.execute(
            sa.select(modules.c.id, *(modules.c[name] for name in _CONTENT_COLUMNS))
            .where(modules.c.org_id == org_id)
            .order_by(modules.c.id)
        )
    ).all()
    return [(row.id, _content(row._mapping)) for row in rows]


async def modules_requesting_type(conn: AsyncConnection, org_id: str, type_id: str) -> list[str]:
    """Ids of the modules whose current version has a dependency or co-provisioned resource of ``type_id``."""
    return [
        module_id
        for module_id, content in await _all_contents(conn, org_id)
        if mentions_type(content, [type_id])
    ]


async def modules_mapping_provider(conn: AsyncConnection, org_id: str, provider_key: str) -> list[str]:
    """Ids of the modules whose current version maps a provider name to ``provider_type.id``."""
    return [
        module_id
        for module_id, content in await _all_contents(conn, org_id)
        if provider_key in content.provider_mapping.values()
    ]
