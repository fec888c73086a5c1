"""The agent side of the runner gateway: the command long poll, ack/retry/reject, and events.

Routes under ``/runner-gateway/v1/orgs/{org}/runners/{runner}``, each authenticated by the agent's JWT
(``protocol.agent_auth``) verified against the runner's registered Ed25519 key: ``runner_configuration.key``
of a ``kubernetes-agent`` runner, ``runner_configuration.connection.key`` of a ``vm`` runner with an agent
connection; each token is accepted once (``gateway.token_uses``). Any authentication failure is the
same 401.

A waiting long poll holds no database connection: it waits on an in-process event of its runner
(``CommandWaker``). It is woken by ``CommandWaker.notify(org, runner)``, called

- on this process after a change to the runner's queue commits here (the dispatcher enqueueing a command,
  an ack, a retry without delay, a reject);
- on PostgreSQL, for changes committed by any replica: they are announced with NOTIFY in their transaction
  (``store.agent_commands.announce``) and heard by each replica's LISTEN connection (``store.listener``);
- by the polling fallback (``AgentGateway.run``), which looks every ``PO_AGENT_POLL_FALLBACK_SECONDS``
  for runners waiting here that have a deliverable command: retry delays and leases running out, and
  anything a lost notification missed.

Agent presence (``last_seen_at``) is kept in memory per poll and written in one batch every
``PO_AGENT_PRESENCE_INTERVAL_SECONDS``, so a long poll costs no database write.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Depends, Request, Response, Security
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from orchestrator import deployment_tokens
from orchestrator.dispatch import agent_commands as policy
from orchestrator.domain.deployments import Deployment
from orchestrator.domain.key_material import load_agent_public_key
from orchestrator.domain.runner_types import agent_public_key
from orchestrator.errors import InvalidInputError, UnauthenticatedError
from orchestrator.gateway import receipts
from orchestrator.gateway.deployments import read_limited
from orchestrator.gateway.token_uses import TokenUses
from orchestrator.notify import sleep_unless_stopped
from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as store
from orchestrator.store import runners as runner_store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}", tags=["Runner gateway"])

#: The one answer to every authentication failure: nothing that tells an attacker what was wrong.
UNAUTHENTICATED = "invalid agent credentials"
#: Largest ack/retry/reject body.
MAX_ANSWER_BYTES = 16 * 1024

_Model = TypeVar("_Model", bound=BaseModel)


_Runner = tuple[str, str]


class CommandWaker:
    """Wakes long polls waiting for a runner's next command (in-process, one event per waiting runner),
    and knows which runners surely have nothing to deliver, so that most polls touch no database.

    "Surely nothing": the runner was not in the last snapshot of runners with a deliverable command
    (``record_ready``, taken by the polling fallback) and no ``notify`` for it came since that snapshot's
    query began. A command that becomes deliverable without a notification (a lease or retry delay running
    out) shows in the next snapshot, which wakes the poll.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._events: dict[_Runner, asyncio.Event] = {}
        self._changed: dict[_Runner, float] = {}
        self._all_changed_at = float("-inf")
        self._ready: frozenset[_Runner] | None = None
        self._ready_at = float("-inf")

    def ticket(self, org_id: str, runner_id: str) -> asyncio.Event:
        """Take this before looking for a command: a ``notify`` from then on sets it."""
        key = (org_id, runner_id)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        return event

    def notify(self, org_id: str, runner_id: str) -> None:
        """The runner's queue changed: wake its waiting polls."""
        key = (org_id, runner_id)
        self._changed[key] = self._clock()
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        """Anything may have changed: wake every waiting long poll (each looks at its queue again)."""
        self._all_changed_at = self._clock()
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def waiting(self) -> set[_Runner]:
        return set(self._events)

    def now(self) -> float:
        return self._clock()

    def record_ready(self, ready: set[_Runner], *, as_of: float) -> None:
        """The runners with a deliverable command, as read by a query that began at ``as_of``."""
        if as_of < self._ready_at:
            return
        self._ready, self._ready_at = frozenset(ready), as_of
        self._changed = {key: at for key, at in self._changed.items() if at >= as_of}

    def may_have_command(self, org_id: str, runner_id: str, *, max_age: float) -> bool:
        """False only if the runner surely has nothing deliverable (per a snapshot at most ``max_age``
        seconds old and the notifications since)."""
        if self._ready is None or self._clock() - self._ready_at > max_age:
            return True
        key = (org_id, runner_id)
        return (
            key in self._ready
            or self._changed.get(key, float("-inf")) >= self._ready_at
            or self._all_changed_at >= self._ready_at
        )


