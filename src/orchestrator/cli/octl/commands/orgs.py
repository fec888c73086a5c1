"""``octl create org [ID]``, ``get org ID``, ``get orgs``: organizations (creating needs a platform admin)."""

from __future__ import annotations

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, pass_session

ORG = (field("Id", "id"), field("Status", "status"), field("CreatedAt", "created_at"))


@verbs.create.command("org")
@click.argument("org_id", metavar="[ID]", required=False)
@output.out_option("yaml")
@pass_session
def create_org(session: Session, org_id: str | None, out: str) -> None:
    """Create an organization (a random id when none is given); needs a platform-admin token."""
    org = session.client().create_org(org_id)
    output.emit(org, out, ORG)
    output.success(f"Organization {org.get('id')} created.")


@verbs.get.command("org")
@click.argument("org_id", metavar="ID")
@output.out_option("table")
@pass_session
def get_org(session: Session, org_id: str, out: str) -> None:
    """Show organization ID."""
    output.emit(session.client().get_org(org_id), out, ORG)


@verbs.get.command("orgs")
@output.out_option("table")
@pass_session
def get_orgs(session: Session, out: str) -> None:
    """List the organizations the token sees."""
    emit_list(session.client().list_orgs(), out, ORG, "No organizations.")
