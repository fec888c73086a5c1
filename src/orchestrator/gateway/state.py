"""Terraform's ``http`` state backend, served per environment (state storage type ``orchestrator``).

Authorized with HTTP basic auth: user = deployment id, password = that deployment's token; the deployment
must be executing in this environment. State is sealed with the server key and every version is kept (the
newest PO_STATE_VERSIONS_KEPT; ``dispatch.state_versions``).
A lock held by one client refuses every other (423 with the holder's lock info, as Terraform expects).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response, Security
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator import deployment_tokens
from orchestrator.dispatch import state_versions
from orchestrator.domain.deployments import Deployment, Status
from orchestrator.errors import ConflictError, InvalidInputError, UnauthenticatedError
from orchestrator.gateway.deployments import authorized_deployment, read_limited
from orchestrator.protocol import results as protocol
from orchestrator.store import states as store
from orchestrator.web import input_checks, openapi
from orchestrator.web.services import Services, services, transaction

router = APIRouter(
    prefix="/runner-gateway/v1/orgs/{org_id}/environments/{env_uuid}",
    tags=["State backend"],
    dependencies=[Security(openapi.STATE_CREDENTIALS)],
)

MAX_STATE_BYTES = protocol.MAX_STATE_BYTES
MAX_LOCK_BYTES = 64 * 1024


def _context(env_uuid: uuid.UUID) -> str:
    return state_versions.state_context(env_uuid)


def _credentials(svc: Services, request: Request, org_id: str) -> tuple[uuid.UUID, str]:
    """The deployment id and token of the basic auth, the token checked (no database access)."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    try:
        user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        deployment_id = uuid.UUID(user)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise UnauthenticatedError("state backend requires basic auth: deployment id and token") from exc
    if scheme.lower() != "basic":
        raise UnauthenticatedError("state backend requires basic auth: deployment id and token")
    if not deployment_tokens.verify(svc.token_key, org_id, str(deployment_id), password):
        raise UnauthenticatedError("invalid deployment token")
    return deployment_id, password


async def _authorize(
    svc: Services, request: Request, org_id: str, env_uuid: uuid.UUID, conn: AsyncConnection
) -> Deployment:
    """The deployment the caller acts for, read on the route's own connection or transaction (Terraform
    sends several requests a deployment: one connection each, not two)."""
    deployment_id, password = _credentials(svc, request, org_id)
    deployment = await authorized_deployment(svc, org_id, deployment_id, password, conn=conn, verified=True)
    # Stricter than the token: only an executing deployment reads or writes the state.
    if deployment.env_uuid != env_uuid or deployment.status != Status.EXECUTING:
        raise UnauthenticatedError("the deployment may not use this environment's state")
    return deployment


@router.get(
    "/state",
    responses={
        200: {
            "description": "The environment's latest state.",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        204: {"description": "No state stored yet."},
    },
)
async def get_state(
    org_id: str, env_uuid: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    async with svc.reader.connect() as conn:
        await _authorize(svc, request, org_id, env_uuid, conn)
        found = await store.latest(conn, env_uuid)
    if found is None:
        return Response(status_code=204)
    data = svc.box.open(found[1], context=_context(env_uuid))
    return Response(data, media_type="application/json", headers={"Cache-Control": "no-store"})


@router.post(
    "/state",
    response_class=Response,  # no body
    openapi_extra=openapi.raw_body("application/json", {"type": "object"}, "A Terraform state document."),
)
@input_checks.opaque_body  # sealed as it is: a state holding any text must never be refused
async def put_state(
    org_id: str, env_uuid: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _credentials(svc, request, org_id)  # before the body is read
    body = await read_limited(request, MAX_STATE_BYTES, "the state")
    try:
        json.loads(body)
    except ValueError as exc:
        raise InvalidInputError("the state is not JSON") from exc
    lock_id = request.query_params.get("ID")
    async with transaction(svc) as conn:
        deployment = await _authorize(svc, request, org_id, env_uuid, conn)
        held = await store.get_lock(conn, env_uuid)
        if held is not None and held["lock_id"] != lock_id:
            raise ConflictError(f"the state is locked by lock '{held['lock_id']}'")
        await state_versions.write(
            conn,
            svc.box,
            org_id=org_id,
            env_uuid=env_uuid,
            data=body,
            keep=svc.settings.state_versions_kept,
            now=datetime.now(UTC),
            deployment_id=deployment.id,
            created_by=deployment.created_by,
        )
    return Response(status_code=200)


async def _lock_body(request: Request) -> dict[str, Any]:
    body = await read_limited(request, MAX_LOCK_BYTES, "the lock info")
    try:
        info = json.loads(body or b"{}")
    except ValueError as exc:
        raise InvalidInputError("the lock info is not JSON") from exc
    if not isinstance(info, dict):
        raise InvalidInputError("the lock info must be a JSON object")
    return info


@router.api_route("/state/lock", methods=["LOCK"], summary="Take the state lock")
@openapi.may_answer(413, 423)
async def lock_state(
    org_id: str, env_uuid: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _credentials(svc, request, org_id)  # before the body is read
    info = await _lock_body(request)
    lock_id = str(info.get("ID") or "")
    if not lock_id:
        raise InvalidInputError("ID: the lock info names no lock id")
    async with transaction(svc) as conn:
        deployment_id = (await _authorize(svc, request, org_id, env_uuid, conn)).id
        holder = await store.try_lock(
            conn,
            org_id=org_id,
            env_uuid=env_uuid,
            lock_id=lock_id,
            info=info,
            deployment_id=deployment_id,
            now=datetime.now(UTC),
        )
    if holder is not None and not _same_lock(holder, lock_id, deployment_id):
        return JSONResponse(holder["info"], status_code=423)
    return Response(status_code=200)


def _same_lock(holder: dict[str, Any], lock_id: str, deployment_id: uuid.UUID) -> bool:
    """The lock is held already under this very id by this deployment: a retried LOCK whose first answer
    was lost (the server went down after its commit). Refusing it would fail Terraform on its own lock."""
    return bool(holder["lock_id"] == lock_id and holder["deployment_id"] == deployment_id)


@router.api_route("/state/lock", methods=["UNLOCK"], summary="Release the state lock")
@openapi.may_answer(409, 413)
async def unlock_state(
    org_id: str, env_uuid: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _credentials(svc, request, org_id)  # before the body is read
    info = await _lock_body(request)
    async with transaction(svc) as conn:
        await _authorize(svc, request, org_id, env_uuid, conn)
        held = await store.get_lock(conn, env_uuid)
        if held is not None:
            if info.get("ID") and info["ID"] != held["lock_id"]:
                return JSONResponse(held["info"], status_code=409)
            await store.unlock(conn, env_uuid)
    return Response(status_code=200)
