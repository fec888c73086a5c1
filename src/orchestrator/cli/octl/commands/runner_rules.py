"""``octl create|get|delete runner-rule`` (alias ``rrl``), ``get runner-rules`` (alias ``rrls``).

Rules are immutable: there is no update.
"""

from __future__ import annotations

import uuid
from typing import Any

import click

from orchestrator.cli.octl import completion, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, org_option, pass_session

RUNNER_RULE = (
    field("Id", "id"),
    field("RunnerId", "runner_id"),
    field("ProjectId", "project_id"),
    field("EnvTypeId", "env_type_id"),
    field("CreatedAt", "created_at"),
)


@verbs.create.command("runner-rule")
@writes_org
def create_runner_rule(session: Session, body: dict[str, Any], out: str) -> None:
    """Create a runner rule (alias: rrl).

    Keys: runner_id (required), project_id, env_type_id; a rule without project_id and env_type_id
    matches every environment, e.g. `octl create runner-rule --set=runner_id=my-gke-runner`.
    """
    org = session.org()
    rule = session.client().create_runner_rule(org, body)
    output.emit(rule, out, RUNNER_RULE)
    output.success(
        f"Runner rule {rule.get('id')} for runner {rule.get('runner_id')} created in organization {org}."
    )


@verbs.get.command("runner-rule")
@click.argument("rule_id", metavar="UUID", type=click.UUID)
@reads_org
def get_runner_rule(session: Session, rule_id: uuid.UUID, out: str) -> None:
    """Show runner rule UUID."""
    output.emit(session.client().get_runner_rule(session.org(), str(rule_id)), out, RUNNER_RULE)


@verbs.get.command("runner-rules")
@click.option(
    "--runner",
    "runner_id",
    metavar="RUNNER",
    help="Only the rules of this runner.",
    shell_complete=completion.runners,
)
@click.option(
    "--project",
    "project_id",
    metavar="PROJECT",
    help="Only the rules effective in this project.",
    shell_complete=completion.projects,
)
@click.option(
    "--env-type", "env_type_id", metavar="ENV_TYPE", help="Only the rules effective for this env type."
)
@reads_org
def get_runner_rules(
    session: Session, runner_id: str | None, project_id: str | None, env_type_id: str | None, out: str
) -> None:
    """List runner rules (alias: rrls)."""
    org = session.org()
    rules = session.client().list_runner_rules(
        org, runner_id=runner_id, project_id=project_id, env_type_id=env_type_id
    )
    emit_list(rules, out, RUNNER_RULE, f"No runner rules found in organization {org}.")


@verbs.delete.command("runner-rule")
@click.argument("rule_id", metavar="UUID", type=click.UUID)
@org_option
@pass_session
def delete_runner_rule(session: Session, rule_id: uuid.UUID) -> None:
    """Delete runner rule UUID (alias: rrl)."""
    org = session.org()
    session.client().delete_runner_rule(org, str(rule_id))
    output.success(f"Runner rule {rule_id} deleted from organization {org}.")


for _group in (verbs.create, verbs.get, verbs.delete):
    _group.add_alias("rrl", "runner-rule")
verbs.get.add_alias("rrls", "runner-rules")
