"""Runners and runner rules."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.deployments import Status
from orchestrator.domain.entities import Runner, RunnerRule
from orchestrator.errors import ConflictError, InvalidInputError, NotFoundError
from orchestrator.store.errors import conflict_on_integrity
from orchestrator.store.pages import Page, fetch_page
from orchestrator.store.rows import created_now, entity, insert_row, org_entity, org_row
from orchestrator.store.schema import deployments, env_types, envs, projects, runner_rules, runners

_RUNNER_COLUMNS = [c for c in runners.c if c.name != "config_secret"]


def _runner(row: sa.Row[tuple[object, ...]]) -> Runner:
    return entity(Runner, row)  # not config_secret: read with its own function


async def create_runner(
    conn: AsyncConnection,
    *,
    org_id: str,
    runner_id: str,
    description: str | None,
    runner_type: str,
    configuration: dict[str, Any],
    config_secret: str | None,
    state_type: str,
    state_configuration: dict[str, Any],
) -> Runner:
    values = {
        "org_id": org_id,
        "id": runner_id,
        "description": description,
        "type": runner_type,
        "configuration": configuration,
        "config_secret": config_secret,
        "state_type": state_type,
        "state_configuration": state_configuration,
        **created_now(),
    }
    return await insert_row(
        conn, runners, values, Runner, conflict=f"runner with id '{runner_id}' already exists"
    )


async def get_runner(conn: AsyncConnection, org_id: str, runner_id: str) -> Runner | None:
    row = (
        await conn.execute(
            sa.select(*_RUNNER_COLUMNS).where(runners.c.org_id == org_id, runners.c.id == runner_id)
        )
    ).first()
    return _runner(row) if row else None


async def get_runner_secret(conn: AsyncConnection, org_id: str, runner_id: str) -> str | None:
    """The sealed secrets of a runner (only the dispatcher and PATCH need them)."""
    return (
        await conn.execute(
            sa.select(runners.c.config_secret).where(runners.c.org_id == org_id, runners.c.id == runner_id)
        )
    ).scalar_one_or_none()


async def list_runners(
    conn: AsyncConnection,
    org_id: str,
    *,
    runner_type: str | None,
    after: tuple[str, ...] | None,
    limit: int,
    hidden_type: str | None = None,
) -> Page[Runner]:
    """A page of the organization's runners, without those of ``hidden_type`` (the managed pool's row
    while managed runners are off)."""
    stmt = sa.select(*_RUNNER_COLUMNS).where(runners.c.org_id == org_id)
    if hidden_type is not None:
        stmt = stmt.where(runners.c.type != hidden_type)
    if runner_type is not None:
        stmt = stmt.where(runners.c.type == runner_type)
    return await fetch_page(conn, stmt, [runners.c.id], after, limit, _runner)


async def update_runner(
    conn: AsyncConnection,
    org_id: str,
    runner_id: str,
    *,
    description: str | None,
    configuration: dict[str, Any],
    config_secret: str | None,
    state_type: str,
    state_configuration: dict[str, Any],
) -> Runner | None:
    await conn.execute(
        runners.update()
        .where(runners.c.org_id == org_id, runners.c.id == runner_id)
        .values(
            description=description,
            configuration=configuration,
            config_secret=config_secret,
            state_type=state_type,
            state_configuration=state_configuration,
            updated_at=datetime.now(UTC),
        )
    )
    return await get_runner(conn, org_id, runner_id)


#: How many executing deployments a refused runner delete names (the count is always given).
_NAMED_DEPLOYMENTS = 5


async def delete_runner(conn: AsyncConnection, org_id: str, runner_id: str) -> bool:
    """Delete a runner; ConflictError while environments are linked to it or deployments on it execute.

    The runner row is locked first (FOR UPDATE on PostgreSQL; SQLite's writer transaction is exclusive
    anyway): linking an environment to the runner needs a key-share lock on that row (the envs foreign
    key), and a deployment is only created on a runner its environment is linked to in the same
    transaction, so neither can slip in between the checks below and the delete.
    """
    locked = (
        await conn.execute(
            sa.select(runners.c.id)
            .where(runners.c.org_id == org_id, runners.c.id == runner_id)
            .with_for_update()
        )
    ).first()
    if locked is None:
        return False
    linked = (
        await conn.execute(
            sa.select(envs.c.project_id, envs.c.id)
            .where(envs.c.org_id == org_id, envs.c.runner_id == runner_id)
            .order_by(envs.c.project_id, envs.c.id)
        )
    ).all()
    if linked:
        names = ", ".join(f"{p}/{e}" for p, e in linked)
        raise ConflictError(f"runner {runner_id} is in use by the environments: {names}")
    executing = (
        await conn.execute(
            sa.select(deployments.c.id, deployments.c.project_id, deployments.c.env_id)
            .where(
                deployments.c.org_id == org_id,
                deployments.c.runner_id == runner_id,
                deployments.c.status == Status.EXECUTING,
            )
            .order_by(deployments.c.created_at, deployments.c.id)
        )
    ).all()
    if executing:
        raise ConflictError(
            _executing_message(runner_id, [(r.id, r.project_id, r.env_id) for r in executing])
        )
    with conflict_on_integrity(f"runner {runner_id} is in use"):
        result = await conn.execute(
            runners.delete().where(runners.c.org_id == org_id, runners.c.id == runner_id)
        )
    return result.rowcount > 0


def _executing_message(runner_id: str, rows: Sequence[tuple[uuid.UUID, str, str]]) -> str:
    named = ", ".join(f"'{d}' ({p}/{e})" for d, p, e in rows[:_NAMED_DEPLOYMENTS])
    more = f" and {len(rows) - _NAMED_DEPLOYMENTS} more" if len(rows) > _NAMED_DEPLOYMENTS else ""
    if len(rows) == 1:
        return f"runner {runner_id} has 1 executing deployment: {named}; wait for it to finish"
    return f"runner {runner_id} has {len(rows)} executing deployments: {named}{more}; wait for them to finish"


def _rule(row: sa.Row[tuple[object, ...]]) -> RunnerRule:
    return RunnerRule(**row._mapping)


async def create_rule(
    conn: AsyncConnection,
    *,
    org_id: str,
    runner_id: str,
    project_id: str | None,
    env_type_id: str | None,
    required_tags: list[str] | None = None,
) -> RunnerRule:
    """Insert a rule; 404 when its runner, project or env type is missing (upstream: 409), 409 when the
    match is taken."""
    named = (
        ("runner", runners, runner_id, "runners"),
        ("project", projects, project_id, "projects"),
        ("environment type", env_types, env_type_id, "env-types"),
    )
    for what, table, object_id, listing in named:
        if object_id is not None and await org_row(conn, table, org_id, object_id) is None:
            raise NotFoundError(
                f"{what} '{object_id}' not found: create it first, or name one `octl get {listing}` lists"
            )
    existing = (
        await conn.execute(
            runner_rules.select().where(
                runner_rules.c.org_id == org_id,
                sa.func.coalesce(runner_rules.c.project_id, "") == (project_id or ""),
                sa.func.coalesce(runner_rules.c.env_type_id, "") == (env_type_id or ""),
            )
        )
    ).first()
    if existing is not None:
        raise _duplicate(_rule(existing))
    values = {
        "org_id": org_id,
        "id": uuid.uuid4(),
        "runner_id": runner_id,
        "project_id": project_id,
        "env_type_id": env_type_id,
        "required_tags": required_tags,
        "created_at": datetime.now(UTC),
    }
    return await insert_row(
        conn, runner_rules, values, RunnerRule, conflict="runner rule conflicts with an existing rule"
    )


def _duplicate(rule: RunnerRule) -> ConflictError:
    return ConflictError(
        f"runner rule conflicts with existing rule '{rule.id}' for runner '{rule.runner_id}'"
    )


async def get_rule(conn: AsyncConnection, org_id: str, rule_id: uuid.UUID) -> RunnerRule | None:
    return await org_entity(conn, runner_rules, RunnerRule, org_id, rule_id)


async def list_rules(
    conn: AsyncConnection,
    org_id: str,
    *,
    runner_id: str | None = None,
    project_id: str | None = None,
    env_type_id: str | None = None,
    after: tuple[str, ...] | None = None,
    limit: int = 1000,
) -> Page[RunnerRule]:
    """Rules of the org; the project and env type filters mean "effective in" (empty or equal)."""
    stmt = runner_rules.select().where(runner_rules.c.org_id == org_id)
    if runner_id is not None:
        stmt = stmt.where(runner_rules.c.runner_id == runner_id)
    if project_id is not None:
        stmt = stmt.where(
            sa.or_(runner_rules.c.project_id.is_(None), runner_rules.c.project_id == project_id)
        )
    if env_type_id is not None:
        stmt = stmt.where(
            sa.or_(runner_rules.c.env_type_id.is_(None), runner_rules.c.env_type_id == env_type_id)
        )
    try:
        after_key = (after[0], uuid.UUID(after[1])) if after else None
    except (ValueError, IndexError) as exc:
        raise InvalidInputError("page: invalid page token") from exc
    return await fetch_page(
        conn, stmt, [runner_rules.c.runner_id, runner_rules.c.id], after_key, limit, _rule
    )


async def delete_rule(conn: AsyncConnection, org_id: str, rule_id: uuid.UUID) -> bool:
    result = await conn.execute(
        runner_rules.delete().where(runner_rules.c.org_id == org_id, runner_rules.c.id == rule_id)
    )
    return result.rowcount > 0
