"""Module rules (which of them apply where, and which wins, is ``domain.module_rules``)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import ModuleRule
from orchestrator.domain.module_rules import Placement, RuleScope
from orchestrator.errors import InvalidInputError
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import first_values, insert_row, org_entity
from orchestrator.store.schema import module_rules


def _rule(row: sa.Row[tuple[object, ...]]) -> ModuleRule:
    return ModuleRule(**row._mapping)


async def rule_with_match_key(
    conn: AsyncConnection, org_id: str, resource_type: str, scope: RuleScope
) -> ModuleRule | None:
    """The rule of the type with this scope (empty fields equal), if any."""
    c = module_rules.c
    row = (
        await conn.execute(
            module_rules.select().where(
                c.org_id == org_id,
                c.resource_type == resource_type,
                c.resource_class == scope.resource_class,
                sa.func.coalesce(c.resource_id, "") == (scope.resource_id or ""),
                sa.func.coalesce(c.project_id, "") == (scope.project_id or ""),
                sa.func.coalesce(c.env_type_id, "") == (scope.env_type_id or ""),
                sa.func.coalesce(c.env_id, "") == (scope.env_id or ""),
            )
        )
    ).first()
    return _rule(row) if row else None


async def insert_rule(
    conn: AsyncConnection, org_id: str, module_id: str, resource_type: str, scope: RuleScope
) -> ModuleRule:
    """Insert a rule (checked by ``dispatch.catalogue.create_rule``); 409 on a match key taken meanwhile."""
    values = {
        "org_id": org_id,
        "id": uuid.uuid4(),
        "module_id": module_id,
        "resource_type": resource_type,
        **dataclasses.asdict(scope),
        "created_at": datetime.now(UTC),
    }
    return await insert_row(
        conn, module_rules, values, ModuleRule, conflict="module rule conflicts with an existing rule"
    )


async def get_rule(conn: AsyncConnection, org_id: str, rule_id: uuid.UUID) -> ModuleRule | None:
    return await org_entity(conn, module_rules, ModuleRule, org_id, rule_id)


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
    try:
        after_key = (after[0], after[1], after[2], uuid.UUID(after[3])) if after is not None else None
    except (ValueError, IndexError) as exc:
        raise InvalidInputError("page: invalid page token") from exc
    return await fetch_page(conn, stmt, key, after_key, limit, _rule)


async def rule_ids_of_module(
    conn: AsyncConnection, org_id: str, module_id: str, *, limit: int
) -> list[uuid.UUID]:
    """Ids of the rules naming ``module_id``, the first ``limit`` by id."""
    where = (module_rules.c.org_id == org_id, module_rules.c.module_id == module_id)
    return await first_values(conn, module_rules.c.id, *where, limit=limit)


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
