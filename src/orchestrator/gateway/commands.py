"""The agent side of the runner gateway: the command long poll, ack/retry/reject, and events.

Routes under ``/runner-gateway/v1/orgs/{org}/runners/{runner}``, each authenticated by the agent's JWT
(``gateway.agent_authentication``); any authentication failure is the same 401. The long poll is served by
``gateway.long_poll``; the state the routes share is ``gateway.agent_gateway.AgentGateway``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypeVar

import structlog
from fastapi import APIRouter, Depends, Request, Response, Security
from pydantic import BaseModel, ValidationError

from orchestrator.dispatch import agent_commands as policy
from orchestrator.errors import InvalidInputError
from orchestrator.gateway import receipts
from orchestrator.gateway.agent_gateway import agent_gateway
from orchestrator.gateway.claim import MAX_ANSWER_BYTES
from orchestrator.gateway.deployments import read_limited
from orchestrator.protocol import commands as protocol
from orchestrator.protocol import problems
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}", tags=["Runner gateway"])

_Model = TypeVar("_Model", bound=BaseModel)
_Answer = TypeVar("_Answer", protocol.AckRequest, protocol.RetryRequest, protocol.RejectRequest)


async def authenticated_agent(
    org_id: str,
    runner_id: str,
    request: Request,
    svc: Services = Depends(services),
    _documented: None = Security(openapi.AGENT_TOKEN),
) -> None:
    """Admit the request if it carries a valid agent token of ``org_id/runner_id``; a generic 401 else."""
    await agent_gateway(request).authentication.authenticate(
        svc, org_id, runner_id, request.headers.get("authorization")
    )


AGENT = Depends(authenticated_agent)


def _parse(model: type[_Model], body: bytes, what: str) -> _Model:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        found = problems.of(exc)
        named = "; ".join(f"{p['field'] or 'body'}: {p['problem']}" for p in found[:5])
        raise InvalidInputError(f"invalid {what}: {named}", details={"errors": found}) from exc


@router.post(
    "/commands/next",
    dependencies=[AGENT],
    response_model=protocol.NextCommand,
    responses={204: {"description": "No command came within the wait: call again."}},
)
@openapi.never_answers(404, 409)
async def next_command(
    org_id: str, runner_id: str, request: Request, svc: Services = Depends(services)
) -> Response:
    """Long poll: the runner's next command with a lease (200), or 204 when none came in time.

    Served by ``gateway.long_poll.LongPollMiddleware`` in front of the routes (this route documents it and
    serves it should the middleware be absent)."""
    return await agent_gateway(request).long_poll.next_command(
        svc, org_id, runner_id, request.is_disconnected
    )


async def _answer(
    request: Request, model: type[_Answer], what: str, org_id: str, runner_id: str, command_id: str
) -> tuple[_Answer, receipts.Receipt]:
    """An agent's answer to a command (``what``: ack, retry or reject), and the receipt it carries, opened."""
    body = _parse(model, await read_limited(request, MAX_ANSWER_BYTES, f"the {what}"), what)
    receipt = receipts.open_receipt(
        agent_gateway(request).receipt_key,
        body.receipt,
        org_id=org_id,
        runner_id=runner_id,
        command_id=command_id,
    )
    return body, receipt


@router.post(
    "/commands/{command_id}/ack",
    dependencies=[AGENT],
    status_code=204,
    openapi_extra=openapi.json_body(protocol.AckRequest),
)
async def ack_command(
    org_id: str, runner_id: str, command_id: str, request: Request, svc: Services = Depends(services)
) -> Response:
    """The command is done (the job exists): it is never delivered again."""
    _, receipt = await _answer(request, protocol.AckRequest, "ack", org_id, runner_id, command_id)
    async with transaction(svc) as conn:
        command = await policy.leased_command(conn, org_id, runner_id, command_id, attempt=receipt.attempt)
        await policy.ack(conn, command, now=datetime.now(UTC))
    agent_gateway(request).waker.notify(org_id, runner_id)
    return Response(status_code=204)


@router.post(
    "/commands/{command_id}/retry",
    dependencies=[AGENT],
    status_code=204,
    openapi_extra=openapi.json_body(protocol.RetryRequest),
)
async def retry_command(
    org_id: str, runner_id: str, command_id: str, request: Request, svc: Services = Depends(services)
) -> Response:
    """Deliver the command again after ``delay_seconds`` (0..60)."""
    body, receipt = await _answer(request, protocol.RetryRequest, "retry", org_id, runner_id, command_id)
    async with transaction(svc) as conn:
        command = await policy.leased_command(conn, org_id, runner_id, command_id, attempt=receipt.attempt)
        await policy.retry(conn, command, delay=timedelta(seconds=body.delay_seconds), now=datetime.now(UTC))
    if body.delay_seconds == 0:
        agent_gateway(request).waker.notify(org_id, runner_id)
    return Response(status_code=204)


@router.post(
    "/commands/{command_id}/reject",
    dependencies=[AGENT],
    status_code=204,
    openapi_extra=openapi.json_body(protocol.RejectRequest),
)
async def reject_command(
    org_id: str, runner_id: str, command_id: str, request: Request, svc: Services = Depends(services)
) -> Response:
    """Dead-letter the command: its deployment fails with ``reason``."""
    body, receipt = await _answer(request, protocol.RejectRequest, "reject", org_id, runner_id, command_id)
    async with transaction(svc) as conn:
        command = await policy.leased_command(conn, org_id, runner_id, command_id, attempt=receipt.attempt)
        failed = await policy.reject(conn, command, reason=body.reason, now=datetime.now(UTC))
    gateway = agent_gateway(request)
    gateway.finished([failed] if failed else [])
    gateway.waker.notify(org_id, runner_id)
    log.info("command rejected", command_id=command_id, reason=body.reason)
    return Response(status_code=204)


@router.post(
    "/events",
    dependencies=[AGENT],
    status_code=202,
    response_class=Response,  # no body
    openapi_extra=openapi.json_body(protocol.EventEnvelope),
)
async def post_event(
    org_id: str, runner_id: str, request: Request, svc: Services = Depends(services)
) -> Response:
    """An agent's event, applied exactly once per ``event_id`` (a repeat is answered 202, changes nothing)."""
    event = _parse(
        protocol.EventEnvelope, await read_limited(request, protocol.MAX_EVENT_BYTES, "the event"), "event"
    )
    if event.organization_id != org_id or event.runner_id != runner_id:
        raise InvalidInputError("the event's organization_id and runner_id must match the path")
    payload = policy.check_event(event)
    async with transaction(svc) as conn:
        finished = await policy.apply_event(conn, event, payload, now=datetime.now(UTC))
    agent_gateway(request).finished([finished] if finished else [])
    return Response(status_code=202)
