"""Deployments: the state machine and the value object.

```mermaid
stateDiagram-v2
    [*] --> executing: created (dispatch pending)
    executing --> executing: dispatched (runner launched)
    executing --> succeeded: runner result "success"
    executing --> failed: runner result "failure", runner error, exited without results, timeout
    executing --> cancelled: cancelled before launch; or launched, cancel asked, then the run ended
```

Only ``executing`` changes; ``succeeded``, ``failed`` and ``cancelled`` are final: results and logs are
written once (an identical repeat of the results changes nothing, anything else is refused).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Ended by ``POST .../actions/cancel``: not launched yet, or its run stopped (Terraform interrupted,
    #: its state saved). Upstream's status is a free string: its clients read it as any other final one.
    CANCELLED = "cancelled"


class Mode(StrEnum):
    DEPLOY = "deploy"
    PLAN_ONLY = "plan_only"
    ROLLBACK = "rollback"
    DESTROY = "destroy"


class DispatchState(StrEnum):
    PENDING = "pending"
    #: Runner ``managed``: waiting for a managed runner to claim it (the dispatcher never launches it).
    QUEUED = "queued"
    LAUNCHED = "launched"
    DONE = "done"


EXECUTING_MESSAGE = "Deploying..."


def queued_message(limit: int, host: str) -> str:
    """The status message of a deployment waiting for one of its host's run slots (it stays executing:
    upstream has no queued status)."""
    return (
        f"Queued: all {limit} local run slots of host {host} are in use; "
        "it starts when one is free (PO_LOCAL_RUN_LIMIT)"
    )


CANCELLING_MESSAGE = "Cancelling: the run is being stopped (Terraform interrupted, its state saved)..."


def cancelled_message(detail: str) -> str:
    """The final message of a cancelled deployment."""
    return f"deployment cancelled: {detail}"


TIMEOUT_MESSAGE = "deployment timeout - runner did not complete within expected time"

#: Said after the message of a deployment that failed before its runner started (its phases end with
#: queued or launching: no runner was started, or none picked it up).
BEFORE_START_NOTE = "it failed before its runner started"


def before_start_message(message: str, phase: str) -> str:
    """The message of a deployment that failed before its runner started, while ``phase``."""
    return f"{message} ({BEFORE_START_NOTE}, while {phase})"


#: The length of the status message column.
MAX_STATUS_MESSAGE = 4000


def with_launch_note(message: str, note: str | None) -> str:
    """The status message with the launcher's note after it (shortened to fit the column)."""
    if not note:
        return message
    text = f"{message} (note: {note})"
    return text if len(text) <= MAX_STATUS_MESSAGE else text[: MAX_STATUS_MESSAGE - 1] + "…"


def is_final(status: str) -> bool:
    return status != Status.EXECUTING


def runner_mode(mode: str, plan_only: bool) -> str:
    """What the runner is told (MODE): rollback deploys, destroy destroys, plan_only plans."""
    if mode == Mode.DESTROY:
        return "destroy"
    return "plan_only" if plan_only else "deploy"


@dataclass(frozen=True, kw_only=True)
class Deployment:
    org_id: str
    id: uuid.UUID
    project_id: str
    env_id: str
    env_uuid: uuid.UUID
    runner_id: str
    mode: str
    plan_only: bool
    rollback_to_deployment_id: uuid.UUID | None
    status: str
    status_message: str
    manifest: dict[str, Any]
    tf: str
    graph: list[dict[str, Any]]
    bundle_key: str
    encrypted_outputs_recipient: str | None
    encrypted_logs_recipient: str | None
    runner_log_level: str
    idempotency_key_digest: str | None
    request_digest: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    outputs: str | None
    metrics: dict[str, Any]
    error: dict[str, Any] | None
    #: SHA-256 of the results the runner reported (None while executing, or when it ended without).
    results_digest: str | None
    logs_key: str | None
    logs_size: int | None
    dispatch_state: str
    dispatch_owner: str | None
    dispatch_lease_until: datetime | None
    dispatch_attempts: int
    handle: str | None
    #: What the launcher said about how it launched the run (``launchers.base.Launched.note``), told in
    #: the status message while the deployment executes and after it ended.
    launch_note: str | None
    #: Runner ``managed``: the tags the managed runner that claims it must carry; None: none.
    required_tags: list[str] | None = None
    launched_at: datetime | None
    next_check_at: datetime | None
    exited_at: datetime | None
    timeout_at: datetime
    #: When a cancel was asked for, and by whom (token id); None: never.
    cancel_requested_at: datetime | None = None
    cancel_requested_by: str | None = None
    cancel_sent_at: datetime | None = None

    def log_context(self) -> dict[str, str]:
        """The ids every log line about this deployment carries (bound as structlog context variables)."""
        return {
            "org_id": self.org_id,
            "project_id": self.project_id,
            "env_id": self.env_id,
            "env_uuid": str(self.env_uuid),
            "deployment_id": str(self.id),
        }
