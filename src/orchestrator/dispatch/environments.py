"""Removing an environment for good: its row and the Terraform state the orchestrator kept for it.

Its deployments stay on record (keyed by the environment's UUID, so an environment created again under
the same id starts afresh and is never confused with the deleted one).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment
from orchestrator.store import projects as project_store
from orchestrator.store import states as state_store


async def purge(conn: AsyncConnection, env: Environment) -> None:
    await state_store.delete_env(conn, env.uuid)
    await project_store.delete_env(conn, env.org_id, env.project_id, env.id)
