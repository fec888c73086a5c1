"""``octl get deployments`` (alias ``deps``), ``get deployment`` (``dep``), ``octl tf``, ``octl cancel``."""

from __future__ import annotations

import time
import uuid

import click

from orchestrator.cli.octl import completion, output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.commands.common import emit_list, reads_org
from orchestrator.cli.octl.output import field
from orchestrator.cli.octl.session import OperationFailure, Session, org_option, pass_session

DEPLOYMENT_SUMMARY = (
    field("Id", "id"),
    field("ProjectId", "project_id", rank=2),
    field("EnvId", "env_id", rank=2),
    field("Mode", "mode", rank=4),
    field("Status", "status"),
    field("CreatedAt", "created_at", rank=1),
    field("CompletedAt", "completed_at", wide=True),
    field("RunnerId", "runner_id", wide=True),
    field("StatusMessage", "status_message", wide=True, shrink=True),
)
DEPLOYMENT = (
    *DEPLOYMENT_SUMMARY[:6],
    field("CompletedAt", "completed_at"),
    field("RunnerId", "runner_id"),
    field("StatusMessage", "status_message", shrink=True),
)
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
    emit_list(deployments, out, DEPLOYMENT_SUMMARY, f"No deployments found in organization {org}.")


@verbs.get.command("deployment")
@click.argument("deployment_id", metavar="DEPLOYMENT", type=click.UUID, shell_complete=completion.deployments)
@reads_org
def get_deployment(session: Session, deployment_id: uuid.UUID, out: str) -> None:
    """Show a deployment (alias: dep; -o yaml or json for its manifest, metrics and error)."""
    output.emit(session.client().get_deployment(session.org(), str(deployment_id)), out, DEPLOYMENT)


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
