"""``octl create|get|update|delete env PROJECT ENV``, ``get envs [PROJECT]`` and ``refresh-runner``."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

import click
from rich.console import Console

from orchestrator.cli.octl import completion, inputs, keys, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import F, emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.progress import WaitProgress
from orchestrator.cli.octl.session import (
    OperationFailure,
    Session,
    UsageFailure,
    org_option,
    pass_session,
)
from orchestrator.client.api import ApiClient, ApiError

#: How often `delete env --wait` looks whether the environment is gone.
WAIT_POLL_SECONDS = 1.0
#: The destroy deployment's id in the status message of an environment being deleted.
_DEPLOYMENT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

ENV = (
    field("ProjectId", "project_id", key=True),
    field("Id", "id"),
    field("EnvTypeId", "env_type_id", rank=3),
    field("RunnerId", "runner_id", rank=2),
    field("Status", "status"),
    field("CreatedAt", "created_at", rank=1),
)


def env_arguments(func: F) -> F:
    """The PROJECT and ENV arguments that name an environment (as ``project_id`` and ``env_id``)."""
    env = click.argument("env_id", metavar="ENV", shell_complete=completion.envs)
    return click.argument("project_id", metavar="PROJECT", shell_complete=completion.projects)(env(func))


def new_env_arguments(func: F) -> F:
    """The PROJECT and ENV arguments of an environment to create (only PROJECT completes)."""
    env = click.argument("env_id", metavar="ENV")
    return click.argument("project_id", metavar="PROJECT", shell_complete=completion.projects)(env(func))


def _in_project(body: dict[str, Any], project_id: str) -> dict[str, Any]:
    """The body without ``project_id`` (the argument names the project), refused when it names another."""
    if "project_id" in body and body["project_id"] != project_id:
        given = body["project_id"]
        raise inputs.InputError(
            f"the input sets project_id '{given}', but the argument is '{project_id}'; they must agree"
        )
    body.pop("project_id", None)
    return body


@verbs.create.command("env")
@new_env_arguments
@writes_org
def create_env(
    session: Session,
    project_id: str,
    env_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create environment ENV in PROJECT (keys: env_type_id (required), display_name)."""
    body = _in_project(inputs.with_id(body, "id", env_id), project_id)
    org = session.org()
    output.emit(session.client().create_env(org, project_id, body), out, ENV)
    output.success(f"Environment {project_id}/{env_id} created in organization {org}.")


@verbs.get.command("env")
@env_arguments
@reads_org
def get_env(session: Session, project_id: str, env_id: str, out: str) -> None:
    """Show environment ENV of PROJECT, with the runner it is linked to."""
    output.emit(session.client().get_env(session.org(), project_id, env_id), out, ENV)


@verbs.get.command("envs")
@click.argument("project_id", metavar="[PROJECT]", required=False, shell_complete=completion.projects)
@click.option("--env-type", "env_type_id", metavar="ENV_TYPE", help="Only environments of this type.")
@reads_org
def get_envs(session: Session, project_id: str | None, env_type_id: str | None, out: str) -> None:
    """List the environments of PROJECT, or of the whole organization."""
    org = session.org()
    where = f"project {project_id}" if project_id else f"organization {org}"
    envs = session.client().list_envs(org, project_id, env_type_id=env_type_id)
    emit_list(envs, out, ENV, f"No environments found in {where}.")


