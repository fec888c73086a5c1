"""Terraform state the engine could not save (``errored.tfstate``): recovered, never dropped.

When Terraform cannot write its state to the backend (the orchestrator was down longer than the http
backend's retries, an S3 endpoint unreachable), it leaves ``errored.tfstate`` in its working directory.
The runner hands it over through the gateway (``POST .../errored-state``), or, when the runner died
first, the dispatcher reads it from a local run's directory. Either way it lands here:

- state storage ``orchestrator`` (the deployment's code uses the ``http`` backend): when the environment
  has no state yet, or the file has the lineage of the environment's newest state and a serial no lower,
  it becomes the environment's newest state version (``state_versions.write``: the same bytes twice change
  nothing; ``keep``: PO_STATE_VERSIONS_KEPT), and a state lock the deployment still holds is released;
- otherwise (another lineage, an older serial, or state kept by ``s3``/``gcs``/``azurerm``/``kubernetes``,
  which the orchestrator cannot write): it is kept, sealed with the server key, in the object store under
  ``errored-states/<org>/<env uuid>/<deployment>.tfstate``, and an org admin downloads it with
  ``GET /orgs/{org}/deployments/{id}/errored-state`` to push it with ``terraform state push``.

Kept states are not subject to object retention (``dispatch.retention`` deletes bundles and logs only).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestrator.blobs import BlobStore
from orchestrator.dispatch import state_versions
from orchestrator.dispatch.state_versions import state_context
from orchestrator.domain.deployments import Deployment, Status
from orchestrator.errors import InvalidInputError
from orchestrator.protocol.results import ErroredStateOutcome, ErroredStateReceipt
from orchestrator.secretbox import SecretBox
from orchestrator.store import states as state_store

#: The backend the compiler writes for state storage ``orchestrator``.
ORCHESTRATOR_BACKEND = 'backend "http"'


@dataclass(frozen=True, kw_only=True)
class StateFile:
    """What the checks need of a Terraform state file."""

    lineage: str
    serial: int
    md5: str


def parse(data: bytes) -> StateFile:
    """The lineage and serial of a Terraform state file; ``InvalidInputError`` if it is none."""
    try:
        document: Any = json.loads(data)
    except ValueError as exc:
        raise InvalidInputError("the errored state is not JSON") from exc
    if not isinstance(document, dict):
        raise InvalidInputError("the errored state is not a Terraform state file (a JSON object)")
    lineage, serial = document.get("lineage", ""), document.get("serial")
    if not isinstance(document.get("version"), int) or not isinstance(document.get("resources"), list):
        raise InvalidInputError("the errored state is not a Terraform state file (no version or resources)")
    if not isinstance(lineage, str):
        raise InvalidInputError("lineage: must be a string")
    if not isinstance(serial, int) or isinstance(serial, bool) or serial < 0:
        raise InvalidInputError("serial: must be a non-negative integer")
    return StateFile(lineage=lineage, serial=serial, md5=hashlib.md5(data, usedforsecurity=False).hexdigest())


def blob_key(deployment: Deployment) -> str:
    return f"errored-states/{deployment.org_id}/{deployment.env_uuid}/{deployment.id}.tfstate"


def _kept_context(deployment: Deployment) -> str:
    return f"errored-tfstate:{deployment.id}"


def uses_orchestrator_storage(deployment: Deployment) -> bool:
    return ORCHESTRATOR_BACKEND in deployment.tf


def api_path(deployment: Deployment) -> str:
    return f"/orgs/{deployment.org_id}/deployments/{deployment.id}/errored-state"


async def recover(
    engine: AsyncEngine,
    *,
    box: SecretBox,
    blobs: BlobStore,
    deployment: Deployment,
    data: bytes,
    now: datetime,
    keep: int,
) -> ErroredStateReceipt:
    """Make ``data`` the environment's state if it fits, else keep it sealed; what happened."""
    found = parse(data)
    reason: str | None = (
        "the environment's state is kept by its own backend, which the orchestrator cannot write"
    )
    if deployment.status != Status.EXECUTING:
        # Another deployment may hold the environment's state by now: never write over it.
        reason = f"the deployment was {deployment.status} already"
    elif uses_orchestrator_storage(deployment):
        async with engine.begin() as conn:
            stored = await _store(conn, box, deployment, data, found, now=now, keep=keep)
        if isinstance(stored, ErroredStateReceipt):
            return stored
        reason = stored
    await blobs.put(blob_key(deployment), box.seal(data, context=_kept_context(deployment)).encode())
    return ErroredStateReceipt(
        outcome=ErroredStateOutcome.KEPT,
        message=(
            f"the orchestrator keeps it sealed with the deployment ({reason}): an org admin downloads it "
            f"with GET {api_path(deployment)} and pushes it with `terraform state push`"
        ),
    )


async def _store(
    conn: AsyncConnection,
    box: SecretBox,
    deployment: Deployment,
    data: bytes,
    found: StateFile,
    *,
    now: datetime,
    keep: int,
) -> ErroredStateReceipt | str:
    """Make ``data`` the environment's newest state version if it fits; else why not."""
    context = state_context(deployment.env_uuid)
    latest = await state_store.latest(conn, deployment.env_uuid)
    current = None if latest is None else _current(box.open(latest[1], context=context))
    reason = _mismatch(found, current)
    if reason is not None:
        return reason
    if latest is not None and current is not None and current.md5 == found.md5:
        version = latest[0]  # the same bytes again (a retried upload): nothing to add
    else:
        version = await state_versions.write(
            conn,
            box,
            org_id=deployment.org_id,
            env_uuid=deployment.env_uuid,
            data=data,
            keep=keep,
            now=now,
            deployment_id=deployment.id,
            created_by=deployment.created_by,
        )
    released = await state_store.release_held_by(conn, deployment.env_uuid, deployment.id)
    message = f"it is the environment's state version {version} now (serial {found.serial})"
    if released:
        message += ", and the state lock the deployment held is released"
    return ErroredStateReceipt(outcome=ErroredStateOutcome.STORED, message=message, version=version)


async def kept(blobs: BlobStore, box: SecretBox, deployment: Deployment) -> bytes | None:
    """The errored state kept with ``deployment``, opened; None if there is none."""
    sealed = await blobs.get(blob_key(deployment))
    if sealed is None:
        return None
    return box.open(sealed.decode(), context=_kept_context(deployment))


def _current(data: bytes) -> StateFile:
    """The environment's newest state, read leniently (it is whatever Terraform wrote)."""
    try:
        document: Any = json.loads(data)
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    serial = document.get("serial")
    return StateFile(
        lineage=str(document.get("lineage") or ""),
        serial=serial if isinstance(serial, int) else 0,
        md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
    )


def _mismatch(found: StateFile, current: StateFile | None) -> str | None:
    """Why ``found`` may not become the environment's state after ``current``; None if it may."""
    if current is None:
        return None
    if found.lineage != current.lineage:
        return (
            f"its lineage '{found.lineage}' is not the lineage '{current.lineage}' of the environment's state"
        )
    if found.serial < current.serial:
        return f"its serial {found.serial} is older than the environment's state serial {current.serial}"
    return None
