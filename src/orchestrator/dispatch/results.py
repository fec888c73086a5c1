"""Applying what a runner reports: results, and failures the dispatcher observes."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.dispatch import environments, gauges
from orchestrator.domain.deployments import (
    Deployment,
    Mode,
    Status,
    before_start_message,
    with_launch_note,
)
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.protocol.results import DeploymentResults, ResultStatus
from orchestrator.store import deployments as store
from orchestrator.store import phases as phase_store
from orchestrator.store import projects as project_store
from orchestrator.store import states as state_store


def failure_message(results: DeploymentResults) -> str:
    if results.error is None:
        return "runner failed without error details"
    return f"runner failed with code {results.error.error}: {results.error.message}"


def results_digest(results: DeploymentResults) -> str:
    """SHA-256 of the results as canonical JSON: equal for a repeat of the same results."""
    canonical = json.dumps(
        results.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def is_repeat(deployment: Deployment, results: DeploymentResults) -> bool:
    """True if ``results`` are the ones the deployment was finished with (a retry whose answer was lost)."""
    if deployment.results_digest is None:
        return False
    return hmac.compare_digest(deployment.results_digest, results_digest(results))


async def record_results(
    conn: AsyncConnection,
    org_id: str,
    runner_id: str,
    deployment_id: uuid.UUID,
    results: DeploymentResults,
    *,
    now: datetime,
) -> bool:
    """The runner's results for its deployment (locked from the read on): applied once (True); a repeat
    of the applied results (a retry whose answer was lost) changes nothing (False); other results for a
    final deployment are a 409, and never replace the first."""
    deployment = await store.get(conn, org_id, deployment_id, for_update=True)
    if deployment is None or deployment.runner_id != runner_id:
        raise NotFoundError(f"deployment '{deployment_id}' not found")
    if deployment.status != Status.EXECUTING:
        if is_repeat(deployment, results):
            return False
        raise ConflictError(_final_message(deployment))
    await apply_results(conn, deployment, results, now=now)
    return True


def _final_message(deployment: Deployment) -> str:
    if deployment.results_digest is not None:
        return (
            f"deployment '{deployment.id}' already has other results ({deployment.status}); results are "
            "written once"
        )
    return (
        f"deployment '{deployment.id}' already ended without results ({deployment.status}: "
        f"{deployment.status_message}); results are no longer accepted"
    )


async def apply_results(
    conn: AsyncConnection, deployment: Deployment, results: DeploymentResults, *, now: datetime
) -> bool:
    """Finish the deployment from the runner's results, exactly once (the first results win); False if it
    was already final."""
    metrics = dict(deployment.metrics)
    if results.tf_resource_counts is not None:
        counts = results.tf_resource_counts
        metrics.update(
            num_tf_resources=counts.num_resources,
            num_tf_resources_added=counts.num_resources_added,
            num_tf_resources_removed=counts.num_resources_removed,
            num_tf_resources_changed=counts.num_resources_changed,
        )
    succeeded = results.status is ResultStatus.SUCCESS
    ended = await store.complete(
        conn,
        deployment.id,
        status=Status.SUCCEEDED if succeeded else Status.FAILED,
        message=with_launch_note(
            "deployment succeeded" if succeeded else failure_message(results), deployment.launch_note
        ),
        now=now,
        outputs=results.outputs,
        metrics=metrics,
        error=None if results.error is None else results.error.model_dump(mode="json", exclude_none=True),
        results_digest=results_digest(results),
    )
    if ended is not None:
        await gauges.finished(conn, deployment, status=ended)
        await after_final(conn, deployment, succeeded=succeeded, message=failure_message(results), now=now)
    return ended is not None


async def fail(
    conn: AsyncConnection,
    deployment: Deployment,
    message: str,
    *,
    now: datetime,
    code: str,
    before_start: bool = False,
) -> bool:
    """Fail an executing deployment for a reason the orchestrator observed (timeout, lost runner, ...);
    one whose cancel was asked for ends ``cancelled``. ``before_start``: no runner was started for it (its
    launch failed, or no agent or managed runner took it up), which its message says, naming the phase
    it failed in (its phases keep ``queued``/``launching``)."""
    if before_start:
        phase = await phase_store.latest(conn, deployment.id)
        message = before_start_message(message, phase or "queued")
    ended = await store.complete(
        conn,
        deployment.id,
        status=Status.FAILED,
        message=with_launch_note(message, deployment.launch_note),
        now=now,
        error={"error": code, "message": message},
    )
    if ended is not None:
        await gauges.finished(conn, deployment, status=ended)
        await after_final(conn, deployment, succeeded=False, message=message, now=now)
    return ended is not None


async def after_final(
    conn: AsyncConnection, deployment: Deployment, *, succeeded: bool, message: str, now: datetime
) -> None:
    """A finished deployment lets go of the state lock it may still hold (its runner can no longer
    unlock: its token opens only executing deployments); a finished destroy completes the deletion of its
    environment, or marks the deletion failed."""
    await state_store.release_held_by(conn, deployment.env_uuid, deployment.id)
    if deployment.mode != Mode.DESTROY:
        return
    env = await project_store.get_env(conn, deployment.org_id, deployment.project_id, deployment.env_id)
    if env is None or env.uuid != deployment.env_uuid or env.status != "deleting":
        return
    if succeeded:
        await environments.purge(conn, env)
    else:
        await project_store.update_env(
            conn,
            env.org_id,
            env.project_id,
            env.id,
            status="delete_failed",
            status_message=f"delete failed due to a failure in deployment '{deployment.id}': {message}",
        )
