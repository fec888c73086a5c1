"""The managed runners' routes (seed 004): ``/runner/register``, ``/runner/heartbeat``, ``/runner/claim``
(a long poll) and ``/runner/deployments/{id}/finished``.

Only ``register`` takes MANAGED_RUNNER_SECRET; it mints a per-runner token that every later call carries
(``Authorization: Bearer``), and that the server keeps only as its SHA-256. An unknown, replaced or pruned
token is 401 "register again"; the secret is never accepted there. The policy is ``dispatch.managed``.

A waiting claim holds no database connection: it waits on :class:`ClaimWaker`, one waiter woken per
deployment committed on this server (``Services.wake_dispatcher``) or queued again (a woken claim that can
take nothing passes the wake-up on), the waiting claims of a replaced record at once (401: register
again), and looks again every
``PO_AGENT_POLL_FALLBACK_SECONDS`` (deployments committed by another replica, leases running out) with a
cheap read first.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Request, Response, Security
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.dispatch import managed as policy
from orchestrator.domain.deployments import Deployment
from orchestrator.domain.managed import (
    MANAGED_RUNNER_ID,
    NOT_ENABLED_MESSAGE,
    SECRET_INVALID_MESSAGE,
    TOKEN_INVALID_MESSAGE,
)
from orchestrator.errors import ConflictError, NotFoundError, UnauthenticatedError
from orchestrator.settings import ServerSettings
from orchestrator.store import managed_runners as store
from orchestrator.store.managed_runners import ClaimRaceError, ManagedRunner
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/runner", tags=["Managed runners"])

#: The longest claim long poll a runner may ask for.
MAX_WAIT_SECONDS = 25


@dataclass(eq=False)
class Waiter:
    """One waiting claim's ticket."""

    event: asyncio.Event
    #: The wake-up round it has looked at (its ``notify``'s number, or the round current when it looked).
    seen: int
    runner_id: uuid.UUID
    #: Its runner's record was replaced (a registration of the same name): it answers 401 at once.
    replaced: bool = False


