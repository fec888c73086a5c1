"""``octl create|get|update|delete resource-type`` (alias ``rt``), ``get resource-types`` (alias ``rts``),
``get available-resource-types PROJECT ENV``."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.octl import completion, inputs, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import Column, field
from orchestrator.cli.octl.session import Session, org_option, pass_session

RESOURCE_TYPE = (
    field("Id", "id"),
    field("Description", "description", shrink=True),
    field("DeveloperAccessible", "is_developer_accessible"),
    field("BuiltIn", "built_in"),
    field("CreatedAt", "created_at"),
)


def _option(option: dict[str, object]) -> str:
    where = str(option.get("resource_class"))
    if option.get("resource_id"):
        where += f"/{option['resource_id']}"
    return f"{where}: {option.get('module_id')}"


AVAILABLE_RESOURCE_TYPE = (
    field("Id", "id"),
    field("Description", "description", shrink=True),
    Column("Modules", lambda row: ", ".join(_option(o) for o in row.get("options") or [])),
)


@verbs.create.command("resource-type")
@click.argument("type_id", metavar="ID")
@writes_org
def create_resource_type(
    session: Session,
    type_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create resource type ID (alias: rt).

    Keys: output_schema (required, a JSON schema of the outputs its modules give), description,
    is_developer_accessible (default true), e.g.
    `octl create resource-type postgres --set-json '{"output_schema": {"type": "object"}}'`.
    """
    body = inputs.with_id(body, "id", type_id)
    org = session.org()
    output.emit(session.client().create_resource_type(org, body), out, RESOURCE_TYPE)
    output.success(f"Resource type {type_id} created in organization {org}.")


@verbs.get.command("resource-type")
@click.argument("type_id", metavar="ID")
@reads_org
def get_resource_type(session: Session, type_id: str, out: str) -> None:
    """Show resource type ID (alias: rt; -o yaml or json for its output schema)."""
    output.emit(session.client().get_resource_type(session.org(), type_id), out, RESOURCE_TYPE)


@verbs.get.command("resource-types")
@reads_org
def get_resource_types(session: Session, out: str) -> None:
    """List the resource types of the organization (alias: rts)."""
    org = session.org()
    emit_list(
        session.client().list_resource_types(org),
        out,
        RESOURCE_TYPE,
        f"No resource types found in organization {org}.",
    )


@verbs.update.command("resource-type")
@click.argument("type_id", metavar="ID")
@writes_org
def update_resource_type(
    session: Session,
    type_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update resource type ID (alias: rt; keys: description, output_schema, is_developer_accessible)."""
    body = require_changes(inputs.without_id(body, "id", type_id))
    org = session.org()
    output.emit(session.client().update_resource_type(org, type_id, body), out, RESOURCE_TYPE)
    output.success(f"Resource type {type_id} updated in organization {org}.")


@verbs.delete.command("resource-type")
@click.argument("type_id", metavar="ID")
@org_option
@pass_session
def delete_resource_type(session: Session, type_id: str) -> None:
    """Delete resource type ID (alias: rt; refused while a module provisions or requests it)."""
    org = session.org()
    session.client().delete_resource_type(org, type_id)
    output.success(f"Resource type {type_id} deleted from organization {org}.")


@verbs.get.command("available-resource-types")
@click.argument("project_id", metavar="PROJECT", shell_complete=completion.projects)
@click.argument("env_id", metavar="ENV", shell_complete=completion.envs)
@click.option("--all", "include_all", is_flag=True, help="Also the types developers may not request.")
@reads_org
def get_available_resource_types(
    session: Session, project_id: str, env_id: str, include_all: bool, out: str
) -> None:
    """List the resource types a manifest can request in environment ENV of PROJECT, and for each
    resource class (and id) the module that would provision it."""
    available = session.client().list_available_resource_types(
        session.org(), project_id, env_id, include_non_developer_accessible=include_all
    )
    emit_list(
        available,
        out,
        AVAILABLE_RESOURCE_TYPE,
        f"No resource types are available in environment {project_id}/{env_id}: add module rules.",
    )


for _group in (verbs.create, verbs.get, verbs.update, verbs.delete):
    _group.add_alias("rt", "resource-type")
verbs.get.add_alias("rts", "resource-types")
