"""``octl create|get|delete token``, ``get tokens``: API tokens of the organization."""

from __future__ import annotations

import uuid
from typing import Any

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import (
    ApiFailure,
    Session,
    org_option,
    pass_session,
)

TOKEN = (
    field("Id", "id"),
    field("Role", "role"),
    field("Description", "description", shrink=True),
    field("Prefix", "prefix"),
    field("CreatedAt", "created_at"),
    field("ExpiresAt", "expires_at"),
)


@verbs.create.command("token")
@writes_org
def create_token(session: Session, body: dict[str, Any], out: str) -> None:
    """Create an API token (keys: role (admin, deployer or viewer), description, expires_at).

    The answer holds the secret `token`: it is shown this once and cannot be read again.
    """
    org = session.org()
    token = session.client().create_token(org, body)
    output.emit(token, out, ())
    output.success(
        f"Token {token.get('id')} created in organization {org}. Store the token now: it is not shown again."
    )


@verbs.get.command("token")
@click.argument("token_id", metavar="ID", type=click.UUID)
@reads_org
def get_token(session: Session, token_id: uuid.UUID, out: str) -> None:
    """Show token ID (never its secret)."""
    org = session.org()
    found = [t for t in session.client().list_tokens(org) if t.get("id") == str(token_id)]
    if not found:
        raise ApiFailure(f"not found: token '{token_id}' not found in organization {org}")
    output.emit(found[0], out, TOKEN)


@verbs.get.command("tokens")
@reads_org
def get_tokens(session: Session, out: str) -> None:
    """List the API tokens of the organization (never their secrets)."""
    org = session.org()
    emit_list(session.client().list_tokens(org), out, TOKEN, f"No tokens found in organization {org}.")


@verbs.delete.command("token")
@click.argument("token_id", metavar="ID", type=click.UUID)
@org_option
@pass_session
def delete_token(session: Session, token_id: uuid.UUID) -> None:
    """Revoke token ID: requests with it are refused from now on."""
    org = session.org()
    session.client().delete_token(org, str(token_id))
    output.success(f"Token {token_id} deleted from organization {org}.")
