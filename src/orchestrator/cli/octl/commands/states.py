"""``octl get state-versions PROJECT ENV``, ``octl state pull`` and ``octl state rollback``: the Terraform
state versions the orchestrator keeps for an environment (state storage ``orchestrator``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org
from orchestrator.cli.octl.commands.envs import env_arguments
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import (
    OctlGroup,
    OperationFailure,
    Session,
    UsageFailure,
    org_option,
    pass_session,
)

STATE_VERSION = (
    field("Version", "version"),
    field("Serial", "serial"),
    field("Lineage", "lineage"),
    field("Resources", "resources"),
    field("Deployment", "deployment_id"),
    field("Kind", "kind"),
    field("CreatedAt", "created_at"),
    field("Current", "current", wide=True),
    field("RolledBackFrom", "rolled_back_from", wide=True),
    field("CreatedBy", "created_by", wide=True),
)


def describe(version: dict[str, Any]) -> str:
    """A version in words: ``version 3 (serial 5, 2 resources, written by deployment X)``."""
    parts = []
    if version.get("serial") is not None:
        parts.append(f"serial {version['serial']}")
    if version.get("resources") is not None:
        parts.append(f"{version['resources']} resource(s)")
    if version.get("kind") == "rollback":
        parts.append(f"a rollback to version {version.get('rolled_back_from')}")
    elif version.get("deployment_id"):
        parts.append(f"written by deployment {version['deployment_id']}")
    if version.get("created_at"):
        parts.append(f"at {version['created_at']}")
    return f"version {version.get('version')}" + (f" ({', '.join(parts)})" if parts else "")


@verbs.get.command("state-versions")
@env_arguments
@reads_org
def get_state_versions(session: Session, project_id: str, env_id: str, out: str) -> None:
    """List the Terraform state versions of environment ENV of PROJECT, newest (the current state) first.

    The orchestrator keeps every state its state storage `orchestrator` receives, the newest
    PO_STATE_VERSIONS_KEPT (100) of each environment; `-o wide` shows which is current, and who wrote it.

    \b
    Example:
      octl get state-versions shop dev
      octl get state-versions shop dev -o wide
    """
    org = session.org()
    versions = session.client().list_state_versions(org, project_id, env_id)
    emit_list(versions, out, STATE_VERSION, f"No state versions kept for environment {project_id}/{env_id}.")


@click.group("state", cls=OctlGroup)
def state() -> None:
    """Read and roll back the Terraform state the orchestrator keeps for an environment.

    \b
    Example:
      octl get state-versions shop dev
      octl state pull shop dev > dev.tfstate
      octl state rollback shop dev 3
    """


@state.command("pull")
@env_arguments
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    metavar="N",
    help="The state version to print (`octl get state-versions`) [default: the current one].",
)
@click.option(
    "-o",
    "--output",
    "output_file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the state to FILE (mode 0600) instead of standard output.",
)
@org_option
@pass_session
def pull(
    session: Session, project_id: str, env_id: str, version: int | None, output_file: Path | None
) -> None:
    """Print the Terraform state of environment ENV of PROJECT, decrypted, as Terraform wrote it.

    Org admins and platform admins only: a state holds every attribute of every resource, secrets
    included. Each download is recorded in the server's log.

    \b
    Example:
      octl state pull shop dev > dev.tfstate
      octl state pull shop dev --version 3 -o dev-3.tfstate
    """
    org, client = session.org(), session.client()
    if version is None:
        current = client.current_state_version(org, project_id, env_id)
        if current is None:
            raise OperationFailure(f"environment {project_id}/{env_id} has no Terraform state yet")
        version = int(current["version"])
        described = describe(current)
    else:
        described = f"version {version}"
    data = client.download_state_version(org, project_id, env_id, version)
    if output_file is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        output.note(f"State {described} of {project_id}/{env_id}.")
        return
    try:
        _write_private(output_file, data)
    except OSError as exc:
        raise UsageFailure(f"cannot write the state to {output_file}: {exc.strerror or exc}") from exc
    output.success(f"State {described} of {project_id}/{env_id} written to {output_file}.")


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only (a state holds secrets)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(data)


@state.command("rollback")
@env_arguments
@click.argument("version", metavar="VERSION", type=click.IntRange(min=1))
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@org_option
@pass_session
def rollback(session: Session, project_id: str, env_id: str, version: int, yes: bool) -> None:
    """Make state VERSION of environment ENV of PROJECT its current Terraform state again.

    The old state is written as a new version (kind rollback) with the next serial, under the state
    lock; the versions in between stay kept. Refused while a deployment of the environment executes or
    holds the lock. The next deployment plans against the rolled-back state: resources created since
    are no longer in it. Org admins and platform admins only. Asks first (--yes does not); when
    standard input is not a terminal it refuses without --yes. (`octl rollback` is another thing: it
    deploys the manifest of an earlier deployment again.)

    \b
    Example:
      octl get state-versions shop dev
      octl state rollback shop dev 3
      octl state rollback shop dev 3 --yes     # in a script
    """
    org, client = session.org(), session.client()
    where = f"{project_id}/{env_id}"
    if not yes:
        target = client.get_state_version(org, project_id, env_id, version)
        current = client.current_state_version(org, project_id, env_id)
        _confirm(where, target, current)
    written = client.rollback_state_version(org, project_id, env_id, version)
    output.success(
        f"State of {where} rolled back to version {version}: {describe(written)} is current now; the next "
        "deployment plans against it."
    )


def _confirm(where: str, target: dict[str, Any], current: dict[str, Any] | None) -> None:
    """Ask before rolling back; on a standard input that is not a terminal, only --yes goes on."""
    if not sys.stdin.isatty():
        raise UsageFailure(
            f"state rollback of {where} asks for confirmation, and standard input is not a terminal: pass "
            "--yes to roll back without asking"
        )
    now = f" The current state is {describe(current)}." if current else ""
    question = (
        f"Roll back the Terraform state of {where} to {describe(target)}?{now} The next deployment plans "
        "against the rolled-back state."
    )
    if not click.confirm(question, default=False, err=True):
        raise OperationFailure("not rolled back: not confirmed (pass --yes to roll back without asking)")
