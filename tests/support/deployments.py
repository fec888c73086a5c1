"""Deployments written straight to the store, for tests of routes that need one but no runner."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store import deployments as deployment_store

#: The age recipient the inserted deployments were created with (their outputs are stand-in ciphertext).
OUTPUTS_RECIPIENT = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"


async def insert_deployment(
    app: FastAPI,
    org_id: str,
    env: dict[str, Any],
    *,
    status: str = "succeeded",
    runner_id: str = "vm1",
    tf: str = "terraform {}",
    created_by: str = "test",
) -> str:
    """A deployment of ``env`` (as the API answers it) with outputs and logs; ``status`` executing makes it
    one the gateway still serves."""
    services = app.state.services
    deployment_id = uuid.uuid4()
    now = datetime.now(UTC)
    final = status != "executing"
    await services.blobs.put(f"logs/{org_id}/{deployment_id}", base64.b64encode(b"ciphertext"))
    await services.blobs.put(f"bundles/{org_id}/{deployment_id}.tar.gz", b"bundle bytes")
    async with services.engine.begin() as conn:
        await deployment_store.insert(
            conn,
            {
                "id": deployment_id,
                "org_id": org_id,
                "project_id": env["project_id"],
                "env_id": env["id"],
                "env_uuid": uuid.UUID(env["uuid"]),
                "runner_id": runner_id,
                "mode": "deploy",
                "plan_only": False,
                "status": status,
                "status_message": "deployment succeeded" if final else "Deploying...",
                "manifest": {"workloads": {}},
                "tf": tf,
                "graph": [],
                "bundle_key": f"bundles/{org_id}/{deployment_id}.tar.gz",
                "encrypted_outputs_recipient": OUTPUTS_RECIPIENT,
                "runner_log_level": "info",
                "request_digest": "0" * 64,
                "created_by": created_by,
                "created_at": now,
                "updated_at": now,
                "completed_at": now if final else None,
                "outputs": base64.b64encode(b"ciphertext").decode() if final else None,
                "metrics": {"num_workloads": 0, "num_resource_nodes": 0},
                "logs_key": f"logs/{org_id}/{deployment_id}" if final else None,
                "logs_size": 10 if final else None,
                # Launched (by nobody): the dispatcher leaves it alone until its next check.
                "dispatch_state": "done" if final else "launched",
                "dispatch_attempts": 1,
                "handle": None,
                "next_check_at": None if final else datetime(2999, 1, 1, tzinfo=UTC),
                "launched_at": now,
                "timeout_at": datetime(2999, 1, 1, tzinfo=UTC),
            },
        )
    return str(deployment_id)


async def insert_run(
    conn: AsyncConnection,
    org_id: str,
    env: dict[str, Any],
    *,
    runner_id: str,
    created_at: datetime,
    launched_at: datetime | None,
    completed_at: datetime | None = None,
    exited_at: datetime | None = None,
) -> uuid.UUID:
    """A deployment of ``env`` (as the API answers it) with the given times, through the store, for usage
    figures: final when ``completed_at`` is given, else executing (one per environment)."""
    deployment_id = uuid.uuid4()
    final = completed_at is not None
    await deployment_store.insert(
        conn,
        {
            "id": deployment_id,
            "org_id": org_id,
            "project_id": env["project_id"],
            "env_id": env["id"],
            "env_uuid": uuid.UUID(env["uuid"]),
            "runner_id": runner_id,
            "mode": "deploy",
            "plan_only": False,
            "status": "succeeded" if final else "executing",
            "status_message": "deployment succeeded" if final else "Deploying...",
            "manifest": {"workloads": {}},
            "tf": "terraform {}",
            "graph": [],
            "bundle_key": f"bundles/{org_id}/{deployment_id}.tar.gz",
            "runner_log_level": "info",
            "request_digest": "0" * 64,
            "created_by": "test",
            "created_at": created_at,
            "updated_at": completed_at or created_at,
            "completed_at": completed_at,
            "metrics": {"num_workloads": 0, "num_resource_nodes": 0},
            # Never picked up by a dispatcher: done, or launched by nobody and never checked.
            "dispatch_state": "done" if final else "launched",
            "dispatch_attempts": 1,
            "next_check_at": None if final else datetime(2999, 1, 1, tzinfo=UTC),
            "launched_at": launched_at,
            "exited_at": exited_at,
            "timeout_at": datetime(2999, 1, 1, tzinfo=UTC),
        },
    )
    return deployment_id
