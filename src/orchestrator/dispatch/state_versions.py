"""The state versions of environments whose state the orchestrator keeps (state storage ``orchestrator``).

- Writing one (the state backend's POST, an errored state recovered, a rollback): sealed with the server
  key, described (serial, lineage, managed resource instances, read from the document), then the
  environment's versions beyond the newest ``PO_STATE_VERSIONS_KEPT`` are deleted; the newest, the current
  state, always stays.
- Versions written before migration 0013 have no description stored: it is read from their document
  (opened with the server key) each time they are answered, and not stored back.
- A rollback makes an earlier version current again as a new version (kind ``rollback``): its document
  with the serial after the current one (Terraform refuses a state older than the one it last saw), the
  lineage kept. It takes the state lock for its write, in one transaction with the environment's row
  locked (as deployment creation locks it), and is refused (409) while a deployment of the environment
  executes or another holder has the lock.

An environment whose runner keeps its state elsewhere (``s3``, ``gcs``, ``azurerm``, ``kubernetes``) has
no versions here: asking for them is refused with a 400 that says where its state is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.entities import Environment
from orchestrator.domain.state_versions import Kind, StateVersion, rollback_document, summarize
from orchestrator.errors import ConflictError, InvalidInputError, NotFoundError
from orchestrator.secretbox import SecretBox
from orchestrator.store import deployments as deployment_store
from orchestrator.store import projects as project_store
from orchestrator.store import runners as runner_store
from orchestrator.store import states as store
from orchestrator.store.pages import Page

#: The state storage type whose state the orchestrator keeps.
ORCHESTRATOR_STORAGE = "orchestrator"


def state_context(env_uuid: object) -> str:
    """The seal context of the environment's state versions."""
    return f"tfstate:{env_uuid}"


async def write(
    conn: AsyncConnection,
    box: SecretBox,
    *,
    org_id: str,
    env_uuid: uuid.UUID,
    data: bytes,
    keep: int,
    now: datetime,
    deployment_id: uuid.UUID | None = None,
    created_by: str | None = None,
    kind: Kind = Kind.TERRAFORM,
    rolled_back_from: int | None = None,
) -> int:
    """Add ``data`` as the environment's newest version, then keep only the newest ``keep``; its number."""
    version = await store.add_version(
        conn,
        org_id=org_id,
        env_uuid=env_uuid,
        data=box.seal(data, context=state_context(env_uuid)),
        md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
        size=len(data),
        deployment_id=deployment_id,
        now=now,
        summary=summarize(data),
        kind=kind,
        rolled_back_from=rolled_back_from,
        created_by=created_by,
    )
    await store.prune(conn, env_uuid, keep=keep, newest=version)
    return version


async def environment(
    conn: AsyncConnection, org_id: str, project_id: str, env_id: str, *, for_update: bool = False
) -> Environment:
    """The environment, if the orchestrator keeps its state: NotFoundError when there is none, and
    InvalidInputError when its runner keeps the state in another storage."""
    env = await project_store.get_env(conn, org_id, project_id, env_id, for_update=for_update)
    if env is None:
        raise NotFoundError(f"environment '{env_id}' not found in project '{project_id}'")
    if env.runner_id is not None:
        runner = await runner_store.get_runner(conn, org_id, env.runner_id)
        if runner is not None and runner.state_type != ORCHESTRATOR_STORAGE:
            raise InvalidInputError(
                f"environment '{project_id}/{env_id}' keeps its Terraform state in state storage "
                f"'{runner.state_type}' of its runner '{runner.id}': the orchestrator keeps state versions "
                f"only for state storage '{ORCHESTRATOR_STORAGE}'"
            )
    return env


async def list_page(
    conn: AsyncConnection, box: SecretBox, env: Environment, *, after: tuple[str, ...] | None, limit: int
) -> tuple[Page[StateVersion], int | None]:
    """A page of the environment's versions, newest first, and the current version's number."""
    page = await store.list_page(conn, env.uuid, after=after, limit=limit)
    items = [await _described(conn, box, version) for version in page.items]
    return Page(items=items, next_key=page.next_key), await store.newest_version(conn, env.uuid)


async def get(
    conn: AsyncConnection, box: SecretBox, env: Environment, version: int
) -> tuple[StateVersion, int | None]:
    """One version of the environment (NotFoundError), and the current version's number."""
    found = await store.get_version(conn, env.uuid, version)
    if found is None:
        raise _not_found(env, version)
    return await _described(conn, box, found), await store.newest_version(conn, env.uuid)


