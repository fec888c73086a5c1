"""Module rules, and the catalogue they make for one environment."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import ModuleRule, referenced_providers
from orchestrator.domain.module_rules import (
    AvailableResourceType,
    EnvCatalogue,
    Placement,
    ResolvedModule,
    most_specific_per_kind,
)
from orchestrator.errors import ConflictError, InvalidInputError
from orchestrator.store import module_providers as provider_store
from orchestrator.store import modules as module_store
from orchestrator.store import resource_types as type_store
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, to_page
from orchestrator.store.schema import env_types, envs, module_rules, projects


def _rule(row: sa.Row[tuple[object, ...]]) -> ModuleRule:
    return ModuleRule(**row._mapping)


async def _exists(conn: AsyncConnection, stmt: sa.Select[tuple[object]]) -> bool:
    return (await conn.execute(stmt.limit(1))).first() is not None


async def create_rule(
    conn: AsyncConnection,
    *,
    org_id: str,
    module_id: str,
    resource_class: str,
    resource_id: str | None,
    project_id: str | None,
    env_type_id: str | None,
    env_id: str | None,
) -> ModuleRule:
    """Insert a rule for the module's resource type.

    400 for a bad scope or a missing module (as upstream), 409 for a missing project, environment type or
    environment, or when another rule of the type has the same match key.
    """
    if env_id is not None and project_id is None:
        raise InvalidInputError("project_id: must be set when env_id is set")
    if env_id is not None and env_type_id is not None:
        raise InvalidInputError("env_type_id: must not be set when env_id is set")
    module = await module_store.get_module(conn, org_id, module_id)
    if module is None:
        raise InvalidInputError(f"module_id: module '{module_id}' not found")
    if project_id is not None and not await _exists(
        conn, sa.select(projects.c.id).where(projects.c.org_id == org_id, projects.c.id == project_id)
    ):
        raise ConflictError(f"project '{project_id}' not found")
    if env_type_id is not None and not await _exists(
        conn, sa.select(env_types.c.id).where(env_types.c.org_id == org_id, env_types.c.id == env_type_id)
    ):
        raise ConflictError(f"environment type '{env_type_id}' not found")
    if env_id is not None and not await _exists(
        conn,
        sa.select(envs.c.id).where(
            envs.c.org_id == org_id, envs.c.project_id == project_id, envs.c.id == env_id
        ),
    ):
        raise ConflictError(f"environment '{env_id}' not found in project '{project_id}'")
    existing = (
        await conn.execute(
            module_rules.select().where(
                module_rules.c.org_id == org_id,
                module_rules.c.resource_type == module.resource_type,
                module_rules.c.resource_class == resource_class,
                sa.func.coalesce(module_rules.c.resource_id, "") == (resource_id or ""),
                sa.func.coalesce(module_rules.c.project_id, "") == (project_id or ""),
                sa.func.coalesce(module_rules.c.env_type_id, "") == (env_type_id or ""),
                sa.func.coalesce(module_rules.c.env_id, "") == (env_id or ""),
            )
        )
    ).first()
    if existing is not None:
        raise ConflictError(
            f"module rule conflicts with existing rule '{existing.id}' for module '{existing.module_id}'"
        )
    values = {
        "org_id": org_id,
        "id": uuid.uuid4(),
        "module_id": module_id,
        "resource_type": module.resource_type,
        "resource_class": resource_class,
        "resource_id": resource_id,
        "project_id": project_id,
        "env_type_id": env_type_id,
        "env_id": env_id,
        "created_at": datetime.now(UTC),
    }
    with conflict_on_integrity("module rule conflicts with an existing rule"):
        await conn.execute(module_rules.insert().values(values))
    return ModuleRule(**values)  # type: ignore[arg-type]


async def get_rule(conn: AsyncConnection, org_id: str, rule_id: uuid.UUID) -> ModuleRule | None:
    row = (
        await conn.execute(
            module_rules.select().where(module_rules.c.org_id == org_id, module_rules.c.id == rule_id)
        )
    ).first()
    return _rule(row) if row else None


async def list_rules(
    conn: AsyncConnection,
    org_id: str,
    *,
    resource_type: str | None = None,
    module_id: str | None = None,
    project_id: str | None = None,
    env_id: str | None = None,
    after: tuple[str, ...] | None = None,
    limit: int = 1000,
) -> Page[ModuleRule]:
    """Rules of the org; every filter is an exact match (upstream), ``env_id`` only with ``project_id``."""
    stmt = module_rules.select().where(module_rules.c.org_id == org_id)
    if resource_type is not None:
        stmt = stmt.where(module_rules.c.resource_type == resource_type)
    if module_id is not None:
        stmt = stmt.where(module_rules.c.module_id == module_id)
    if project_id is not None:
        stmt = stmt.where(module_rules.c.project_id == project_id)
    if env_id is not None:
        stmt = stmt.where(module_rules.c.env_id == env_id)
    key = (
        module_rules.c.resource_type,
        module_rules.c.module_id,
        module_rules.c.resource_class,
        module_rules.c.id,
    )
    if after is not None:
        try:
            bound = (after[0], after[1], after[2], uuid.UUID(after[3]))
        except (ValueError, IndexError) as exc:
            raise InvalidInputError("page: invalid page token") from exc
        stmt = stmt.where(
            sa.tuple_(*key) > sa.tuple_(*(sa.literal(v, c.type) for c, v in zip(key, bound, strict=True)))
        )
    rows = (await conn.execute(stmt.order_by(*key).limit(limit + 1))).all()
    return to_page(
        [_rule(r) for r in rows], limit, lambda r: (r.resource_type, r.module_id, r.resource_class, str(r.id))
    )


async def delete_rule(conn: AsyncConnection, org_id: str, rule_id: uuid.UUID) -> bool:
    result = await conn.execute(
        module_rules.delete().where(module_rules.c.org_id == org_id, module_rules.c.id == rule_id)
    )
    return result.rowcount > 0


async def effective_rules(conn: AsyncConnection, org_id: str, where: Placement) -> list[ModuleRule]:
    """Every rule whose environment fields are empty or match ``where`` (all resource types)."""
    c = module_rules.c
    rows = (
        await conn.execute(
            module_rules.select()
            .where(
                c.org_id == org_id,
                sa.or_(c.project_id.is_(None), c.project_id == where.project_id),
                sa.or_(c.env_type_id.is_(None), c.env_type_id == where.env_type_id),
                sa.or_(
                    c.env_id.is_(None), sa.and_(c.project_id == where.project_id, c.env_id == where.env_id)
                ),
            )
            .order_by(c.resource_type, c.resource_class, c.id)
        )
    ).all()
    return [_rule(r) for r in rows]


async def load_env_catalogue(conn: AsyncConnection, org_id: str, where: Placement) -> EnvCatalogue:
    """The rules that apply in ``where``, the current version of their modules and those modules' providers.

    Read it inside the deployment's transaction for a consistent snapshot.
    """
    rules = most_specific_per_kind(await effective_rules(conn, org_id, where), where)
    found = await module_store.get_modules(conn, org_id, (r.module_id for r in rules))
    provider_keys = {pair for module in found.values() for pair in referenced_providers(module.content)}
    providers = await provider_store.get_providers(conn, org_id, provider_keys)
    return EnvCatalogue(where=where, rules=tuple(rules), modules=found, providers=providers)


async def available_resource_types(
    conn: AsyncConnection,
    org_id: str,
    where: Placement,
    *,
    type_id: str | None,
    include_non_developer_accessible: bool,
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[AvailableResourceType]:
    """The resource types with a rule in ``where``, ordered by id (upstream listAvailableResourceTypes)."""
    catalogue = await load_env_catalogue(conn, org_id, where)
    by_type: dict[str, list[ResolvedModule]] = defaultdict(list)
    for rule in catalogue.rules:
        if type_id is None or rule.resource_type == type_id:
            by_type[rule.resource_type].append(
                ResolvedModule(rule=rule, module=catalogue.modules[rule.module_id])
            )
    types = await type_store.get_resource_types(conn, org_id, by_type)
    items = [
        AvailableResourceType(resource_type=types[name], options=tuple(by_type[name]))
        for name in sorted(types)
        if (after is None or name > after[0])
        and (include_non_developer_accessible or types[name].is_developer_accessible)
    ]
    return to_page(items[: limit + 1], limit, lambda a: (a.resource_type.id,))
