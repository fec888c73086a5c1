"""Environment types, projects and environments."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment, EnvironmentType, Project
from orchestrator.errors import ConflictError
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import created_now, insert_row, org_entity, update_org_row
from orchestrator.store.schema import env_types, envs, projects, runner_rules


def _env_type(row: sa.Row[tuple[object, ...]]) -> EnvironmentType:
    return EnvironmentType(**row._mapping)


async def create_env_type(
    conn: AsyncConnection, org_id: str, env_type_id: str, display_name: str
) -> EnvironmentType:
    values = {
        "org_id": org_id,
        "id": env_type_id,
        "uuid": uuid.uuid4(),
        "display_name": display_name,
        **created_now(),
    }
    return await insert_row(
        conn, env_types, values, EnvironmentType, conflict=f"environment type '{env_type_id}' already exists"
    )


async def get_env_type(conn: AsyncConnection, org_id: str, env_type_id: str) -> EnvironmentType | None:
    return await org_entity(conn, env_types, EnvironmentType, org_id, env_type_id)


async def list_env_types(
    conn: AsyncConnection, org_id: str, *, after: tuple[str, ...] | None, limit: int
) -> Page[EnvironmentType]:
    stmt = env_types.select().where(env_types.c.org_id == org_id)
    return await fetch_page(conn, stmt, [env_types.c.id], after, limit, _env_type)


async def update_env_type(
    conn: AsyncConnection, org_id: str, env_type_id: str, display_name: str
) -> EnvironmentType | None:
    await update_org_row(conn, env_types, org_id, env_type_id, {"display_name": display_name})
    return await get_env_type(conn, org_id, env_type_id)


async def delete_env_type(conn: AsyncConnection, org_id: str, env_type_id: str) -> bool:
    in_use = (
        await conn.execute(
            sa.select(envs.c.project_id, envs.c.id)
            .where(envs.c.org_id == org_id, envs.c.env_type_id == env_type_id)
            .order_by(envs.c.project_id, envs.c.id)
            .limit(20)
        )
    ).all()
    if in_use:
        names = ", ".join(f"{p}/{e}" for p, e in in_use)
        raise ConflictError(f"environment type '{env_type_id}' is in use by the environments: {names}")
    result = await conn.execute(
        env_types.delete().where(env_types.c.org_id == org_id, env_types.c.id == env_type_id)
    )
    return result.rowcount > 0


def _project(row: sa.Row[tuple[object, ...]]) -> Project:
    return Project(**row._mapping)


async def create_project(conn: AsyncConnection, org_id: str, project_id: str, display_name: str) -> Project:
    values = {
        "org_id": org_id,
        "id": project_id,
        "uuid": uuid.uuid4(),
        "display_name": display_name,
        "status": "active",
        **created_now(),
    }
    return await insert_row(
        conn, projects, values, Project, conflict=f"project '{project_id}' already exists"
    )


async def get_project(conn: AsyncConnection, org_id: str, project_id: str) -> Project | None:
    return await org_entity(conn, projects, Project, org_id, project_id)


async def list_projects(
    conn: AsyncConnection, org_id: str, *, after: tuple[str, ...] | None, limit: int
) -> Page[Project]:
    stmt = projects.select().where(projects.c.org_id == org_id)
    return await fetch_page(conn, stmt, [projects.c.id], after, limit, _project)


async def update_project(
    conn: AsyncConnection, org_id: str, project_id: str, display_name: str
) -> Project | None:
    await update_org_row(conn, projects, org_id, project_id, {"display_name": display_name})
    return await get_project(conn, org_id, project_id)


async def delete_project(conn: AsyncConnection, org_id: str, project_id: str, *, delete_rules: bool) -> bool:
    """Delete a project without environments; its rules go with it (upstream cascades them either way)."""
    names = (
        (
            await conn.execute(
                sa.select(envs.c.id)
                .where(envs.c.org_id == org_id, envs.c.project_id == project_id)
                .order_by(envs.c.id)
                .limit(20)
            )
        )
        .scalars()
        .all()
    )
    if names:
        raise ConflictError(
            f"project '{project_id}' still has environments: {', '.join(names)}; delete them first"
        )
    if delete_rules:
        await conn.execute(
            runner_rules.delete().where(
                runner_rules.c.org_id == org_id, runner_rules.c.project_id == project_id
            )
        )
    result = await conn.execute(
        projects.delete().where(projects.c.org_id == org_id, projects.c.id == project_id)
    )
    return result.rowcount > 0


_ENV_COLUMNS = (*envs.c, projects.c.uuid.label("project_uuid"))


def _env(row: sa.Row[tuple[object, ...]]) -> Environment:
    return Environment(**row._mapping)


def _env_select() -> sa.Select[tuple[object, ...]]:
    return sa.select(*_ENV_COLUMNS).join(
        projects, sa.and_(projects.c.org_id == envs.c.org_id, projects.c.id == envs.c.project_id)
    )


async def create_env(
    conn: AsyncConnection, org_id: str, project_id: str, env_id: str, env_type_id: str, display_name: str
) -> Environment:
    values = {
        "org_id": org_id,
        "project_id": project_id,
        "id": env_id,
        "uuid": uuid.uuid4(),
        "env_type_id": env_type_id,
        "display_name": display_name,
        "status": "active",
        "status_message": None,
        "runner_id": None,
        **created_now(),
    }
    with conflict_on_integrity(f"environment '{env_id}' already exists in project '{project_id}'"):
        await conn.execute(envs.insert().values(values))
    env = await get_env(conn, org_id, project_id, env_id)
    assert env is not None
    return env


async def get_env(
    conn: AsyncConnection, org_id: str, project_id: str, env_id: str, *, for_update: bool = False
) -> Environment | None:
    stmt = _env_select().where(envs.c.org_id == org_id, envs.c.project_id == project_id, envs.c.id == env_id)
    if for_update:
        stmt = stmt.with_for_update(of=envs)
    row = (await conn.execute(stmt)).first()
    return _env(row) if row else None


async def list_envs(
    conn: AsyncConnection,
    org_id: str,
    *,
    project_id: str | None,
    env_type_ids: list[str] | None,
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[Environment]:
    stmt = _env_select().where(envs.c.org_id == org_id)
    if project_id is not None:
        stmt = stmt.where(envs.c.project_id == project_id)
    if env_type_ids:
        stmt = stmt.where(envs.c.env_type_id.in_(env_type_ids))
    return await fetch_page(conn, stmt, [envs.c.project_id, envs.c.id], after, limit, _env)


async def update_env(
    conn: AsyncConnection, org_id: str, project_id: str, env_id: str, **values: object
) -> Environment | None:
    await conn.execute(
        envs.update()
        .where(envs.c.org_id == org_id, envs.c.project_id == project_id, envs.c.id == env_id)
        .values(**values, updated_at=datetime.now(UTC))
    )
    return await get_env(conn, org_id, project_id, env_id)


async def delete_env(conn: AsyncConnection, org_id: str, project_id: str, env_id: str) -> bool:
    result = await conn.execute(
        envs.delete().where(envs.c.org_id == org_id, envs.c.project_id == project_id, envs.c.id == env_id)
    )
    return result.rowcount > 0
