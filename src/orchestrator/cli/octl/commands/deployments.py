"""``octl get deployments`` (alias ``deps``), ``get deployment`` (``dep``), ``octl tf``, ``octl cancel``."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import click

from orchestrator.cli.octl import completion, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org
from orchestrator.cli.octl.output import Column, field
from orchestrator.cli.octl.progress import format_duration
from orchestrator.cli.octl.session import OperationFailure, Session, org_option, pass_session

#: The latest phase; "-" where there is none (a deployment made before phases were recorded), so that
#: a piped table keeps one word per column.
PHASE = Column("Phase", lambda d: d.get("phase") or "-", rank=3)
DEPLOYMENT_SUMMARY = (
    field("Id", "id"),
    field("ProjectId", "project_id", rank=2),
    field("EnvId", "env_id", rank=2),
    field("Mode", "mode", rank=4),
    field("Status", "status"),
    PHASE,
    field("CreatedAt", "created_at", rank=1),
    field("CompletedAt", "completed_at", wide=True),
    field("RunnerId", "runner_id", wide=True),
    field("StatusMessage", "status_message", wide=True, shrink=True),
)
DEPLOYMENT = (
    *DEPLOYMENT_SUMMARY[:7],
    field("CompletedAt", "completed_at"),
    field("RunnerId", "runner_id"),
    field("StatusMessage", "status_message", shrink=True),
)
#: ``get deployment``: the phases it went through, each with how long it took (to the next one, or to the
#: deployment's end; nothing for the phase it is in).
PHASE_HISTORY = (field("Phase", "phase"), field("StartedAt", "started_at"), field("Took", "took"))
STATUSES = ("executing", "succeeded", "failed", "cancelled")
#: Stored modes; a plan-only deployment is mode deploy with plan_only set, so plan_only is no filter.
MODES = ("deploy", "rollback", "destroy")


@verbs.get.command("deployments")
@click.option(
    "--project",
    "project_id",
    metavar="PROJECT",
    help="Only the deployments of this project.",
    shell_complete=completion.projects,
)
@click.option(
    "--env",
    "env_id",
    metavar="ENV",
    help="Only the deployments to this environment.",
    shell_complete=completion.envs,
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(STATUSES),
    help="Only these statuses (repeatable).",
)
@click.option(
    "--mode", "modes", multiple=True, type=click.Choice(MODES), help="Only these modes (repeatable)."
)
@reads_org
def get_deployments(
    session: Session,
    project_id: str | None,
    env_id: str | None,
    statuses: tuple[str, ...],
    modes: tuple[str, ...],
    out: str,
) -> None:
    """List deployments, newest first (alias: deps)."""
    org = session.org()
    deployments = session.client().list_deployments(
        org, project_id=project_id, env_id=env_id, statuses=statuses, modes=modes
    )
    emit_list(deployments, out, summary_columns(deployments), f"No deployments found in organization {org}.")


def summary_columns(deployments: list[dict[str, Any]]) -> tuple[output.Column, ...]:
    """The list's columns: while one of them executes, its phase is what a reader looks for first
    (kept before the age and the project on a narrow terminal)."""
    if not any(d.get("status") == "executing" for d in deployments):
        return DEPLOYMENT_SUMMARY
    return tuple(replace(c, rank=0) if c is PHASE else c for c in DEPLOYMENT_SUMMARY)


@verbs.get.command("deployment")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@reads_org
def get_deployment(session: Session, deployment_id: uuid.UUID, out: str) -> None:
    """Show a deployment and the phases it went through (alias: dep; -o yaml or json for its manifest,
    metrics and error)."""
    deployment = session.client().get_deployment(session.org(), str(deployment_id))
    output.emit(deployment, out, DEPLOYMENT)
    history = phase_history(deployment)
    if history and out in ("table", "wide"):
        click.echo()
        output.table(history, PHASE_HISTORY, wide=out == "wide")


def phase_history(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployment's phases with how long each took: until the next one started, the last one until
    the deployment completed (nothing while it is in it)."""
    phases = [p for p in deployment.get("phases") or [] if isinstance(p, dict)]
    ends = [p.get("started_at") for p in phases[1:]] + [deployment.get("completed_at")]
    rows = []
    for phase, end in zip(phases, ends, strict=True):
        start = output.parse_time(str(phase.get("started_at") or ""))
        stop = output.parse_time(str(end or ""))
        took = format_duration((stop - start).total_seconds()) if start and stop else ""
        rows.append({"phase": phase.get("phase"), "started_at": phase.get("started_at"), "took": took})
    return rows


@click.command("tf")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@org_option
@pass_session
def tf(session: Session, deployment_id: uuid.UUID) -> None:
    """Print the Terraform code (main.tf) the orchestrator compiled for a deployment."""
    code = session.client().get_deployment_tf(session.org(), str(deployment_id))
    click.echo(code, nl=not code.endswith("\n"))


@click.command("cancel")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@click.option(
    "--no-wait", is_flag=True, help="Return once the cancel is accepted, without waiting for the run to stop."
)
@org_option
@pass_session
def cancel(session: Session, deployment_id: uuid.UUID, no_wait: bool) -> None:
    """Cancel an executing deployment.

    Not started yet: it ends cancelled at once. Running: its runner is stopped as Terraform expects
    (an interrupt, then the grace period): Terraform saves its state and releases its lock, and the
    deployment ends cancelled; the next deploy plans from that state. Exits 0 once it is cancelled,
    1 if it ended otherwise (it finished first) or had ended already.

    \b
    Example:
      octl cancel 5f0c6a52-3a4e-4d8f-9d0e-2b7c1e4f8a90
    """
    # Imported here: deploy imports this module.
    from orchestrator.cli.octl.commands import deploy

    org, started = session.org(), time.monotonic()
    deployment = session.client().cancel_deployment(org, str(deployment_id))
    if deployment.get("status") == "executing":
        if no_wait:
            output.note(
                f"Cancelling deployment {deployment_id}: its run is being stopped; "
                f"`octl get deployment {deployment_id}` shows how it ends."
            )
            return
        output.note(f"Cancelling deployment {deployment_id}: stopping its run (Terraform saves its state)...")
        deployment = deploy.wait(session, org, str(deployment_id), started)
    status, message = deployment.get("status"), deployment.get("status_message") or ""
    if status != "cancelled":
        raise OperationFailure(
            f"deployment {deployment_id} {status} before the cancel took effect: {message}"
        )
    output.success(f"Deployment {deployment_id} cancelled: {message}")


verbs.get.add_alias("dep", "deployment")
verbs.get.add_alias("deps", "deployments")
