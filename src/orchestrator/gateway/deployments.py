"""The deployment side of the runner gateway: bundle download, results, log upload, and the Terraform
state an engine could not save (``errored-state``, see ``dispatch.errored_states``).

Each route is authorized by the deployment's token (``X-Deployment-Token``), checked before any database
access; a token opens only its own deployment.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from orchestrator.api.context import Services, services, transaction
from orchestrator.dispatch import errored_states
from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import Deployment, Status
from orchestrator.errors import NotFoundError, PayloadTooLargeError, UnauthenticatedError
from orchestrator.gateway import tokens
from orchestrator.protocol import results as protocol
from orchestrator.store import deployments as store

router = APIRouter(prefix="/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}", tags=["Runner gateway"])


async def read_limited(request: Request, limit: int, what: str) -> bytes:
    """The body, refused with 413 as soon as it grows past ``limit`` bytes."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"{what} is {length} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"{what} is larger than the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _authorize(svc: Services, request: Request, org_id: str, deployment_id: uuid.UUID) -> None:
    presented = request.headers.get(protocol.DEPLOYMENT_TOKEN_HEADER)
    if not tokens.verify(svc.token_key, org_id, str(deployment_id), presented):
        raise UnauthenticatedError("invalid deployment token")


async def _load(svc: Services, org_id: str, runner_id: str, deployment_id: uuid.UUID) -> Deployment:
    async with svc.reader.connect() as conn:
        deployment = await store.get(conn, org_id, deployment_id)
    if deployment is None or deployment.runner_id != runner_id:
        raise NotFoundError(f"deployment '{deployment_id}' not found")
    return deployment


@router.get("/deployments/{deployment_id}/bundle")
async def get_bundle(
    org_id: str, runner_id: str, deployment_id: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _authorize(svc, request, org_id, deployment_id)
    deployment = await _load(svc, org_id, runner_id, deployment_id)
    if deployment.status != Status.EXECUTING:
        raise NotFoundError(
            f"deployment '{deployment_id}' is {deployment.status}: its bundle is not available"
        )
    data = await svc.blobs.get(deployment.bundle_key)
    if data is None:
        raise NotFoundError(f"the bundle of deployment '{deployment_id}' is not available")
    return Response(data, media_type="application/gzip", headers={"Cache-Control": "no-store"})


@router.post("/deployments/{deployment_id}/results", status_code=202)
async def post_results(
    org_id: str, runner_id: str, deployment_id: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _authorize(svc, request, org_id, deployment_id)
    body = await read_limited(request, protocol.MAX_RESULTS_BYTES, "the results body")
    results = protocol.parse_results(body)
    async with transaction(svc) as conn:
        deployment = await store.get(conn, org_id, deployment_id, for_update=True)
        if deployment is None or deployment.runner_id != runner_id:
            raise NotFoundError(f"deployment '{deployment_id}' not found")
        # A repeated result (a retry whose answer was lost) changes nothing and is answered success.
        await results_policy.apply_results(conn, deployment, results, now=datetime.now(UTC))
    svc.notifier.notify(str(deployment_id))
    return Response(status_code=202)


@router.put("/environments/{env_uuid}/deployments/{deployment_id}/logs", status_code=202)
async def put_logs(
    org_id: str,
    runner_id: str,
    env_uuid: uuid.UUID,
    deployment_id: uuid.UUID,
    request: Request,
    svc: Services = Depends(services),
) -> Response:
    _authorize(svc, request, org_id, deployment_id)
    body = await read_limited(request, protocol.MAX_LOG_BYTES, "the log upload")
    deployment = await _load(svc, org_id, runner_id, deployment_id)
    if deployment.env_uuid != env_uuid:
        raise NotFoundError(f"deployment '{deployment_id}' not found in environment '{env_uuid}'")
    key = f"logs/{org_id}/{env_uuid}/{deployment_id}"
    await svc.blobs.put(key, body)
    async with transaction(svc) as conn:
        await store.record_logs(conn, deployment_id, key=key, size=len(body), now=datetime.now(UTC))
    return Response(status_code=202)


@router.post(
    "/environments/{env_uuid}/deployments/{deployment_id}/errored-state",
    response_model=protocol.ErroredStateReceipt,
)
async def post_errored_state(
    org_id: str,
    runner_id: str,
    env_uuid: uuid.UUID,
    deployment_id: uuid.UUID,
    request: Request,
    svc: Services = Depends(services),
) -> Response:
    """The state Terraform could not save (``errored.tfstate``), as it is: it becomes the environment's
    state, or is kept sealed with the deployment; the answer says which. Once the deployment has ended
    (timed out while its runner still tried) it is only kept: another deployment may hold the state."""
    _authorize(svc, request, org_id, deployment_id)
    body = await read_limited(request, protocol.MAX_STATE_BYTES, "the errored state")
    deployment = await _load(svc, org_id, runner_id, deployment_id)
    if deployment.env_uuid != env_uuid:
        raise NotFoundError(f"deployment '{deployment_id}' not found in environment '{env_uuid}'")
    receipt = await errored_states.recover(
        svc.engine, box=svc.box, blobs=svc.blobs, deployment=deployment, data=body, now=datetime.now(UTC)
    )
    return JSONResponse(receipt.model_dump(mode="json", exclude_none=True))
