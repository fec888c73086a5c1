"""``octl create|get|update|delete project`` and ``env-type``; ``get projects``, ``get env-types``."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.octl import completion, inputs, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, org_option, pass_session

PROJECT = (
    field("Id", "id"),
    field("DisplayName", "display_name", shrink=True),
    field("Status", "status"),
    field("CreatedAt", "created_at"),
)
ENV_TYPE = (
    field("Id", "id"),
    field("DisplayName", "display_name", shrink=True),
    field("CreatedAt", "created_at"),
)


@verbs.create.command("project")
@click.argument("project_id", metavar="ID")
@writes_org
def create_project(
    session: Session,
    project_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create project ID (optional key: display_name)."""
    body = inputs.with_id(body, "id", project_id)
    org = session.org()
    output.emit(session.client().create_project(org, body), out, PROJECT)
    output.success(f"Project {project_id} created in organization {org}.")


@verbs.get.command("project")
@click.argument("project_id", metavar="ID", shell_complete=completion.projects)
@reads_org
def get_project(session: Session, project_id: str, out: str) -> None:
    """Show project ID."""
    output.emit(session.client().get_project(session.org(), project_id), out, PROJECT)


@verbs.get.command("projects")
@reads_org
def get_projects(session: Session, out: str) -> None:
    """List the projects of the organization."""
    org = session.org()
    emit_list(session.client().list_projects(org), out, PROJECT, f"No projects found in organization {org}.")


@verbs.update.command("project")
@click.argument("project_id", metavar="ID", shell_complete=completion.projects)
@writes_org
def update_project(
    session: Session,
    project_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update project ID (key: display_name)."""
    body = require_changes(inputs.without_id(body, "id", project_id))
    org = session.org()
    output.emit(session.client().update_project(org, project_id, body), out, PROJECT)
    output.success(f"Project {project_id} updated in organization {org}.")


@verbs.delete.command("project")
@click.argument("project_id", metavar="ID", shell_complete=completion.projects)
@click.option("--delete-rules", is_flag=True, help="Also delete the runner rules that name the project.")
@org_option
@pass_session
def delete_project(session: Session, project_id: str, delete_rules: bool) -> None:
    """Delete project ID."""
    org = session.org()
    session.client().delete_project(org, project_id, delete_rules=delete_rules)
    output.success(f"Project {project_id} deleted from organization {org}.")


@verbs.create.command("env-type")
@click.argument("env_type_id", metavar="ID")
@writes_org
def create_env_type(
    session: Session,
    env_type_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create environment type ID (optional key: display_name)."""
    body = inputs.with_id(body, "id", env_type_id)
    org = session.org()
    output.emit(session.client().create_env_type(org, body), out, ENV_TYPE)
    output.success(f"Environment type {env_type_id} created in organization {org}.")


@verbs.get.command("env-type")
@click.argument("env_type_id", metavar="ID")
@reads_org
def get_env_type(session: Session, env_type_id: str, out: str) -> None:
    """Show environment type ID."""
    output.emit(session.client().get_env_type(session.org(), env_type_id), out, ENV_TYPE)


@verbs.get.command("env-types")
@reads_org
def get_env_types(session: Session, out: str) -> None:
    """List the environment types of the organization."""
    org = session.org()
    emit_list(
        session.client().list_env_types(org),
        out,
        ENV_TYPE,
        f"No environment types found in organization {org}.",
    )


@verbs.update.command("env-type")
@click.argument("env_type_id", metavar="ID")
@writes_org
def update_env_type(
    session: Session,
    env_type_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update environment type ID (key: display_name)."""
    body = require_changes(inputs.without_id(body, "id", env_type_id))
    org = session.org()
    output.emit(session.client().update_env_type(org, env_type_id, body), out, ENV_TYPE)
    output.success(f"Environment type {env_type_id} updated in organization {org}.")


@verbs.delete.command("env-type")
@click.argument("env_type_id", metavar="ID")
@org_option
@pass_session
def delete_env_type(session: Session, env_type_id: str) -> None:
    """Delete environment type ID."""
    org = session.org()
    session.client().delete_env_type(org, env_type_id)
    output.success(f"Environment type {env_type_id} deleted from organization {org}.")
