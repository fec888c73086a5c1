"""The deployment side of the runner gateway: bundle download, results, log upload, and the Terraform
state an engine could not save (``errored-state``, see ``dispatch.errored_states``).

Each route is authorized by the deployment's token (``X-Deployment-Token``), through
:func:`authorized_deployment`: the token is checked before any database access, opens only its own
deployment, and only while that deployment executes or finished at most
``PO_DEPLOYMENT_TOKEN_GRACE_SECONDS`` ago (the runner's last log upload, a result retry). Results and logs
are written once: an identical repeat of the results is answered success, anything else 409.

A missing token, or one that is not the deployment's, is answered as upstream's data plane answers it (its
integration tests pin the messages): 400 naming the header, 400 "the runner token is not valid". A valid
token whose deployment ended too long ago (or is gone) is answered 401, saying so.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Path, Request, Response, Security
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator import deployment_tokens, metrics
from orchestrator.dispatch import bundles, errored_states, live_logs
from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import Deployment, Status
from orchestrator.domain.managed import MANAGED_RUNNER_ID
from orchestrator.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    UnauthenticatedError,
)
from orchestrator.protocol import log_stream
from orchestrator.protocol import results as protocol
from orchestrator.store import deployments as store
from orchestrator.store import managed_runners as managed_store
from orchestrator.web import input_checks, openapi
from orchestrator.web.services import Services, services, transaction

#: How long after its deployment ended a token may still hand over the state Terraform could not save.
ERRORED_STATE_GRACE_SECONDS = 24 * 3600.0
#: How long after its deployment ended a token is still told why its chunk is refused (410) rather than 401.
CHUNK_TOKEN_GRACE_SECONDS = 24 * 3600.0
#: The largest chunk number (the column is a 32-bit integer).
MAX_CHUNK_SEQ = 2**31 - 1
#: Binary age files begin with this line: a chunk must be age ciphertext, never anything else.
AGE_HEADER = b"age-encryption.org/v1\n"

router = APIRouter(
    prefix="/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}",
    tags=["Runner gateway"],
    dependencies=[Security(openapi.DEPLOYMENT_TOKEN)],
)


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


async def authorized_deployment(
    svc: Services,
    org_id: str,
    deployment_id: uuid.UUID,
    presented: str | None,
    *,
    now: datetime | None = None,
    grace_seconds: float | None = None,
    conn: AsyncConnection | None = None,
    verified: bool = False,
) -> Deployment:
    """The deployment whose token ``presented`` is, if the token still works: while the deployment
    executes, and ``PO_DEPLOYMENT_TOKEN_GRACE_SECONDS`` after it finished. UnauthenticatedError otherwise.

    Every gateway route a deployment token opens calls this first; it checks nothing else (the route's
    runner or environment, what the deployment's status allows). ``conn``: read on the route's own
    connection or transaction (one checkout and one ``BEGIN`` per request instead of two); ``verified``:
    the caller checked the token already (before any database access, as here).
    """
    if not verified and not deployment_tokens.verify(svc.token_key, org_id, str(deployment_id), presented):
        raise UnauthenticatedError("invalid deployment token")
    if conn is None:
        async with svc.reader.connect() as own:
            deployment = await store.get(own, org_id, deployment_id)
    else:
        deployment = await store.get(conn, org_id, deployment_id)
    if deployment is None:
        raise UnauthenticatedError(
            f"the deployment token is no longer valid: deployment '{deployment_id}' is gone"
        )
    # The request's later lines are about this deployment.
    structlog.contextvars.bind_contextvars(**deployment.log_context())
    if deployment.status == Status.EXECUTING:
        return deployment
    finished = deployment.completed_at or deployment.updated_at
    grace = svc.settings.deployment_token_grace_seconds if grace_seconds is None else grace_seconds
    if (now or datetime.now(UTC)) > finished + timedelta(seconds=grace):
        raise UnauthenticatedError(
            f"the deployment token has expired: deployment '{deployment_id}' {deployment.status} at "
            f"{finished.isoformat(timespec='seconds')}, and its token works {grace:g} s after the "
            "deployment ends (PO_DEPLOYMENT_TOKEN_GRACE_SECONDS)"
        )
    return deployment


async def _authorize(
    svc: Services,
    request: Request,
    org_id: str,
    runner_id: str,
    deployment_id: uuid.UUID,
    *,
    grace_seconds: float | None = None,
    conn: AsyncConnection | None = None,
) -> Deployment:
    _check_token(svc, request, org_id, deployment_id)
    presented = request.headers[protocol.DEPLOYMENT_TOKEN_HEADER]
    deployment = await authorized_deployment(
        svc, org_id, deployment_id, presented, grace_seconds=grace_seconds, conn=conn, verified=True
    )
    if deployment.runner_id != runner_id:
        raise NotFoundError(f"deployment '{deployment_id}' not found")
    if deployment.runner_id == MANAGED_RUNNER_ID and deployment.status == Status.EXECUTING:
        # The managed runner's po-runner has begun: a lease running out now fails the deployment instead
        # of queueing it again (dispatch.managed).
        if conn is not None:
            await managed_store.mark_used(conn, deployment_id, now=datetime.now(UTC))
        else:
            async with transaction(svc) as own:
                await managed_store.mark_used(own, deployment_id, now=datetime.now(UTC))
    return deployment


def _check_token(svc: Services, request: Request, org_id: str, deployment_id: uuid.UUID) -> None:
    """The token header's checks of :func:`_authorize`, no database access: for a route that reads its
    body before it authorizes in its transaction."""
    presented = request.headers.get(protocol.DEPLOYMENT_TOKEN_HEADER)
    if presented is None or not presented.strip():
        raise InvalidInputError(
            f"{protocol.DEPLOYMENT_TOKEN_HEADER}: the header is required and may not be empty: the "
            "deployment's token (the runner's TOKEN)"
        )
    if not deployment_tokens.verify(svc.token_key, org_id, str(deployment_id), presented):
        raise InvalidInputError(protocol.RUNNER_TOKEN_INVALID)


@router.get(
    "/deployments/{deployment_id}/bundle",
    response_class=Response,
    responses={
        200: {
            "description": "The deployment's bundle (tar.gz): the compiled root module and its modules.",
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def get_bundle(
    org_id: str, runner_id: str, deployment_id: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    deployment = await _authorize(svc, request, org_id, runner_id, deployment_id)
    if deployment.status != Status.EXECUTING:
        raise NotFoundError(
            f"deployment '{deployment_id}' is {deployment.status}: its bundle is not available"
        )
    data = await bundles.get(svc.blobs, svc.box, org_id, deployment_id, deployment.bundle_key)
    if data is None:
        raise NotFoundError(f"the bundle of deployment '{deployment_id}' is not available")
    return Response(data, media_type="application/gzip", headers={"Cache-Control": "no-store"})


@router.post(
    "/deployments/{deployment_id}/results",
    status_code=202,
    response_class=Response,  # no body
    openapi_extra=openapi.json_body(protocol.DeploymentResults),
)
async def post_results(
    org_id: str, runner_id: str, deployment_id: uuid.UUID, request: Request, svc: Services = Depends(services)
) -> Response:
    _check_token(svc, request, org_id, deployment_id)  # before the body is read, as ever
    body = await read_limited(request, protocol.MAX_RESULTS_BYTES, "the results body")
    async with transaction(svc) as conn:
        # Authorized in the transaction that records the results: one connection for the request.
        await _authorize(svc, request, org_id, runner_id, deployment_id, conn=conn)
        results = protocol.parse_results(body)
        applied = await results_policy.record_results(
            conn, org_id, runner_id, deployment_id, results, now=datetime.now(UTC)
        )
    if applied:
        svc.notifier.notify(str(deployment_id))
        # Its followers here learn of the end now, not at the next poll.
        svc.log_followers.refresh(deployment_id)
        # A run ended: a deployment queued for its host's run slot may start now.
        svc.wake_dispatcher()
    return Response(status_code=202)


@router.put(
    "/environments/{env_uuid}/deployments/{deployment_id}/logs",
    status_code=202,
    response_class=Response,  # no body
    openapi_extra=openapi.raw_body(
        "text/plain", {"type": "string"}, "The age ciphertext of the logs, in standard base64."
    ),
)
async def put_logs(
    org_id: str,
    runner_id: str,
    env_uuid: uuid.UUID,
    deployment_id: uuid.UUID,
    request: Request,
    svc: Services = Depends(services),
) -> Response:
    deployment = await _authorize(svc, request, org_id, runner_id, deployment_id)
    if deployment.env_uuid != env_uuid:
        raise NotFoundError(f"deployment '{deployment_id}' not found in environment '{env_uuid}'")
    body = await read_limited(request, protocol.MAX_LOG_BYTES, "the log upload")
    if deployment.logs_key is not None:
        raise ConflictError(_logs_stored(deployment_id))
    # Each upload under its own key: of two racing uploads one is recorded, and the other's object is
    # deleted again; stored logs are never overwritten.
    key = f"logs/{org_id}/{env_uuid}/{deployment_id}.{secrets.token_hex(8)}"
    await svc.blobs.put(key, body)
    async with transaction(svc) as conn:
        recorded = await store.record_logs(
            conn, deployment_id, key=key, size=len(body), now=datetime.now(UTC)
        )
    if not recorded:
        await svc.blobs.delete(key)
        raise ConflictError(_logs_stored(deployment_id))
    # A follower of a deployment that streamed nothing hands the whole log over; a final one's follow ends.
    svc.log_followers.refresh(deployment_id)
    return Response(status_code=202)


@router.put(
    "/environments/{env_uuid}/deployments/{deployment_id}/log-chunks/{seq}",
    status_code=202,
    response_class=Response,  # no body
    openapi_extra={
        **openapi.raw_body(
            "text/plain",
            {"type": "string"},
            "One chunk of the live log: the age ciphertext of a chunk "
            "(`protocol.log_stream.ChunkPlaintext`), in standard base64.",
        ),
        "parameters": [
            {
                "name": log_stream.PHASE_HEADER,
                "in": "header",
                "required": True,
                "description": "The chunk's phase, in clear (it is recorded in the deployment's phases).",
                "schema": {
                    "type": "string",
                    "enum": sorted(phase.value for phase in log_stream.RUNNER_PHASES),
                },
            }
        ],
    },
    responses={
        202: {"description": "Stored; or this chunk was stored with the same bytes before (a retry)."},
        409: {"description": "A chunk of this number is stored with other bytes."},
        410: {"description": "The deployment ended more than 300 s ago: it takes no chunks any more."},
    },
)
async def put_log_chunk(
    org_id: str,
    runner_id: str,
    env_uuid: uuid.UUID,
    deployment_id: uuid.UUID,
    seq: Annotated[int, Path(ge=1, le=MAX_CHUNK_SEQ, description="The chunk's number: 1, 2, ...")],
    request: Request,
    svc: Services = Depends(services),
) -> Response:
    """A chunk of the deployment's live log, sent while it runs (issue 22; ``protocol.log_stream``)."""
    deployment = await _authorize(
        svc, request, org_id, runner_id, deployment_id, grace_seconds=CHUNK_TOKEN_GRACE_SECONDS
    )
    if deployment.env_uuid != env_uuid:
        raise NotFoundError(f"deployment '{deployment_id}' not found in environment '{env_uuid}'")
    phase = _chunk_phase(request.headers.get(log_stream.PHASE_HEADER))
    live_logs.ensure_open(deployment, now=datetime.now(UTC))
    body = await read_limited(request, log_stream.MAX_CHUNK_UPLOAD_BYTES, "the log chunk")
    ciphertext = _chunk_ciphertext(body)
    # Answered once committed (with the chunks uploaded beside it: ``dispatch.log_writer``); followers in
    # this process are woken by the writer, those of other replicas at their hub's next poll.
    stored = await svc.log_writer.store(
        live_logs.ChunkUpload(
            deployment=deployment, seq=seq, phase=phase, ciphertext=ciphertext, received_at=datetime.now(UTC)
        )
    )
    if stored:
        metrics.LOG_CHUNKS_RECEIVED.inc()
        metrics.LOG_CHUNK_BYTES_RECEIVED.inc(len(ciphertext))
    return Response(status_code=202)


def _chunk_phase(value: str | None) -> log_stream.Phase:
    names = ", ".join(sorted(phase.value for phase in log_stream.RUNNER_PHASES))
    if value is None or not value.strip():
        raise InvalidInputError(
            f"{log_stream.PHASE_HEADER}: the header is required: the chunk's phase ({names})"
        )
    try:
        phase = log_stream.Phase(value.strip())
    except ValueError:
        phase = None
    if phase not in log_stream.RUNNER_PHASES:
        raise InvalidInputError(
            f"{log_stream.PHASE_HEADER}: {value.strip()[:40]!r} is not a phase a runner sends: one of {names}"
        )
    assert phase is not None
    return phase


def _chunk_ciphertext(body: bytes) -> bytes:
    """The chunk's age ciphertext from its base64 body; 400 for anything else (a chunk is only ever
    stored as ciphertext)."""
    try:
        data = base64.b64decode(body.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError("body: the log chunk is not standard base64") from exc
    if not data.startswith(AGE_HEADER):
        raise InvalidInputError(
            "body: the log chunk is not age ciphertext (encrypt it to the deployment's logs recipient)"
        )
    return data


def _logs_stored(deployment_id: uuid.UUID) -> str:
    return f"deployment '{deployment_id}' already has its logs; logs are written once"


@router.post(
    "/environments/{env_uuid}/deployments/{deployment_id}/errored-state",
    response_model=protocol.ErroredStateReceipt,
    openapi_extra=openapi.raw_body(
        "application/json", {"type": "object"}, "The state Terraform could not save, as it wrote it."
    ),
)
@input_checks.opaque_body  # kept as it is: a state holding any text must never be refused
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
    # The runner's recovery may outlast the token's grace (it retries for RUNNER_STATE_RECOVERY_SECONDS):
    # a state is never refused for that. After the end it is only kept, never made the environment's.
    deployment = await _authorize(
        svc, request, org_id, runner_id, deployment_id, grace_seconds=ERRORED_STATE_GRACE_SECONDS
    )
    body = await read_limited(request, protocol.MAX_STATE_BYTES, "the errored state")
    if deployment.env_uuid != env_uuid:
        raise NotFoundError(f"deployment '{deployment_id}' not found in environment '{env_uuid}'")
    receipt = await errored_states.recover(
        svc.engine,
        box=svc.box,
        blobs=svc.blobs,
        deployment=deployment,
        data=body,
        now=datetime.now(UTC),
        keep=svc.settings.state_versions_kept,
    )
    return JSONResponse(receipt.model_dump(mode="json", exclude_none=True))
