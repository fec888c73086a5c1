"""The sticky link of an environment to its runner (seed 000, "Runners and environments")."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment
from orchestrator.domain.rules import select_rule
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.store import projects as project_store
from orchestrator.store import runners as runner_store


@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    runner_id: str
    updated: bool
    required_tags: list[str] | None = None


async def refresh_runner(
    conn: AsyncConnection,
    org_id: str,
    project_id: str,
    env_id: str,
    *,
    dry_run: bool,
    env: Environment | None = None,
) -> RefreshResult:
    """Re-link the environment to the runner its most specific rule names.

    With no matching rule this raises ConflictError and keeps the previous link. ``updated`` is true only
    when the link changed (or would change, on a dry run).
    """
    if env is None:
        env = await project_store.get_env(conn, org_id, project_id, env_id, for_update=not dry_run)
    if env is None:
        raise NotFoundError(f"environment '{env_id}' not found in project '{project_id}'")
    rules = await runner_store.list_rules(conn, org_id, project_id=project_id, env_type_id=env.env_type_id)
    rule = select_rule(rules.items, project_id=project_id, env_type_id=env.env_type_id)
    if rule is None:
        raise ConflictError("no matching runner found for the supplied environment")
    tags = rule.required_tags or None
    updated = rule.runner_id != env.runner_id or tags != (env.required_tags or None)
    if updated and not dry_run:
        await project_store.update_env(
            conn, org_id, project_id, env_id, runner_id=rule.runner_id, required_tags=tags
        )
    return RefreshResult(runner_id=rule.runner_id, updated=updated, required_tags=tags)
