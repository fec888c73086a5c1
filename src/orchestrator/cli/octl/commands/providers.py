"""``octl create|get|update|delete provider TYPE ID`` (alias ``mp``), ``get providers`` (alias ``mps``).

Module providers: a Terraform provider configuration that modules map their provider names to
(``provider_mapping: {aws: aws.default}``).
"""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.octl import inputs, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import F, emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, org_option, pass_session

PROVIDER_SUMMARY = (
    field("ProviderType", "provider_type"),
    field("Id", "id"),
    field("Source", "source", shrink=True),
    field("Description", "description", shrink=True),
    field("CreatedAt", "created_at"),
)
PROVIDER = (
    field("ProviderType", "provider_type"),
    field("Id", "id"),
    field("Source", "source", shrink=True),
    field("VersionConstraint", "version_constraint"),
    field("Description", "description", shrink=True),
    field("CreatedAt", "created_at"),
)


def provider_arguments(func: F) -> F:
    """The TYPE and ID arguments that name a module provider (as ``provider_type`` and ``provider_id``)."""
    return click.argument("provider_type", metavar="TYPE")(click.argument("provider_id", metavar="ID")(func))


def _named(provider_type: str, provider_id: str) -> str:
    return f"Module provider {provider_type}.{provider_id}"


@verbs.create.command("provider")
@provider_arguments
@writes_org
def create_provider(
    session: Session,
    provider_type: str,
    provider_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create module provider TYPE ID (alias: mp).

    Keys: source (required, e.g. hashicorp/aws), version_constraint (required, e.g. "~> 5.0"),
    configuration (the provider block's arguments), description.
    """
    body = inputs.with_id(body, "id", provider_id)
    body = inputs.with_id(body, "provider_type", provider_type)
    org = session.org()
    output.emit(session.client().create_module_provider(org, body), out, PROVIDER)
    output.success(f"{_named(provider_type, provider_id)} created in organization {org}.")


@verbs.get.command("provider")
@provider_arguments
@reads_org
def get_provider(session: Session, provider_type: str, provider_id: str, out: str) -> None:
    """Show module provider TYPE ID (alias: mp; -o yaml or json for its configuration)."""
    provider = session.client().get_module_provider(session.org(), provider_type, provider_id)
    output.emit(provider, out, PROVIDER)


@verbs.get.command("providers")
@click.option("--type", "provider_type", metavar="TYPE", help="Only the providers of this type, e.g. aws.")
@reads_org
def get_providers(session: Session, provider_type: str | None, out: str) -> None:
    """List the module providers of the organization (alias: mps)."""
    org = session.org()
    providers = session.client().list_module_providers(org, provider_type=provider_type)
    emit_list(providers, out, PROVIDER_SUMMARY, f"No module providers found in organization {org}.")


@verbs.update.command("provider")
@provider_arguments
@writes_org
def update_provider(
    session: Session,
    provider_type: str,
    provider_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update module provider TYPE ID (alias: mp; keys: version_constraint, configuration, description)."""
    body = inputs.without_id(body, "id", provider_id)
    body = require_changes(inputs.without_id(body, "provider_type", provider_type))
    org = session.org()
    output.emit(session.client().update_module_provider(org, provider_type, provider_id, body), out, PROVIDER)
    output.success(f"{_named(provider_type, provider_id)} updated in organization {org}.")


@verbs.delete.command("provider")
@provider_arguments
@org_option
@pass_session
def delete_provider(session: Session, provider_type: str, provider_id: str) -> None:
    """Delete module provider TYPE ID (alias: mp)."""
    org = session.org()
    session.client().delete_module_provider(org, provider_type, provider_id)
    output.success(f"{_named(provider_type, provider_id)} deleted from organization {org}.")


for _group in (verbs.create, verbs.get, verbs.update, verbs.delete):
    _group.add_alias("mp", "provider")
verbs.get.add_alias("mps", "providers")