class ClaimWaker:
    """Wakes waiting claims: one per new deployment (not all of them: 50 waiting runners would run 50
    claim transactions for one deployment). A woken claim that finds nothing it may take (tags) passes the
    wake-up on to the next waiter that has not looked since (``pass_on``), so a deployment only some
    runners can take still reaches one of them without waking every waiter at once."""

    def __init__(self) -> None:
        self._waiters: list[Waiter] = []
        self._round = 0
        #: How many waiters were woken (tests count them).
        self.wakeups = 0

    def ticket(self, runner_id: uuid.UUID) -> Waiter:
        """Take this before looking for a deployment: a ``notify`` from then on may wake it."""
        waiter = Waiter(event=asyncio.Event(), seen=self._round, runner_id=runner_id)
        self._waiters.append(waiter)
        return waiter

    def done(self, waiter: Waiter) -> None:
        """The claim stopped waiting on this ticket."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)

    def notify(self, count: int = 1) -> None:
        """``count`` deployments became claimable: wake that many waiters (the longest waiting first)."""
        self._round += 1
        self._wake(count, self._round)

    def pass_on(self, waiter: Waiter) -> None:
        """``waiter`` was woken but could take nothing: wake one that has not looked since that wake-up."""
        self._wake(1, waiter.seen)

    def notify_all(self) -> None:
        self._round += 1
        self._wake(len(self._waiters), self._round)

    def replaced(self, runner_id: uuid.UUID) -> None:
        """The record ``runner_id`` was replaced: its waiting claims answer at once (register again)."""
        for waiter in [w for w in self._waiters if w.runner_id == runner_id]:
            waiter.replaced = True
            self._waiters.remove(waiter)
            waiter.event.set()

    def _wake(self, count: int, round_: int) -> None:
        for waiter in list(self._waiters):
            if count <= 0:
                return
            if waiter.seen < round_:
                self._waiters.remove(waiter)
                waiter.seen = round_
                waiter.event.set()
                self.wakeups += 1
                count -= 1


@dataclass(kw_only=True)
class ManagedGateway:
    """What the routes share: the waker, and whether the server is stopping."""

    settings: ServerSettings
    waker: ClaimWaker = field(default_factory=ClaimWaker)
    stopping: bool = False

    #: Claim transactions of waiting claims after a wake-up or fallback look (tests count them).
    claim_looks: int = 0

    def stop_polls(self) -> None:
        self.stopping = True
        self.waker.notify_all()


def managed_gateway(request: Request) -> ManagedGateway:
    gateway: ManagedGateway = request.app.state.managed_gateway
    return gateway


# --- wire -----------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegisterBody(_Body):
    managedSecret: Annotated[str, Field(min_length=1, max_length=1024)]  # noqa: N815 (seed 004's name)
    name: Annotated[str, Field(min_length=1, max_length=63)]
    tags: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=32)] = Field(
        default_factory=list
    )


class DroppedTag(BaseModel):
    tag: str
    reason: str


class RegisterOut(BaseModel):
    runnerId: str  # noqa: N815
    name: str
    #: The runner's token: every later call carries it (Authorization: Bearer); stored only hashed.
    token: str
    pool: str
    #: The tags it serves: the declared ones the platform allows it, and ``managed``.
    tags: list[str]
    #: Declared tags it may not serve, each with why (issue 26).
    droppedTags: list[DroppedTag] = Field(default_factory=list)  # noqa: N815
    leaseSeconds: int  # noqa: N815
    heartbeatSeconds: int  # noqa: N815


class HeartbeatBody(_Body):
    deploymentId: uuid.UUID | None = None  # noqa: N815


class TimingOut(BaseModel):
    leaseSeconds: int  # noqa: N815
    heartbeatSeconds: int  # noqa: N815


class HeartbeatOut(TimingOut):
    #: The deployment the heartbeat carried was cancelled: stop its po-runner (SIGTERM, then SIGKILL after
    #: cancelGraceSeconds) and report its exit code as usual.
    #: Only when ``cancel`` (answers stay as before otherwise).
    cancel: bool = False
    cancelGraceSeconds: float | None = None  # noqa: N815


class ClaimBody(_Body):
    waitSeconds: Annotated[int, Field(ge=0, le=MAX_WAIT_SECONDS)] = 0  # noqa: N815


class ClaimedDeployment(BaseModel):
    id: str
    orgId: str  # noqa: N815
    projectId: str  # noqa: N815
    envId: str  # noqa: N815


class ClaimOut(BaseModel):
    deployment: ClaimedDeployment
    leaseSeconds: int  # noqa: N815
    #: What ``po-runner standard`` needs, without RUNNER_GATEWAY_URL (the runner adds it from RUNNER_URL).
    environment: dict[str, str]


class FinishedBody(_Body):
    exitCode: int = Field(ge=-1024, le=1024)  # noqa: N815


# --- helpers --------------------------------------------------------------------------------------------


def _enabled(svc: Services) -> None:
    if not svc.settings.managed_runners_enabled:
        raise NotFoundError(NOT_ENABLED_MESSAGE)


def _bearer(request: Request) -> str:
    value = request.headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError(TOKEN_INVALID_MESSAGE)
    return token.strip()


@openapi.may_answer(404)
async def managed_runner_token(
    request: Request,
    svc: Services = Depends(services),
    _documented: None = Security(openapi.MANAGED_RUNNER_TOKEN),
) -> str:
    """The runner token the request carries (checked by the route, in its transaction)."""
    _enabled(svc)
    return _bearer(request)


TOKEN = Depends(managed_runner_token)


def _timing(settings: ServerSettings) -> dict[str, int]:
    return {
        "leaseSeconds": int(settings.managed_lease_seconds),
        "heartbeatSeconds": int(settings.managed_heartbeat_seconds),
    }


def _lease(settings: ServerSettings) -> timedelta:
    return timedelta(seconds=settings.managed_lease_seconds)


def _told(svc: Services, gateway: ManagedGateway, outcome: policy.LostClaims) -> None:
    for deployment_id in outcome.failed:
        svc.notifier.notify(deployment_id)
    if outcome.requeued:
        gateway.waker.notify(len(outcome.requeued))


# --- routes ---------------------------------------------------------------------------------------------


@router.post("/register", status_code=201, response_model=RegisterOut)
@openapi.may_answer(401, 404, 503)
@openapi.never_answers(409)
async def register(body: RegisterBody, request: Request, svc: Services = Depends(services)) -> RegisterOut:
    """Register a managed runner with MANAGED_RUNNER_SECRET: its record (replacing one of the same name,
    whose token stops working) and its token, which every later call carries. 401 for a wrong secret; 404
    when managed runners are not enabled on this server."""
    _enabled(svc)
    assert svc.settings.managed_runner_secret is not None
    if policy.secret_matches(svc.settings.managed_runner_secret, body.managedSecret):
        allowance = policy.shared_secret_allowance(svc.settings.managed_secret_tag_set)
    else:
        async with svc.reader.connect() as conn:
            credential = await policy.credential(conn, body.managedSecret)
        if credential is None:
            log.warning("managed runner registration refused: wrong secret", name=body.name[:63])
            raise UnauthenticatedError(SECRET_INVALID_MESSAGE)
        allowance = policy.credential_allowance(credential)
    tags, dropped = policy.effective_tags(body.tags, allowance)
    async with transaction(svc) as conn:
        registered = await policy.register(conn, name=body.name, tags=tags, now=datetime.now(UTC))
    gateway = managed_gateway(request)
    _told(svc, gateway, registered.outcome)
    if registered.replaced is not None:
        gateway.waker.replaced(registered.replaced.id)
    log.info(
        "managed runner registered",
        name=registered.record.name,
        runner_id=str(registered.record.id),
        tags=registered.record.tags,
        replaced=registered.replaced is not None,
        dropped_tags=[d["tag"] for d in dropped],
    )
    return RegisterOut(
        runnerId=str(registered.record.id),
        name=registered.record.name,
        token=registered.token,
        pool=MANAGED_RUNNER_ID,
        tags=registered.record.tags,
        droppedTags=[DroppedTag(**d) for d in dropped],
        **_timing(svc.settings),
    )


@router.post("/heartbeat", response_model=HeartbeatOut, response_model_exclude_defaults=True)
async def heartbeat(
    body: HeartbeatBody, token: str = TOKEN, svc: Services = Depends(services)
) -> HeartbeatOut:
    """The runner is alive; with `deploymentId` (its claim), that claim's lease is renewed, and `cancel`
    says whether the deployment was cancelled. 409 if the runner does not hold that deployment (its lease
    ran out, or it was replaced)."""
    async with transaction(svc) as conn:
        record = await policy.authenticate(conn, token)
        cancel = await policy.heartbeat(
            conn, record, body.deploymentId, now=datetime.now(UTC), lease=_lease(svc.settings)
        )
    if not cancel:
        return HeartbeatOut(**_timing(svc.settings))
    return HeartbeatOut(
        **_timing(svc.settings), cancel=True, cancelGraceSeconds=svc.settings.cancel_grace_seconds
    )


@router.post(
    "/claim",
    response_model=ClaimOut,
    responses={204: {"description": "Nothing was claimable within the wait: call again."}},
)
async def claim(
    body: ClaimBody, request: Request, token: str = TOKEN, svc: Services = Depends(services)
) -> Any:
    """Claim the oldest queued deployment (of any organization) on runner `managed` whose required tags
    the runner carries, waiting up to `waitSeconds` (long poll); 204 when none came. 409 while the runner
    holds a claim."""
    gateway = managed_gateway(request)
    settings = svc.settings
    loop = asyncio.get_running_loop()
    # Bounded by the server's long poll limit too (PO_AGENT_FETCH_WAIT_SECONDS, 25 by default).
    deadline = loop.time() + min(body.waitSeconds, settings.agent_fetch_wait_seconds)
    async with transaction(svc) as conn:
        record = await policy.authenticate(conn, token)
        if gateway.stopping:
            # The server is stopping: no new claim here; the runner claims again elsewhere or after it.
            return Response(status_code=204)
        wake = gateway.waker.ticket(record.id)
        claimed = await _claim(conn, record, settings)
    try:
        while claimed is None:
            remaining = deadline - loop.time()
            if remaining <= 0 or gateway.stopping:
                return Response(status_code=204)
            try:
                async with asyncio.timeout(min(remaining, settings.agent_poll_fallback_seconds)):
                    await wake.event.wait()
            except TimeoutError:
                pass
            gateway.waker.done(wake)
            if wake.replaced:
                # A registration of the same name replaced this runner's record: tell it now.
                raise UnauthenticatedError(TOKEN_INVALID_MESSAGE)
            if await request.is_disconnected():
                gateway.waker.pass_on(wake)
                return Response(status_code=204)
            woken = wake
            wake = gateway.waker.ticket(record.id)
            async with svc.reader.connect() as conn:
                if not await store.any_queued(conn):
                    continue
            gateway.claim_looks += 1
            async with transaction(svc) as conn:
                record = await policy.authenticate(conn, token)
                claimed = await _claim(conn, record, settings)
            if claimed is None and woken.event.is_set():
                gateway.waker.pass_on(woken)
    finally:
        gateway.waker.done(wake)
        if wake.event.is_set() and not wake.replaced:
            # Woken while it was looking, for a deployment it may not have taken: the next waiter looks.
            gateway.waker.pass_on(wake)
    # The request's later lines are about this deployment.
    structlog.contextvars.bind_contextvars(**claimed.log_context())
    log.info("managed deployment claimed", runner=record.name)
    answer = ClaimOut(
        deployment=ClaimedDeployment(
            id=str(claimed.id), orgId=claimed.org_id, projectId=claimed.project_id, envId=claimed.env_id
        ),
        leaseSeconds=int(settings.managed_lease_seconds),
        environment=policy.claim_environment(claimed, token_key=svc.token_key),
    )
    return JSONResponse(answer.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


async def _claim(conn: AsyncConnection, record: ManagedRunner, settings: ServerSettings) -> Deployment | None:
    try:
        return await policy.claim(conn, record, now=datetime.now(UTC), lease=_lease(settings))
    except ClaimRaceError:
        raise ConflictError(
            f"managed runner '{record.name}' claimed another deployment at the same time"
        ) from None


@router.post("/deployments/{deployment_id}/finished", response_model=dict[str, Any])
async def finished(
    deployment_id: uuid.UUID,
    body: FinishedBody,
    token: str = TOKEN,
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """The runner's po-runner for its claimed deployment exited with `exitCode`: the claim is released;
    a deployment that recorded no results fails, naming the runner and the exit code. 409 if the runner
    does not hold the deployment."""
    async with transaction(svc) as conn:
        record = await policy.authenticate(conn, token)
        ended = await policy.finished(conn, record, deployment_id, body.exitCode, now=datetime.now(UTC))
    if ended:
        svc.notifier.notify(str(deployment_id))
    return {}
