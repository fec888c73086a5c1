"""``octl create|get|delete module-rule`` (aliases ``rule``, ``rl``), ``get module-rules`` (``rls``).

A module rule says which module provisions a resource type where: for a resource class or id, in a project,
an environment type or one environment. Rules are immutable: there is no update.
"""

from __future__ import annotations

import uuid
from typing import Any

import click

from orchestrator.cli.octl import completion, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import (
    Session,
    UsageFailure,
    org_option,
    pass_session,
)

MODULE_RULE = (
    field("Id", "id"),
    field("ModuleId", "module_id"),
    field("ResourceType", "resource_type"),
    field("ResourceClass", "resource_class"),
    field("ResourceId", "resource_id"),
    field("ProjectId", "project_id"),
    field("EnvTypeId", "env_type_id"),
    field("EnvId", "env_id"),
    field("CreatedAt", "created_at"),
)


@verbs.create.command("module-rule")
@writes_org
def create_module_rule(session: Session, body: dict[str, Any], out: str) -> None:
    """Create a module rule (aliases: rule, rl).

    Keys: module_id (required), resource_class (default "default"), resource_id, project_id, and at most
    one of env_type_id and env_id (env_id needs project_id), e.g.
    `octl create module-rule --set module_id=pg --set env_type_id=development`.
    """
    org = session.org()
    rule = session.client().create_module_rule(org, body)
    output.emit(rule, out, MODULE_RULE)
    output.success(
        f"Module rule {rule.get('id')} for module {rule.get('module_id')} created in organization {org}."
    )


@verbs.get.command("module-rule")
@click.argument("rule_id", metavar="UUID", type=click.UUID)
@reads_org
def get_module_rule(session: Session, rule_id: uuid.UUID, out: str) -> None:
    """Show module rule UUID (aliases: rule, rl)."""
    output.emit(session.client().get_module_rule(session.org(), str(rule_id)), out, MODULE_RULE)


@verbs.get.command("module-rules")
@click.option("--module", "module_id", metavar="MODULE", help="Only the rules of this module.")
@click.option("--type", "resource_type", metavar="TYPE", help="Only the rules for this resource type.")
@click.option(
    "--project",
    "project_id",
    metavar="PROJECT",
    help="Only the rules effective in this project.",
    shell_complete=completion.projects,
)
@click.option(
    "--env",
    "env_id",
    metavar="ENV",
    help="Only the rules effective in this environment (with --project).",
    shell_complete=completion.envs,
)
@reads_org
def get_module_rules(
    session: Session,
    module_id: str | None,
    resource_type: str | None,
    project_id: str | None,
    env_id: str | None,
    out: str,
) -> None:
    """List module rules (aliases: rules, rls)."""
    if env_id and not project_id:
        raise UsageFailure("--env needs --project: an environment id is unique within its project only")
    org = session.org()
    rules = session.client().list_module_rules(
        org, module_id=module_id, resource_type=resource_type, project_id=project_id, env_id=env_id
    )
    emit_list(rules, out, MODULE_RULE, f"No module rules found in organization {org}.")


@verbs.delete.command("module-rule")
@click.argument("rule_id", metavar="UUID", type=click.UUID)
@org_option
@pass_session
def delete_module_rule(session: Session, rule_id: uuid.UUID) -> None:
    """Delete module rule UUID (aliases: rule, rl)."""
    org = session.org()
    session.client().delete_module_rule(org, str(rule_id))
    output.success(f"Module rule {rule_id} deleted from organization {org}.")


for _group in (verbs.create, verbs.get, verbs.delete):
    _group.add_alias("rule", "module-rule")
    _group.add_alias("rl", "module-rule")
verbs.get.add_alias("rules", "module-rules")
verbs.get.add_alias("rls", "module-rules")
