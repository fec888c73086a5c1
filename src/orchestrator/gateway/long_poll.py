"""``commands/next`` served in front of FastAPI's routing.

Thousands of agents each hold a long poll open at all times. Served as a FastAPI route, every waiting poll
keeps a dozen coroutine frames (middlewares, routing, dependency solving) and their request objects alive
for its whole wait; this middleware answers it with two frames of its own and no request object, using
the same authentication and the same long poll (``AgentGateway.authenticate`` and ``.next_command``) as
the route, which stays as its documentation (OpenAPI) and fallback.
"""

from __future__ import annotations

import asyncio
import re

import sqlalchemy.exc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.errors import OrchestratorError, PayloadTooLargeError
from orchestrator.gateway.commands import MAX_ANSWER_BYTES, AgentGateway
from orchestrator.web import errors

PATH = re.compile(r"/runner-gateway/v1/orgs/(?P<org>[^/]+)/runners/(?P<runner>[^/]+)/commands/next")


class LongPollMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        gateway: AgentGateway = state.agent_gateway
        org_id, runner_id = match["org"], match["runner"]
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        try:
            await gateway.authenticate(state.services, org_id, runner_id, authorization.decode("latin-1"))
            await _drain(receive)
            response = await gateway.next_command(
                state.services, org_id, runner_id, lambda: _disconnected(receive)
            )
        except OrchestratorError as exc:
            response = errors.error_response(exc)
        except sqlalchemy.exc.TimeoutError as exc:
            response = errors.busy_response(exc)
        await response(scope, receive, send)


async def _drain(receive: Receive) -> None:
    """Read the (ignored) request body, so that a later ``receive`` can only mean a disconnect."""
    received = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        received += len(message.get("body", b""))
        if received > MAX_ANSWER_BYTES:
            raise PayloadTooLargeError(f"the request body exceeds {MAX_ANSWER_BYTES} bytes")
        if not message.get("more_body", False):
            return


async def _disconnected(receive: Receive) -> bool:
    """True if the client is gone (a message is waiting and it is a disconnect); never waits."""
    message: Message
    try:
        async with asyncio.timeout(0):
            message = await receive()
    except TimeoutError:
        return False
    return bool(message["type"] == "http.disconnect")
