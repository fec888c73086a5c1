"""``octl create|get|update|delete runner``, ``get runners``, ``get compatibility-matrix``."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.octl import completion, inputs, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org, require_changes, writes_org
from orchestrator.cli.octl.output import Column, field
from orchestrator.cli.octl.session import Session, org_option, pass_session

#: Upstream ``RunnerSummary`` columns (the list answers only the two ``type`` fields of the configurations).
RUNNER_SUMMARY = (
    field("Id", "id"),
    field("Description", "description", shrink=True, rank=2),
    field("RunnerType", "runner_configuration.type"),
    field("CreatedAt", "created_at", rank=1),
)
RUNNER = (
    field("Id", "id"),
    field("OrgId", "org_id", rank=3),
    field("Description", "description", shrink=True, rank=2),
    field("RunnerType", "runner_configuration.type"),
    field("StateStorageType", "state_storage_configuration.type"),
    field("CreatedAt", "created_at"),
)
#: ``get runner``: whether this orchestrator can launch the runner's deployments (ours; GET answers it for
#: the runners it launches itself, empty for an agent's).
RUNNER_GOT = (*RUNNER, field("Launchable", "status.launchable"))


@verbs.create.command("runner")
@click.argument("runner_id", metavar="ID")
@writes_org
def create_runner(
    session: Session,
    runner_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Create runner ID.

    The input holds description, runner_configuration (with its type) and state_storage_configuration,
    e.g. `octl create runner my-gke-runner --set-yaml=@gke-runner-config.yaml`.
    """
    body = inputs.with_id(body, "id", runner_id)
    org = session.org()
    runner = session.client().create_runner(org, body)
    output.emit(runner, out, RUNNER)
    _warn(runner)
    output.success(f"Runner {runner_id} created in organization {org}.")


@verbs.get.command("runner")
@click.argument("runner_id", metavar="ID", shell_complete=completion.runners)
@reads_org
def get_runner(session: Session, runner_id: str, out: str) -> None:
    """Show runner ID (-o yaml or json for its whole configuration), and whether this orchestrator can
    launch its deployments (a warning says why not)."""
    runner = session.client().get_runner(session.org(), runner_id)
    output.emit(runner, out, RUNNER_GOT)
    status = runner.get("status")
    if isinstance(status, dict) and status.get("launchable") is False:
        output.warning(str(status.get("message") or "this orchestrator cannot launch this runner"))


@verbs.get.command("runners")
@reads_org
def get_runners(session: Session, out: str) -> None:
    """List the runners of the organization, with the managed pool when the server has one."""
    org = session.org()
    emit_list(
        session.client().list_runners(org, include_managed=True),
        out,
        RUNNER_SUMMARY,
        f"No runners found in organization {org}.",
    )


@verbs.update.command("runner")
@click.argument("runner_id", metavar="ID", shell_complete=completion.runners)
@writes_org
def update_runner(
    session: Session,
    runner_id: str,
    body: dict[str, Any],
    out: str,
) -> None:
    """Update runner ID.

    runner_configuration is merged onto the stored one (JSON Merge Patch, RFC 7396): give only what
    changes, type may be left out, null removes a key, a list replaces the stored list; left-out
    credentials are kept. description and state_storage_configuration replace the stored ones.
    """
    body = require_changes(inputs.without_id(body, "id", runner_id))
    org = session.org()
    runner = session.client().update_runner(org, runner_id, body)
    output.emit(runner, out, RUNNER)
    _warn(runner)
    output.success(f"Runner {runner_id} updated in organization {org}.")


def _warn(runner: dict[str, object]) -> None:
    """The answer's warnings (input read in another shape than given) on stderr."""
    warnings = runner.get("warnings")
    for warning in warnings if isinstance(warnings, list) else []:
        output.warning(str(warning))


@verbs.delete.command("runner")
@click.argument("runner_id", metavar="ID", shell_complete=completion.runners)
@org_option
@pass_session
def delete_runner(session: Session, runner_id: str) -> None:
    """Delete runner ID (refused while an environment is linked to it)."""
    org = session.org()
    session.client().delete_runner(org, runner_id)
    output.success(f"Runner {runner_id} deleted from organization {org}.")


def _accepts(storage: str) -> Column:
    return Column(storage, lambda row: "yes" if storage in row["accepted"] else "no")


@verbs.get.command("compatibility-matrix")
@output.out_option("table")
@pass_session
def get_compatibility_matrix(session: Session, out: str) -> None:
    """Which state storage types each runner type accepts."""
    matrix = session.client().compatibility_matrix()
    if out != "table":
        output.emit(matrix, out, ())
        return
    storages = sorted({s for accepted in matrix.values() for s in accepted})
    columns = [field("RunnerType", "runner_type")] + [_accepts(s) for s in storages]
    rows = [{"runner_type": runner, "accepted": accepted} for runner, accepted in sorted(matrix.items())]
    output.emit(rows, out, columns)
