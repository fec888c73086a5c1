"""Deleting an environment: a destroy deployment first, unless nothing was ever applied there or the delete
is forced; then, for good, its row and the (by then empty) Terraform state the orchestrator kept for it
(``purge``). A forced delete removes only the row: the state the orchestrator kept stays, under the
environment's UUID, since the resources it describes were not destroyed (state is never thrown away while it
may hold something).

Its deployments stay on record (keyed by the environment's UUID, so an environment created again under
the same id starts afresh and is never confused with the deleted one).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.dispatch import creation
from orchestrator.domain.entities import Environment
from orchestrator.errors import ConflictError, NotFoundError
from orchestrator.store import deployments as deployment_store
from orchestrator.store import projects as project_store
from orchestrator.store import states as state_store


async def purge(conn: AsyncConnection, env: Environment) -> None:
    await state_store.delete_env(conn, env.uuid)
    await project_store.delete_env(conn, env.org_id, env.project_id, env.id)


async def delete(
    conn: AsyncConnection,
    ctx: creation.Context,
    org_id: str,
    project_id: str,
    env_id: str,
    *,
    force: bool,
    created_by: str,
    now: datetime,
    logs_recipient: str | None = None,
) -> Environment | None:
    """Delete the environment (locked from the read on): purged at once when nothing was ever applied there,
    removed at once when ``force`` is set (None; its infrastructure and the state describing it are left
    behind, the state the orchestrator keeps included), else marked
    ``deleting`` behind a destroy deployment (the environment as it is now). 409 while another deployment
    executes there (with force, a destroy may)."""
    env = await project_store.get_env(conn, org_id, project_id, env_id, for_update=True)
    if env is None:
        raise NotFoundError(f"environment '{env_id}' not found in project '{project_id}'")
    executing = await deployment_store.executing_in_env(conn, env.uuid)
    if executing is not None and not (force and executing.mode == "destroy"):
        raise ConflictError(
            f"deployment '{executing.id}' is executing in environment '{project_id}/{env_id}'; "
            "wait for it to finish"
        )
    destroy = (
        None
        if force
        else await creation.create_destroy(
            conn, ctx, env, created_by=created_by, now=now, logs_recipient=logs_recipient
        )
    )
    if destroy is None:
        if force:
            # Its resources stay: so does their state (keyed by the environment's UUID, never reused).
            await project_store.delete_env(conn, env.org_id, env.project_id, env.id)
        else:
            await purge(conn, env)
        return None
    updated = await project_store.update_env(
        conn,
        org_id,
        project_id,
        env_id,
        status="deleting",
        status_message=f"destroy deployment '{destroy.id}'",
    )
    assert updated is not None
    return updated
