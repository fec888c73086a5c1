"""Removing an environment for good: its row, its deployments' records and the state the orchestrator kept.

Bundles and logs of its deployments are left to the object store's lifecycle (they are keyed by org and
deployment; nothing references them any more).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment
from orchestrator.store import deployments as deployment_store
from orchestrator.store import projects as project_store
from orchestrator.store import states as state_store


async def purge(conn: AsyncConnection, env: Environment) -> list[str]:
    """Delete the environment with its deployments and kept state; returns the blob keys now unreferenced."""
    removed = await deployment_store.delete_for_env(conn, env.uuid)
    await state_store.delete_env(conn, env.uuid)
    await project_store.delete_env(conn, env.org_id, env.project_id, env.id)
    return [key for d in removed for key in (d.bundle_key, d.logs_key) if key]