@dataclass(kw_only=True)
class AgentGateway:
    """Process-wide state of the command protocol (``app.state.agent_gateway``)."""

    settings: ServerSettings
    receipt_key: bytes
    waker: CommandWaker = field(default_factory=CommandWaker)
    #: Called with a deployment id when a deployment became final here (wakes wait-for-complete).
    on_final: Callable[[str], None] = lambda _deployment_id: None
    #: Set once this replica hears other replicas' announcements (PostgreSQL only).
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    #: The agent tokens accepted so far, by this replica and (a second later) by the others.
    token_uses: TokenUses = field(default_factory=TokenUses)
    #: Set by ``stop_polls``: the server is stopping, long polls answer 204 at once.
    stopping: bool = False
    _keys: dict[tuple[str, str], tuple[float, Ed25519PublicKey]] = field(default_factory=dict)
    _seen: dict[tuple[str, str], datetime] = field(default_factory=dict)

    def stop_polls(self) -> None:
        """The server is stopping: waiting long polls answer 204 now (the agents poll again, elsewhere or
        after the restart), new ones at once; uvicorn's graceful shutdown waits for every open request."""
        self.stopping = True
        self.waker.notify_all()

    async def public_key(self, svc: Services, org_id: str, runner_id: str) -> Ed25519PublicKey | None:
        """The runner's registered agent key, if it is an agent runner."""
        key = (org_id, runner_id)
        cached = self._keys.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.settings.agent_public_key_cache_seconds:
            return cached[1]
        async with svc.reader.connect() as conn:
            runner = await runner_store.get_runner(conn, org_id, runner_id)
        pem = agent_public_key(runner.type, runner.configuration) if runner is not None else None
        if pem is None:
            self._keys.pop(key, None)
            return None
        try:
            public = load_agent_public_key(pem)
        except ValueError:
            return None
        self._keys[key] = (time.monotonic(), public)
        return public

    def seen(self, org_id: str, runner_id: str) -> None:
        """Note the agent's poll (written by ``flush_presence``)."""
        self._seen[(org_id, runner_id)] = datetime.now(UTC)

    async def flush_presence(self, svc: Services) -> None:
        """Write the polls noted since the last flush (one transaction)."""
        if not self._seen:
            return
        seen, self._seen = self._seen, {}
        try:
            async with transaction(svc) as conn:
                await store.touch_presences(conn, seen)
        except Exception:
            # Keep what was not written (unless newer polls came in meanwhile) for the next flush.
            self._seen = {**seen, **self._seen}
            raise

    async def authenticate(
        self, svc: Services, org_id: str, runner_id: str, authorization: str | None
    ) -> None:
        """Admit a request whose ``Authorization`` carries a valid agent token of ``org_id/runner_id``;
        the same UnauthenticatedError for every failure."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(UNAUTHENTICATED)
        key = await self.public_key(svc, org_id, runner_id)
        if key is None:
            log.info("agent authentication failed", org_id=org_id, runner_id=runner_id, reason="no agent key")
            raise UnauthenticatedError(UNAUTHENTICATED)
        try:
            claims = agent_auth.verify(token.strip(), key, org_id=org_id, runner_id=runner_id)
        except agent_auth.AgentTokenError as exc:
            log.info("agent authentication failed", org_id=org_id, runner_id=runner_id, reason=exc.message)
            raise UnauthenticatedError(UNAUTHENTICATED) from None
        if not self.first_use(token.strip(), claims):
            log.warning(
                "agent authentication failed", org_id=org_id, runner_id=runner_id, reason="replayed token"
            )
            raise UnauthenticatedError(UNAUTHENTICATED)

    def first_use(self, token: str, claims: dict[str, Any]) -> bool:
        """Note a verified token's use; False for a replay (``gateway.token_uses``)."""
        digest, has_jti = agent_auth.use_key(token, claims)
        expires_at = datetime.fromtimestamp(int(claims["exp"]) + agent_auth.CLOCK_SKEW_SECONDS, UTC)
        return self.token_uses.accept(digest, has_jti=has_jti, expires_at=expires_at)

    async def next_command(
        self, svc: Services, org_id: str, runner_id: str, disconnected: Callable[[], Awaitable[bool]]
    ) -> Response:
        """The long poll of an authenticated agent: its runner's next command with a lease (200), or 204
        when none came within the wait (``PO_AGENT_FETCH_WAIT_SECONDS``, less up to a quarter at random
        so that polls started together do not all come back together) or the server is stopping."""
        self.seen(org_id, runner_id)
        loop = asyncio.get_running_loop()
        wait = self.settings.agent_fetch_wait_seconds
        deadline = loop.time() + wait - random.uniform(0, wait / 4)
        while True:
            wake = self.waker.ticket(org_id, runner_id)
            if self.stopping:
                return Response(status_code=204)
            delivered = await self.claim(svc, org_id, runner_id)
            if delivered is not None:
                log.info(
                    "command delivered",
                    command_id=delivered.command.command_id,
                    attempt=delivered.attempt,
                    runner_id=runner_id,
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

    def finished(self, deployments: list[Deployment]) -> None:
        for deployment in deployments:
            self.on_final(str(deployment.id))

    async def deliverable(self, svc: Services, org_id: str, runner_id: str) -> bool:
        """A cheap read: might a claim hand out (or expire) something now?"""
        now = datetime.now(UTC)
        async with svc.reader.connect() as conn:
            head = await store.head(conn, org_id, runner_id)
        return head is not None and (head.available(now) or head.expires_at <= now)

    async def claim(self, svc: Services, org_id: str, runner_id: str) -> protocol.NextCommand | None:
        max_age = 3 * self.settings.agent_poll_fallback_seconds
        if not self.waker.may_have_command(org_id, runner_id, max_age=max_age):
            return None
        if not await self.deliverable(svc, org_id, runner_id):
            return None
        now = datetime.now(UTC)
        async with transaction(svc) as conn:
            outcome = await policy.claim_next(
                conn, org_id, runner_id, now=now, lease=timedelta(seconds=self.settings.agent_lease_seconds)
            )
        self.finished(outcome.failed)
        if outcome.claimed is None:
            return None
        return self._delivery(svc, outcome.claimed)

    def _delivery(self, svc: Services, claimed: policy.Claimed) -> protocol.NextCommand:
        command = claimed.command
        envelope: dict[str, Any] = dict(command.envelope)
        # The deployment token travels only in the delivery (``spec.token``, and ``TOKEN`` in the JobSpec
        # of a kubernetes-agent command): derived from the server key, stored nowhere.
        token = deployment_tokens.deployment_token(svc.token_key, command.org_id, str(command.deployment_id))
        envelope["payload"] = protocol.with_deployment_token(envelope["payload"], token)
        receipt = receipts.seal(
            self.receipt_key,
            receipts.Receipt(
                org_id=command.org_id,
                runner_id=command.runner_id,
                command_id=command.id,
                attempt=claimed.attempt,
                expires_at=claimed.lease_expires_at,
            ),
        )
        return protocol.NextCommand(
            command=protocol.CommandEnvelope.model_validate(envelope),
            receipt=receipt,
            attempt=claimed.attempt,
            lease_expires_at=claimed.lease_expires_at,
        )

    async def run(self, svc: Services, stop: asyncio.Event) -> None:
        """Background work: the polling fallback and the exchange of agent token uses with the other
        replicas every ``PO_AGENT_POLL_FALLBACK_SECONDS``, the presence flush every
        ``PO_AGENT_PRESENCE_INTERVAL_SECONDS`` (both once more when stopping)."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self.settings.agent_presence_interval_seconds
        while not stop.is_set():
            try:
                await self.wake_ready(svc)
                await self.token_uses.sync(svc.engine, svc.reader)
                if loop.time() >= next_flush:
                    next_flush = loop.time() + self.settings.agent_presence_interval_seconds
                    await self.flush_presence(svc)
            except Exception:
                log.exception("agent gateway background work failed")
            await sleep_unless_stopped(stop, self.settings.agent_poll_fallback_seconds)
        try:
            await self.flush_presence(svc)
            await self.token_uses.sync(svc.engine, svc.reader)
        except Exception:
            log.exception("writing agent presence or token uses failed")

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

    def listener_connected(self) -> None:
        """The PostgreSQL LISTEN connection is (again) up: announcements sent while it was down are lost,
        so every waiting long poll looks again."""
        self.listening.set()
        self.waker.notify_all()

    def announced(self, payload: str) -> None:
        """A replica (maybe this one) committed a change to a runner's queue: wake its long polls here."""
        parsed = store.parse_announcement(payload)
        if parsed is not None:
            self.waker.notify(*parsed)


def agent_gateway(request: Request) -> AgentGateway:
    gateway: AgentGateway = request.app.state.agent_gateway
    return gateway


async def authenticated_agent(
    org_id: str,
    runner_id: str,
    request: Request,
    svc: Services = Depends(services),
    _documented: None = Security(openapi.AGENT_TOKEN),
) -> None:
    """Admit the request if it carries a valid agent token of ``org_id/runner_id``; a generic 401 else."""
    await agent_gateway(request).authenticate(svc, org_id, runner_id, request.headers.get("authorization"))


AGENT = Depends(authenticated_agent)


def _parse(model: type[_Model], body: bytes, what: str) -> _Model:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        problems = [
            {"field": ".".join(str(part) for part in error["loc"]), "problem": error["msg"]}
            for error in exc.errors(include_url=False, include_input=False)
        ]
        named = "; ".join(f"{p['field'] or 'body'}: {p['problem']}" for p in problems[:5])
        raise InvalidInputError(f"invalid {what}: {named}", details={"errors": problems}) from exc


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
    return await agent_gateway(request).next_command(svc, org_id, runner_id, request.is_disconnected)


def _receipt(request: Request, org_id: str, runner_id: str, command_id: str, text: str) -> receipts.Receipt:
    return receipts.open_receipt(
        agent_gateway(request).receipt_key, text, org_id=org_id, runner_id=runner_id, command_id=command_id
    )


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
    body = _parse(protocol.AckRequest, await read_limited(request, MAX_ANSWER_BYTES, "the ack"), "ack")
    receipt = _receipt(request, org_id, runner_id, command_id, body.receipt)
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
    raw = await read_limited(request, MAX_ANSWER_BYTES, "the retry")
    body = _parse(protocol.RetryRequest, raw, "retry")
    receipt = _receipt(request, org_id, runner_id, command_id, body.receipt)
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
    raw = await read_limited(request, MAX_ANSWER_BYTES, "the reject")
    body = _parse(protocol.RejectRequest, raw, "reject")
    receipt = _receipt(request, org_id, runner_id, command_id, body.receipt)
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
