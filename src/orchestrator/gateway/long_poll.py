"""The agents' long poll (``commands/next``): wait for the runner's next command, and serve it in front of
FastAPI's routing.

A waiting poll holds no database connection: it waits on its runner's event in ``CommandWaker``, woken by
a commit (here or, on PostgreSQL, on any replica) or by the polling fallback (``LongPoll.wake_ready``).

Thousands of agents each hold a long poll open at all times. Served as a FastAPI route, every waiting poll
keeps a dozen coroutine frames (middlewares, routing, dependency solving) and their request objects alive
for its whole wait; ``LongPollMiddleware`` answers it with two frames of its own and no request object,
using the same authentication and the same long poll (``AgentAuthentication.authenticate`` and
``LongPoll.next_command``) as the route, which stays as its documentation (OpenAPI) and fallback.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy.exc
import structlog
from fastapi import Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import metrics
from orchestrator.errors import OrchestratorError, PayloadTooLargeError
from orchestrator.gateway.agent_authentication import AgentAuthentication
from orchestrator.gateway.claim import MAX_ANSWER_BYTES, Claims
from orchestrator.gateway.command_waker import CommandWaker
from orchestrator.gateway.presence import Presence
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as store
from orchestrator.web.errors import busy_response, error_response
from orchestrator.web.metrics import ROUTE_KEY
from orchestrator.web.services import Services

log = structlog.get_logger(__name__)

#: The route template of the long poll (as the documented route, ``gateway.commands``, names it).
ROUTE = "/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}/commands/next"
PATH = re.compile(r"/runner-gateway/v1/orgs/(?P<org>[^/]+)/runners/(?P<runner>[^/]+)/commands/next")


@dataclass(kw_only=True)
class LongPoll:
    settings: ServerSettings
    waker: CommandWaker
    claims: Claims
    presence: Presence
    #: Set by ``stop``: the server is stopping, long polls answer 204 at once.
    stopping: bool = False

    def stop(self) -> None:
        """The server is stopping: waiting long polls answer 204 now (the agents poll again, elsewhere or
        after the restart), new ones at once; uvicorn's graceful shutdown waits for every open request."""
        self.stopping = True
        self.waker.notify_all()

    async def next_command(
        self, svc: Services, org_id: str, runner_id: str, disconnected: Callable[[], Awaitable[bool]]
    ) -> Response:
        """The long poll of an authenticated agent: its runner's next command with a lease (200), or 204
        when none came within the wait (``PO_AGENT_FETCH_WAIT_SECONDS``, less up to a quarter at random
        so that polls started together do not all come back together) or the server is stopping."""
        self.presence.seen(org_id, runner_id)
        with metrics.AGENT_LONG_POLLS.track_inprogress():
            return await self._next_command(svc, org_id, runner_id, disconnected)

    async def _next_command(
        self, svc: Services, org_id: str, runner_id: str, disconnected: Callable[[], Awaitable[bool]]
    ) -> Response:
        loop = asyncio.get_running_loop()
        wait = self.settings.agent_fetch_wait_seconds
        deadline = loop.time() + wait - random.uniform(0, wait / 4)
        while True:
            wake = self.waker.ticket(org_id, runner_id)
            if self.stopping:
                return Response(status_code=204)
            delivered = await self.claims.claim(svc, org_id, runner_id)
            if delivered is not None:
                metrics.AGENT_COMMANDS_DELIVERED.inc()
                if delivered.attempt > 1:
                    metrics.AGENT_COMMAND_REDELIVERIES.inc()
                log.info(
                    "command delivered",
                    command_id=delivered.command.command_id,
                    attempt=delivered.attempt,
                    runner_id=runner_id,
                    org_id=org_id,
                    deployment_id=delivered.command.deployment_id,
                )
                return JSONResponse(delivered.model_dump(mode="json"))
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Response(status_code=204)
            # No database connection is held while waiting: woken by a commit (here or, on PostgreSQL, on
            # any replica) or by the polling fallback.
            try:
                async with asyncio.timeout(remaining):
                    await wake.wait()
            except TimeoutError:
                return Response(status_code=204)
            if await disconnected():
                # The agent is gone: a command claimed now would wait out its lease before redelivery.
                return Response(status_code=204)

    async def wake_ready(self, svc: Services) -> None:
        """The polling fallback: wake the long polls waiting here whose runner has a deliverable command."""
        waiting = self.waker.waiting()
        if not waiting:
            return
        as_of = self.waker.now()
        async with svc.reader.connect() as conn:
            ready = await store.runners_with_available(conn, now=datetime.now(UTC))
        self.waker.record_ready(ready, as_of=as_of)
        for org_id, runner_id in ready & waiting:
            self.waker.notify(org_id, runner_id)


class LongPollMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope[ROUTE_KEY] = ROUTE
        state = scope["app"].state
        authentication: AgentAuthentication = state.agent_gateway.authentication
        long_poll: LongPoll = state.agent_gateway.long_poll
        org_id, runner_id = match["org"], match["runner"]
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        try:
            await authentication.authenticate(
                state.services, org_id, runner_id, authorization.decode("latin-1")
            )
            await _drain(receive)
            response = await long_poll.next_command(
                state.services, org_id, runner_id, lambda: _disconnected(receive)
            )
        except OrchestratorError as exc:
            response = error_response(exc)
        except sqlalchemy.exc.TimeoutError as exc:
            response = busy_response(exc)
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