@verbs.update.command("env")
@env_arguments
@writes_org
def update_env(
    session: Session,
    project_id: str,
    env_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update environment ENV of PROJECT (key: display_name)."""
    body = _in_project(inputs.without_id(body, "id", env_id), project_id)
    org = session.org()
    output.emit(session.client().update_env(org, project_id, env_id, require_changes(body)), out, ENV)
    output.success(f"Environment {project_id}/{env_id} updated in organization {org}.")


@verbs.delete.command("env")
@env_arguments
@click.option("--force", is_flag=True, help="Delete without destroying the environment's resources.")
@click.option(
    "--wait", is_flag=True, help="Wait until the destroy deployment has run and the environment is gone."
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@org_option
@pass_session
def delete_env(session: Session, project_id: str, env_id: str, force: bool, wait: bool, yes: bool) -> None:
    """Delete environment ENV of PROJECT; a destroy deployment runs first unless --force is given.

    Asks before it deletes (--yes does not). The destroy's logs are encrypted to a key saved with the
    deployments' keys (see `octl deploy --help`); when the destroy fails, the environment stays, in
    status delete_failed, and the error says how to read the logs and how to go on.

    \b
    Example:
      octl delete env shop dev                 # asks, then destroys the resources and deletes
      octl delete env shop dev --yes --wait    # in a script: no question, wait for the end
      octl delete env shop dev --force --yes   # delete, leaving the resources and their state behind
    """
    org = session.org()
    client = session.client()
    orphaned = _orphaned(client, org, project_id, env_id) if force else None
    _confirm(project_id, env_id, force=force, yes=yes, orphaned=orphaned)
    logs_key = None if force else keys.KeyPair.generate()
    deleting = client.delete_env(
        org, project_id, env_id, force=force, logs_recipient=logs_key.recipient if logs_key else None
    )
    if deleting is None:
        if orphaned:
            output.warning(f"left behind by --force: {orphaned}")
        output.success(f"Environment {project_id}/{env_id} deleted from organization {org}.")
        return
    message = str(deleting.get("status_message") or "")
    output.note(f"Environment {project_id}/{env_id} is being deleted: {message}.")
    read_logs = _save_destroy_logs_key(message, logs_key)
    go_on = f"to delete it without destroying its resources: `octl delete env {project_id} {env_id} --force`"
    if not wait:
        output.note(
            f"`octl get env {project_id} {env_id}` shows how it ends. If the destroy fails: {read_logs}"
            f"{go_on}."
        )
        return
    progress = WaitProgress(
        f"Waiting for environment {project_id}/{env_id} to be destroyed", console=Console(stderr=True)
    )
    with progress:
        while True:
            progress.poll()
            time.sleep(WAIT_POLL_SECONDS)
            try:
                env = client.get_env(org, project_id, env_id)
            except ApiError as exc:
                if exc.status == 404:
                    break
                raise
            if env.get("status") == "delete_failed":
                failed = str(env.get("status_message") or "the destroy deployment failed")
                raise OperationFailure(f"{failed}; {read_logs}{go_on}")
    output.success(f"Environment {project_id}/{env_id} destroyed and deleted from organization {org}.")


def _orphaned(client: ApiClient, org: str, project_id: str, env_id: str) -> str | None:
    """What a forced delete leaves behind, in words: the deployments that may have created resources
    there (deploys and rollbacks that were not plan-only, succeeded or failed), the newest named with its
    last resource count, and the state describing them; None when nothing was ever applied there."""
    env = client.get_env(org, project_id, env_id)
    applied = [
        d
        for d in client.list_deployments(
            org, project_id=project_id, env_id=env_id, modes=("deploy", "rollback")
        )
        if not d.get("plan_only") and d.get("status") != "executing"
    ]
    if not applied:
        return None
    newest = applied[0]
    counted = (newest.get("metrics") or {}).get("num_tf_resources")
    resources = (
        f"{counted} Terraform resource(s) after it" if isinstance(counted, int) else "no resource count"
    )
    return (
        f"the resources applied by {len(applied)} deployment(s) of {project_id}/{env_id}, the newest "
        f"'{newest['id']}' ({newest.get('status')}, {resources}), are not destroyed; their Terraform state "
        f"stays in the state storage of runner '{env.get('runner_id') or newest.get('runner_id')}' under "
        f"environment UUID {env.get('uuid')}"
    )


def _confirm(project_id: str, env_id: str, *, force: bool, yes: bool, orphaned: str | None = None) -> None:
    """Ask before deleting; on a stdin that is not a terminal, only --yes goes on."""
    if yes:
        return
    what = (
        (orphaned or "nothing was ever applied there") + " (--force)"
        if force
        else "a destroy deployment removes its resources first"
    )
    if not sys.stdin.isatty():
        raise UsageFailure(
            f"delete env {project_id} {env_id} asks for confirmation, and standard input is not a terminal: "
            "pass --yes to delete without asking"
        )
    if not click.confirm(f"Delete environment {project_id}/{env_id}? {what}.", default=False, err=True):
        raise OperationFailure("not deleted: not confirmed (pass --yes to delete without asking)")


def _save_destroy_logs_key(status_message: str, logs_key: keys.KeyPair | None) -> str:
    """Save the destroy's logs key next to the deployments' keys; the sentence that says how to read the
    logs ("" when there is no key or no destroy deployment)."""
    found = _DEPLOYMENT_ID.search(status_message)
    if logs_key is None or found is None:
        return ""
    deployment_id = found.group(0)
    directory = keys.default_directory(os.environ)
    try:
        keys.prepare_directory(directory)
        path = keys.save(directory, keys.logs_file(directory, deployment_id).name, logs_key)
    except inputs.InputError as exc:
        output.warning(f"the destroy's logs key was not saved ({exc}); its logs key is {logs_key.identity}")
        return f"its logs: `octl logs {deployment_id} --key <its logs key>`; "
    return f"its logs: `octl logs {deployment_id} --key @{path}`; "


@click.command("refresh-runner")
@env_arguments
@click.option("--dry-run", is_flag=True, help="Only show the runner the rules select; change nothing.")
@output.out_option("yaml")
@org_option
@pass_session
def refresh_runner(session: Session, project_id: str, env_id: str, dry_run: bool, out: str) -> None:
    """Re-link environment ENV of PROJECT to the runner its runner rules select now.

    An environment keeps its runner when rules change until this is run: a new runner may use
    another state storage. Prints the runner id and whether the link changed.
    """
    org = session.org()
    result = session.client().refresh_runner(org, project_id, env_id, dry_run=dry_run)
    output.emit(result, out, ())
    runner, updated = result.get("runner_id"), bool(result.get("updated"))
    env = f"Environment {project_id}/{env_id}"
    if dry_run:
        change = "would change to" if updated else "would stay linked to"
        output.note(f"Dry run: {env} {change} runner {runner}; nothing was changed.")
    elif updated:
        output.success(f"{env} is now linked to runner {runner}.")
    else:
        output.success(f"{env} stays linked to runner {runner}; nothing changed.")
