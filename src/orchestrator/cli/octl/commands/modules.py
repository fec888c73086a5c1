"""``octl create|get|update|delete module`` (alias ``mod``), ``get modules`` (alias ``mods``),
``get module-versions MODULE``, ``get module-version MODULE VERSION``.

Every create or update of a module makes a new version; deployments pin the version they ran.
"""

from __future__ import annotations

import uuid
from typing import Any

import click

from orchestrator.cli.octl import inputs, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, org_option, pass_session

MODULE = (
    field("Id", "id"),
    field("ResourceType", "resource_type"),
    field("ModuleSource", "module_source", shrink=True),
    field("VersionId", "version_id"),
    field("Description", "description", shrink=True),
    field("UpdatedAt", "updated_at"),
)
MODULE_VERSION = (
    field("VersionId", "version_id"),
    field("ResourceType", "resource_type"),
    field("ModuleSource", "module_source", shrink=True),
    field("Description", "description", shrink=True),
    field("CreatedAt", "created_at"),
)


@verbs.create.command("module")
@click.argument("module_id", metavar="ID")
@writes_org
def create_module(
    session: Session,
    module_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create module ID (alias: mod).

    Keys: resource_type and module_source (required; a Terraform module source, or "inline" with the
    code in module_source_code), module_params, module_inputs, provider_mapping, dependencies,
    coprovisioned, description, e.g. `octl create module pg --set-yaml=@pg-module.yaml`.
    """
    body = inputs.with_id(body, "id", module_id)
    org = session.org()
    output.emit(session.client().create_module(org, body), out, MODULE)
    output.success(f"Module {module_id} created in organization {org}.")


@verbs.get.command("module")
@click.argument("module_id", metavar="ID")
@reads_org
def get_module(session: Session, module_id: str, out: str) -> None:
    """Show module ID (alias: mod; -o yaml or json for its whole definition)."""
    output.emit(session.client().get_module(session.org(), module_id), out, MODULE)


@verbs.get.command("modules")
@click.option("--type", "resource_type", metavar="TYPE", help="Only the modules of this resource type.")
@reads_org
def get_modules(session: Session, resource_type: str | None, out: str) -> None:
    """List the modules of the organization (alias: mods)."""
    org = session.org()
    modules = session.client().list_modules(org, resource_type=resource_type)
    emit_list(modules, out, MODULE, f"No modules found in organization {org}.")


@verbs.update.command("module")
@click.argument("module_id", metavar="ID")
@writes_org
def update_module(
    session: Session,
    module_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update module ID (alias: mod): the given keys replace the stored ones in a new version.

    The resource type cannot change; a new module_source replaces module_source_code too.
    """
    body = require_changes(inputs.without_id(body, "id", module_id))
    org = session.org()
    module = session.client().update_module(org, module_id, body)
    output.emit(module, out, MODULE)
    output.success(f"Module {module_id} updated in organization {org} (version {module.get('version_id')}).")


@verbs.delete.command("module")
@click.argument("module_id", metavar="ID")
@org_option
@pass_session
def delete_module(session: Session, module_id: str) -> None:
    """Delete module ID (alias: mod)."""
    org = session.org()
    session.client().delete_module(org, module_id)
    output.success(f"Module {module_id} deleted from organization {org}.")


@verbs.get.command("module-versions")
@click.argument("module_id", metavar="MODULE")
@reads_org
def get_module_versions(session: Session, module_id: str, out: str) -> None:
    """List the versions of MODULE."""
    versions = session.client().list_module_versions(session.org(), module_id)
    emit_list(versions, out, MODULE_VERSION, f"No versions found for module {module_id}.")


@verbs.get.command("module-version")
@click.argument("module_id", metavar="MODULE")
@click.argument("version_id", metavar="VERSION", type=click.UUID)
@reads_org
def get_module_version(session: Session, module_id: str, version_id: uuid.UUID, out: str) -> None:
    """Show version VERSION of MODULE (-o yaml or json for its whole definition)."""
    version = session.client().get_module_version(session.org(), module_id, str(version_id))
    output.emit(version, out, MODULE_VERSION)


for _group in (verbs.create, verbs.get, verbs.update, verbs.delete):
    _group.add_alias("mod", "module")
verbs.get.add_alias("mods", "modules")
