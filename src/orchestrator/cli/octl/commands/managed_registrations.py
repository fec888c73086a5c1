"""``octl create|get|delete managed-runner-registration(s)``: the platform admin's registration credentials
for managed runners (issue 26). A runner registering with a credential's secret may serve at most its tags;
one registering with MANAGED_RUNNER_SECRET only those of PO_MANAGED_SECRET_TAGS."""

from __future__ import annotations

import uuid

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import Session, pass_session

REGISTRATION = (
    field("Id", "id"),
    field("Tags", "tags"),
    field("Description", "description", shrink=True),
    field("CreatedAt", "created_at"),
)


@verbs.create.command("managed-runner-registration")
@click.option("--tag", "tags", multiple=True, help="A tag its runners may serve (repeatable).")
@click.option("--description", default="", help="What it is for (shown by get).")
@output.out_option("yaml")
@pass_session
def create_registration(session: Session, tags: tuple[str, ...], description: str, out: str) -> None:
    """Create a managed runner registration credential (needs a platform-admin token).

    Give its `secret` to the runners as RUNNER_MANAGED_SECRET. The secret is shown this once and cannot
    be read again.

    \b
    Example:
      octl create managed-runner-registration --tag gpu --description "GPU pool"
    """
    created = session.client().create_managed_registration({"tags": list(tags), "description": description})
    output.emit(created, out, ())
    output.success(
        f"Managed runner registration {created.get('id')} created. "
        "Store the secret now: it is not shown again."
    )


@verbs.get.command("managed-runner-registrations")
@output.out_option("table")
@pass_session
def get_registrations(session: Session, out: str) -> None:
    """List the managed runner registration credentials (never their secrets); needs a platform admin.

    \b
    Example:
      octl get managed-runner-registrations -o json
    """
    emit_list(
        session.client().list_managed_registrations(),
        out,
        REGISTRATION,
        "No managed runner registrations.",
    )


@verbs.delete.command("managed-runner-registration")
@click.argument("registration_id", metavar="ID", type=click.UUID)
@pass_session
def delete_registration(session: Session, registration_id: uuid.UUID) -> None:
    """Delete registration credential ID: no runner registers with it from now on (registered runners keep
    their tokens until they register again).

    \b
    Example:
      octl delete managed-runner-registration 0b9e2f4c-6d1a-4c52-9a57-3f0e8d1b2a44
    """
    session.client().delete_managed_registration(str(registration_id))
    output.success(f"Managed runner registration {registration_id} deleted.")