async def document(conn: AsyncConnection, box: SecretBox, env: Environment, version: int) -> bytes:
    """The state document of a version, opened."""
    sealed = await store.sealed_data(conn, env.uuid, version)
    if sealed is None:
        raise _not_found(env, version)
    return box.open(sealed, context=state_context(env.uuid))


async def rollback(
    conn: AsyncConnection,
    box: SecretBox,
    *,
    org_id: str,
    project_id: str,
    env_id: str,
    version: int,
    by: str,
    keep: int,
    now: datetime,
) -> StateVersion:
    """Make ``version`` the environment's current state again, as a new version; that new version."""
    env = await environment(conn, org_id, project_id, env_id, for_update=True)
    where = f"{project_id}/{env_id}"
    target = await store.get_version(conn, env.uuid, version)
    if target is None:
        raise _not_found(env, version)
    current = await store.newest_version(conn, env.uuid)
    if current == version:
        raise ConflictError(
            f"state version {version} is the current state of environment '{where}' already: "
            "nothing to roll back"
        )
    executing = await deployment_store.executing_in_env(conn, env.uuid)
    if executing is not None:
        raise ConflictError(
            f"deployment '{executing.id}' of environment '{where}' is executing: its Terraform holds or will "
            "take the state lock; roll back once it has ended"
        )
    lock_id = f"rollback-{uuid.uuid4()}"
    info = {
        "ID": lock_id,
        "Operation": "rollback",
        "Info": f"state rollback of {where} to version {version}",
        "Who": f"token {by}",
        "Created": now.isoformat(),
    }
    holder = await store.try_lock(
        conn, org_id=org_id, env_uuid=env.uuid, lock_id=lock_id, info=info, deployment_id=None, now=now
    )
    if holder is not None:
        raise ConflictError(_held_message(where, holder))
    assert current is not None  # the target exists
    old = await document(conn, box, env, version)
    now_current = summarize(await document(conn, box, env, current))
    earlier = summarize(old)
    if earlier.lineage and now_current.lineage and earlier.lineage != now_current.lineage:
        raise ConflictError(
            f"state version {version} has lineage '{earlier.lineage}', the current state of environment "
            f"'{where}' lineage '{now_current.lineage}': a rollback keeps the lineage, so it goes back only "
            "to a version of the current lineage"
        )
    serial = max(now_current.serial or 0, earlier.serial or 0) + 1
    try:
        data = rollback_document(old, serial=serial)
    except ValueError as exc:
        raise ConflictError(
            f"state version {version} of environment '{where}' is not a Terraform state (a JSON object): "
            "it cannot be made current"
        ) from exc
    added = await write(
        conn,
        box,
        org_id=org_id,
        env_uuid=env.uuid,
        data=data,
        keep=keep,
        now=now,
        created_by=by,
        kind=Kind.ROLLBACK,
        rolled_back_from=version,
    )
    await store.unlock_held(conn, env.uuid, lock_id)
    written = await store.get_version(conn, env.uuid, added)
    assert written is not None
    return written


def _held_message(where: str, holder: dict[str, Any]) -> str:
    info = holder.get("info") or {}
    by = f"deployment '{holder['deployment_id']}'" if holder.get("deployment_id") else "another client"
    details = ", ".join(f"{key} {info[key]}" for key in ("Operation", "Who") if info.get(key))
    return (
        f"the state of environment '{where}' is locked by {by} (lock '{holder.get('lock_id')}'"
        f"{', ' + details if details else ''}): roll back once it is released"
    )


def _not_found(env: Environment, version: int) -> NotFoundError:
    return NotFoundError(f"state version {version} not found in environment '{env.project_id}/{env.id}'")


async def _described(conn: AsyncConnection, box: SecretBox, version: StateVersion) -> StateVersion:
    """``version`` with its serial, lineage and resources; read from the document when the row has none
    (written before migration 0013)."""
    if (version.serial, version.lineage, version.resources) != (None, None, None):
        return version
    sealed = await store.sealed_data(conn, version.env_uuid, version.version)
    if sealed is None:
        return version
    summary = summarize(box.open(sealed, context=state_context(version.env_uuid)))
    return dataclasses.replace(
        version, serial=summary.serial, lineage=summary.lineage, resources=summary.resources
    )
