"""Why a deployment's encrypted outputs cannot be answered: the 404 messages of GET .../encrypted-outputs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.api.deployments import OUTPUTS_GONE, outputs_missing
from orchestrator.domain.deployments import Deployment

FINISHED = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RETENTION = timedelta(seconds=300)
ID = uuid.UUID("6f8c0a52-0d0b-4b6e-9d1a-3f0c2e5b7a10")


def deployment(**changes: Any) -> Deployment:
    values: dict[str, Any] = {
        "org_id": "acme",
        "id": ID,
        "project_id": "shop",
        "env_id": "dev",
        "env_uuid": uuid.uuid4(),
        "runner_id": "local",
        "mode": "deploy",
        "plan_only": False,
        "rollback_to_deployment_id": None,
        "status": "succeeded",
        "status_message": "ok",
        "launch_note": None,
        "manifest": {"workloads": {}},
        "tf": "",
        "graph": [],
        "bundle_key": "b",
        "encrypted_outputs_recipient": "age1recipient",
        "encrypted_logs_recipient": None,
        "runner_log_level": "info",
        "idempotency_key_digest": None,
        "request_digest": "0" * 64,
        "created_by": "test",
        "created_at": FINISHED,
        "updated_at": FINISHED,
        "completed_at": FINISHED,
        "outputs": "Y2lwaGVy",
        "metrics": {},
        "error": None,
        "results_digest": None,
        "logs_key": None,
        "logs_size": None,
        "dispatch_state": "done",
        "dispatch_owner": None,
        "dispatch_lease_until": None,
        "dispatch_attempts": 1,
        "handle": None,
        "launched_at": FINISHED,
        "next_check_at": None,
        "exited_at": None,
        "timeout_at": FINISHED,
    }
    return Deployment(**{**values, **changes})


@pytest.mark.parametrize(
    ("changes", "seconds_later", "message"),
    [
        ({}, 299, None),
        ({}, 300, OUTPUTS_GONE),
        ({"outputs": None}, 301, OUTPUTS_GONE),  # deleted by the retention worker
        ({"outputs": None}, 10, f"deployment '{ID}' has no outputs: its runner reported none"),
        (
            {"status": "executing", "completed_at": None, "outputs": None},
            10,
            f"deployment '{ID}' has no outputs yet: it is still executing",
        ),
        ({"status": "failed", "outputs": None}, 10, f"deployment '{ID}' has no outputs: it failed"),
        ({"status": "failed", "outputs": None}, 999, f"deployment '{ID}' has no outputs: it failed"),
        (
            {"mode": "destroy", "outputs": None},
            10,
            f"deployment '{ID}' has no outputs: a destroy reports none",
        ),
        (
            {"encrypted_outputs_recipient": None, "outputs": None},
            999,
            f"deployment '{ID}' has no outputs: it was created without an encrypted_outputs_recipient",
        ),
    ],
)
def test_outputs_missing__says_why(changes: dict[str, Any], seconds_later: int, message: str | None) -> None:
    now = FINISHED + timedelta(seconds=seconds_later)

    assert message == outputs_missing(deployment(**changes), now=now, retention=RETENTION)
