"""The sticky link of an environment to its runner (seed 000, "Runners and environments")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment, RunnerRule
from orchestrator.domain.rules import select_rule
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.store import projects as project_store
from orchestrator.store import runners as runner_store

#: How many of the organization's rules the "no matching runner" message names.
RULES_NAMED = 5


def no_matching_runner(project_id: str, env_type_id: str, rules: Sequence[RunnerRule]) -> str:
    """Upstream's message, then the rules that were tried and what to do: each rule applies to its
    project and environment type (empty: any)."""

    def scope(rule: RunnerRule) -> str:
        return (
            f"runner {rule.runner_id} for project {rule.project_id or 'any'}, "
            f"env type {rule.env_type_id or 'any'}"
        )

    if rules:
        named = "; ".join(scope(rule) for rule in rules[:RULES_NAMED])
        more = ", and more" if len(rules) > RULES_NAMED else ""
        tried = f"the organization's runner rules ({named}{more}) apply to other projects or env types"
    else:
        tried = "the organization has no runner rules"
    return (
        f"no matching runner found for the supplied environment: no runner rule applies to project "
        f"'{project_id}' with env type '{env_type_id}', {tried}; create one, e.g. `octl create runner-rule "
        f"--set runner_id=RUNNER --set project_id={project_id}` (an empty rule applies everywhere)"
    )


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
        others = await runner_store.list_rules(conn, org_id, limit=RULES_NAMED + 1)
        raise ConflictError(no_matching_runner(project_id, env.env_type_id, others.items))
    tags = rule.required_tags or None
    updated = rule.runner_id != env.runner_id or tags != (env.required_tags or None)
    if updated and not dry_run:
        await project_store.update_env(
            conn, org_id, project_id, env_id, runner_id=rule.runner_id, required_tags=tags
        )
    return RefreshResult(runner_id=rule.runner_id, updated=updated, required_tags=tags)
