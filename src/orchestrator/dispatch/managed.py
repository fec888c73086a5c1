"""Managed runners (seed 004): registration, claims and their leases, ``finished``, and the worker that
ends lapsed leases, times out unclaimed deployments and prunes runners not seen for long.

The pool is the runner ``managed`` of every organization; the dispatcher never launches its deployments
(they are created ``queued``): a managed runner claims one (``POST /runner/claim``), runs ``po-runner
standard`` with the environment :func:`claim_environment` gives, and tells ``finished`` when it exited.

- Registration needs MANAGED_RUNNER_SECRET and mints a per-runner token (``secrets.token_urlsafe(32)``),
  stored only as its SHA-256; a registration of a name replaces that name's record (its token stops
  working at once, its claim is lost as if its lease ran out now).
- A claim lasts ``PO_MANAGED_LEASE_SECONDS`` from the claim or the last heartbeat. When it runs out: a
  deployment whose token was never used at the gateway (no bundle fetched: nothing can have run) is queued
  again; any other fails, saying the runner stopped answering.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestrator import deployment_tokens
from orchestrator.dispatch import live_logs
from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import (
    EXECUTING_MESSAGE,
    TIMEOUT_MESSAGE,
    Deployment,
    Status,
    runner_mode,
)
from orchestrator.domain.managed import (
    MANAGED_RUNNER_ID,
    MANAGED_TAG,
    TOKEN_INVALID_MESSAGE,
    check_name,
    runner_tags,
)
from orchestrator.errors import ConflictError, UnauthenticatedError
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.log_stream import Phase
from orchestrator.protocol.results import RunnerMode
from orchestrator.store import deployments as deployment_store
from orchestrator.store import managed_runners as store
from orchestrator.store.managed_runners import ManagedRunner

log = structlog.get_logger(__name__)

#: The variable of a run's environment that the managed runner sets itself (from its RUNNER_URL).
GATEWAY_URL_VARIABLE = "RUNNER_GATEWAY_URL"


def token_hash(token: str) -> str:
    """How a runner token is stored: its SHA-256 (the token is 256 random bits: no key is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def secret_matches(expected: SecretStr, presented: str) -> bool:
    return hmac.compare_digest(expected.get_secret_value().encode(), presented.encode())


@dataclass(frozen=True, kw_only=True)
class Registered:
    record: ManagedRunner
    #: The new token, told to the runner once; stored nowhere in clear.
    token: str
    #: The name's previous record, replaced.
    replaced: ManagedRunner | None
    #: Deployments that ended (or were queued again) because the replaced record's claim was lost.
    outcome: LostClaims


@dataclass(kw_only=True)
class LostClaims:
    #: Deployments failed: their waiters are told.
    failed: list[str] = field(default_factory=list)
    #: Deployments queued again: waiting claims are woken.
    requeued: list[str] = field(default_factory=list)

    def add(self, other: LostClaims) -> None:
        self.failed += other.failed
        self.requeued += other.requeued


def lost_message(name: str, ran_out_at: datetime) -> str:
    return (
        f"managed runner '{name}' stopped answering during the deployment; its lease ran out at "
        f"{ran_out_at.isoformat(timespec='seconds')}"
    )


def exited_message(name: str, exit_code: int) -> str:
    return f"managed runner '{name}': po-runner exited with code {exit_code} without reporting results"


@dataclass(frozen=True, kw_only=True)
class Allowance:
    """The tags a registration may serve (besides ``managed``), decided by the platform: what the shared
    secret allows (``PO_MANAGED_SECRET_TAGS``) or what a registration credential was created with."""

    tags: frozenset[str]
    #: Why a tag outside ``tags`` is dropped (told in the register answer).
    reason: str


def shared_secret_allowance(tags: frozenset[str]) -> Allowance:
    allowed = ", ".join(sorted(tags)) or "none"
    return Allowance(
        tags=tags,
        reason=(
            f"a runner registering with MANAGED_RUNNER_SECRET may serve only the tags the server allows "
            f"(PO_MANAGED_SECRET_TAGS: {allowed}); register with a registration credential bound to this "
            "tag (a platform admin creates one: octl create managed-runner-registration --tag <tag>)"
        ),
    )


def credential_allowance(registration: store.Registration) -> Allowance:
    allowed = ", ".join(registration.tags) or "none"
    return Allowance(
        tags=frozenset(registration.tags),
        reason=f"registration credential {registration.id} allows only the tags: {allowed}",
    )


def effective_tags(declared: list[str], allowance: Allowance) -> tuple[list[str], list[dict[str, str]]]:
    """The declared tags (checked: InvalidInputError naming ``tags[i]``) the allowance lets the runner
    serve, with ``managed``; and the dropped ones, each with its reason."""
    checked = runner_tags(declared)
    kept = [t for t in checked if t == MANAGED_TAG or t in allowance.tags]
    dropped = [{"tag": t, "reason": allowance.reason} for t in checked if t not in kept]
    return kept, dropped


async def credential(conn: AsyncConnection, secret: str) -> store.Registration | None:
    """The registration credential whose secret this is (looked up by its SHA-256)."""
    return await store.registration_by_secret_hash(conn, token_hash(secret))


async def register(conn: AsyncConnection, *, name: str, tags: list[str], now: datetime) -> Registered:
    """Register ``name`` (replacing its record) with ``tags`` (already the effective ones): a new record
    and token. InvalidInputError naming the field for a bad name or tag."""
    check_name(name)
    all_tags = runner_tags(tags)
    old = await store.by_name(conn, name, for_update=True)
    outcome = LostClaims()
    if old is not None:
        outcome = await _lose_claim(conn, old, now=now, ran_out_at=now)
        await store.delete(conn, old.id)
    token = secrets.token_urlsafe(32)
    record = await store.insert(conn, name=name, tags=all_tags, token_hash=token_hash(token), now=now)
    return Registered(record=record, token=token, replaced=old, outcome=outcome)


async def authenticate(conn: AsyncConnection, token: str) -> ManagedRunner:
    """The record of a runner token; UnauthenticatedError (register again) for any other."""
    record = await store.by_token_hash(conn, token_hash(token)) if token else None
    if record is None:
        raise UnauthenticatedError(TOKEN_INVALID_MESSAGE)
    return record


async def heartbeat(
    conn: AsyncConnection,
    record: ManagedRunner,
    deployment_id: uuid.UUID | None,
    *,
    now: datetime,
    lease: timedelta,
) -> bool:
    """The runner is alive; with ``deployment_id`` (its claim, else ConflictError), its lease renewed;
    True if that deployment's cancel was asked for (the runner stops its run)."""
    await store.seen(conn, record.id, now=now)
    if deployment_id is None:
        return False
    if record.claim_deployment_id != deployment_id or not await store.renew(
        conn, record.id, deployment_id, until=now + lease
    ):
        raise ConflictError(
            f"deploymentId: managed runner '{record.name}' holds no claim of deployment '{deployment_id}'"
            + (
                f" (it holds '{record.claim_deployment_id}')"
                if record.claim_deployment_id is not None
                else " (its lease may have run out)"
            )
        )
    deployment = await deployment_store.get_by_id(conn, deployment_id)
    return deployment is not None and deployment.cancel_requested_at is not None


async def claim(
    conn: AsyncConnection, record: ManagedRunner, *, now: datetime, lease: timedelta
) -> Deployment | None:
    """The oldest queued managed deployment the runner's tags allow, claimed for it; None if there is
    none. ConflictError if the runner still holds a claim."""
    if record.claim_deployment_id is not None:
        raise ConflictError(
            f"managed runner '{record.name}' already holds deployment '{record.claim_deployment_id}': "
            "tell finished first"
        )
    await store.seen(conn, record.id, now=now)
    claimed = await store.claim(conn, record, now=now, lease=lease)
    if claimed is not None:
        await live_logs.record_phase(conn, claimed, Phase.LAUNCHING, now=now)
    return claimed


async def finished(
    conn: AsyncConnection, record: ManagedRunner, deployment_id: uuid.UUID, exit_code: int, *, now: datetime
) -> bool:
    """The runner's po-runner exited: its claim is released, and a deployment still without results
    fails. True if the deployment ended here. ConflictError if the runner does not hold it."""
    if record.claim_deployment_id != deployment_id:
        raise ConflictError(
            f"managed runner '{record.name}' holds no claim of deployment '{deployment_id}' (its lease may "
            "have run out)"
        )
    await store.seen(conn, record.id, now=now)
    await store.release(conn, record.id)
    deployment = await store.deployment(conn, deployment_id)
    if deployment is None or deployment.status != Status.EXECUTING:
        return False
    message = exited_message(record.name, exit_code)
    failed = await results_policy.fail(conn, deployment, message, now=now, code="RUNNER_EXITED")
    if failed:
        log.info("managed deployment failed", runner=record.name, **deployment.log_context())
    return failed


async def _lose_claim(
    conn: AsyncConnection, record: ManagedRunner, *, now: datetime, ran_out_at: datetime
) -> LostClaims:
    """The record's claim is lost (lease ran out, record replaced): queue its deployment again if its
    token was never used at the gateway, else fail it."""
    outcome = LostClaims()
    if record.claim_deployment_id is None:
        return outcome
    deployment_id = record.claim_deployment_id
    await store.release(conn, record.id)
    deployment = await store.deployment(conn, deployment_id)
    if deployment is None or deployment.status != Status.EXECUTING:
        return outcome
    if record.claim_used_at is None:
        if await store.requeue(conn, deployment_id, now=now):
            await live_logs.record_phase(conn, deployment, Phase.QUEUED, now=now)
            outcome.requeued.append(str(deployment_id))
            log.info(
                "managed claim lost before it began: queued again",
                runner=record.name,
                **deployment.log_context(),
            )
        return outcome
    if await results_policy.fail(
        conn, deployment, lost_message(record.name, ran_out_at), now=now, code="RUNNER_LOST"
    ):
        outcome.failed.append(str(deployment_id))
        log.info("managed claim lost: deployment failed", runner=record.name, **deployment.log_context())
    return outcome


async def expire_leases(conn: AsyncConnection, *, now: datetime, limit: int = 50) -> LostClaims:
    outcome = LostClaims()
    for record in await store.lapsed(conn, now=now, limit=limit):
        ran_out_at = record.claim_lease_until or now
        outcome.add(await _lose_claim(conn, record, now=now, ran_out_at=ran_out_at))
    return outcome


async def time_out_queued(conn: AsyncConnection, *, now: datetime, limit: int = 50) -> list[str]:
    """Fail queued deployments no managed runner claimed before their timeout."""
    failed = []
    for deployment in await store.queued_timed_out(conn, now=now, limit=limit):
        if await results_policy.fail(
            conn, deployment, TIMEOUT_MESSAGE, now=now, code="TIMEOUT", before_start=True
        ):
            failed.append(str(deployment.id))
    return failed


#: A queued deployment no online managed runner can take (issue 26).
NONE_ONLINE_MESSAGE = "waiting for a managed runner: none is online"


def waiting_message(required: list[str], online: list[frozenset[str]]) -> str:
    """What a queued deployment of the pool waits for: no runner online, none online carrying its tags,
    or (one can take it) the ordinary message."""
    if not online:
        return NONE_ONLINE_MESSAGE
    if any(set(required) <= tags for tags in online):
        return EXECUTING_MESSAGE
    return (
        f"waiting for a managed runner: no online managed runner has the tags {', '.join(sorted(required))}"
    )


async def note_waiting(
    conn: AsyncConnection, *, now: datetime, online_within: timedelta, limit: int = 200
) -> int:
    """Say in each queued deployment's status message what it waits for; only changed messages are
    written (the worker's round, not each poll). How many were written."""
    queued = await store.queued_messages(conn, limit=limit)
    if not queued:
        return 0
    online = await store.online_tag_sets(conn, since=now - online_within)
    written = 0
    for deployment_id, required, message in queued:
        wanted = waiting_message(required, online)
        if wanted != message and await store.set_queued_message(conn, deployment_id, wanted):
            written += 1
    return written


async def prune(
    conn: AsyncConnection, *, now: datetime, after: timedelta, limit: int = 100
) -> list[ManagedRunner]:
    gone = await store.prune(conn, cutoff=now - after, limit=limit)
    for record in gone:
        log.info(
            "managed runner pruned",
            name=record.name,
            last_seen_at=record.last_seen_at.isoformat(timespec="seconds"),
        )
    return gone


def claim_environment(deployment: Deployment, *, token_key: bytes) -> dict[str, str]:
    """What ``po-runner standard`` needs for the claimed deployment: the variables every launcher gives a
    run (``RunSpec.runner_environment``), the per-deployment token included, without RUNNER_GATEWAY_URL,
    which the managed runner sets from its own RUNNER_URL."""
    spec = RunSpec(
        org_id=deployment.org_id,
        runner_id=MANAGED_RUNNER_ID,
        deployment_id=str(deployment.id),
        env_uuid=str(deployment.env_uuid),
        mode=RunnerMode(runner_mode(deployment.mode, deployment.plan_only)),
        token=SecretStr(deployment_tokens.deployment_token(token_key, deployment.org_id, str(deployment.id))),
        gateway_url="",
        encrypting_key=deployment.encrypted_outputs_recipient,
        encrypting_logs_key=deployment.encrypted_logs_recipient,
        log_level=deployment.runner_log_level,
        runner_configuration={},
    )
    environment = spec.runner_environment()
    environment.pop(GATEWAY_URL_VARIABLE)
    return environment


class ManagedWorker:
    """Ends lapsed leases, fails queued deployments past their timeout, prunes runners not seen for
    ``prune_after``. Runs beside the retention worker on every replica (rows are locked, SKIP LOCKED)."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        prune_after: timedelta,
        interval_seconds: float,
        on_final: Callable[[str], None],
        on_requeued: Callable[[], None],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        online_within: timedelta = timedelta(seconds=60),
        started_at: datetime | None = None,
    ) -> None:
        self.engine = engine
        #: Until then (a lease after this server started) no lease is ended: while no server answered,
        #: runners could not renew their leases, and a lease that ran out during an outage of the API says
        #: nothing about the runner. Other replicas, up all along, go on ending lapsed leases meanwhile.
        #: Pruning goes on: a runner unseen for ``prune_after`` (a day) registers again when it comes back.
        #: None: no such grace (tests on a controlled clock).
        self.grace_until = None if started_at is None else started_at + online_within
        #: A runner seen within this long is online (``PO_MANAGED_LEASE_SECONDS``).
        self.online_within = online_within
        self.prune_after = prune_after
        self.interval_seconds = interval_seconds
        self.on_final = on_final
        self.on_requeued = on_requeued
        self.clock = clock

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception:
                log.exception("managed runner round failed")
            try:
                await asyncio.wait_for(stop.wait(), self.interval_seconds)
            except TimeoutError:
                pass

    async def run_once(self) -> LostClaims:
        now = self.clock()
        just_started = self.grace_until is not None and now < self.grace_until
        async with self.engine.begin() as conn:
            outcome = LostClaims() if just_started else await expire_leases(conn, now=now)
            outcome.failed += await time_out_queued(conn, now=now)
            await prune(conn, now=now, after=self.prune_after)
            await note_waiting(conn, now=now, online_within=self.online_within)
        for deployment_id in outcome.failed:
            self.on_final(deployment_id)
        if outcome.requeued:
            self.on_requeued()
        return outcome
