"""Cancelling a deployment (``POST /orgs/{org}/deployments/{id}/actions/cancel``).

- Final already: 409, saying how it ended.
- Not launched yet (pending and not being launched, or queued for a managed runner): ``cancelled`` at once.
- Otherwise the cancel is recorded (``cancel_requested_at``) and the dispatcher's next check of the run
  (due at once) asks the run's launcher to stop it (``Dispatcher._cancel``: the runner gets SIGTERM, the
  engine one SIGINT, so Terraform saves its state and releases its lock). Whatever ends the deployment
  from then on - the runner's failure results, its exit without results, the timeout - ends it
  ``cancelled`` (``store.deployments.complete``); results saying it succeeded (the apply finished first)
  end it ``succeeded``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.dispatch import gauges, results
from orchestrator.domain.deployments import CANCELLING_MESSAGE, Deployment, Status, cancelled_message
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.store import agent_commands as command_store
from orchestrator.store import deployments as store


@dataclass(frozen=True, kw_only=True)
class Cancelled:
    deployment: Deployment
    #: True: final now (it never ran); False: its run is being stopped.
    final: bool


async def cancel(
    conn: AsyncConnection, org_id: str, deployment_id: uuid.UUID, *, by: str, now: datetime
) -> Cancelled:
    deployment = await store.get(conn, org_id, deployment_id, for_update=True)
    if deployment is None:
        raise NotFoundError(f"deployment '{deployment_id}' not found")
    if deployment.status != Status.EXECUTING:
        raise ConflictError(
            f"deployment '{deployment_id}' already ended ({deployment.status}: {deployment.status_message}); "
            "only an executing deployment can be cancelled"
        )
    if deployment.cancel_requested_at is not None:
        return Cancelled(deployment=deployment, final=False)
    message = cancelled_message(f"cancelled by '{by}' before a runner started it")
    if await store.cancel_unlaunched(conn, deployment.id, by=by, message=message, now=now):
        await command_store.cancel_for_deployment(
            conn, deployment.id, now=now, reason="the deployment was cancelled"
        )
        await gauges.finished(conn, deployment, status=Status.CANCELLED)
        await results.after_final(conn, deployment, succeeded=False, message=message, now=now)
        final = True
    else:
        await store.request_cancel(conn, deployment.id, by=by, message=CANCELLING_MESSAGE, now=now)
        final = False
    updated = await store.get(conn, org_id, deployment_id)
    assert updated is not None
    return Cancelled(deployment=updated, final=final)
