"""Deployments on agent runners: their commands (enqueue, claim, ack, retry, reject, expiry) and the events
agents report, each a state change of a command and its deployment in one transaction.

An agent runner's deployment is "launched" when its ``create-job`` command is committed, in the same
transaction that marks the deployment launched; its handle is ``agent:<command id>``. From then on the
deployment moves only by what agents report (events, results) and by its timeout; the orchestrator never
polls the target.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import structlog
from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import Deployment, Status
from orchestrator.domain.runner_types import K8sRunnerJobConfig, RunnerType
from orchestrator.errors import ConflictError, InvalidInputError, NotFoundError
from orchestrator.launchers import kubernetes_job
from orchestrator.launchers.base import LaunchError
from orchestrator.protocol import commands as protocol
from orchestrator.protocol import problems
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import DeploymentResults
from orchestrator.store import agent_commands as store
from orchestrator.store import deployments as deployment_store
from orchestrator.store.agent_commands import AgentCommand, CommandState

log = structlog.get_logger(__name__)

HANDLE_PREFIX: Final = "agent:"
#: How many closed-on-sight heads (expired, deployment final) one claim skips before giving up for now.
_MAX_SKIPPED_HEADS: Final = 20


def is_agent_handle(handle: str | None) -> bool:
    return bool(handle) and str(handle).startswith(HANDLE_PREFIX)


def handle_for(command_id: str) -> str:
    return f"{HANDLE_PREFIX}{command_id}"


def envelope_for(
    deployment: Deployment,
    spec: RunSpec,
    *,
    runner_type: str,
    now: datetime,
    ttl: timedelta,
    revision: int = 1,
) -> protocol.CommandEnvelope:
    """The ``create-job`` command of a deployment, without the deployment token (added on delivery).

    A ``kubernetes-agent`` command also carries the runner's JobSpec as ``configuration`` (for upstream's
    agent): the Job the direct ``kubernetes`` launcher would create, with the runner's pod template
    merged."""
    description = protocol.RunDescription.from_run_spec(spec, runner_type)
    job = spec.runner_configuration.get("job") or {}
    namespace = job.get("namespace") if isinstance(job, dict) else None
    configuration = job_spec(spec) if runner_type == RunnerType.KUBERNETES_AGENT else None
    payload = protocol.CreateJobPayload(
        job_id=str(deployment.id),
        namespace=namespace if isinstance(namespace, str) else None,
        configuration=configuration,
        spec=description,
    )
    return protocol.CommandEnvelope(
        protocol_version=protocol.PROTOCOL_VERSION,
        command_id=protocol.command_id(str(deployment.id), revision),
        organization_id=deployment.org_id,
        runner_id=deployment.runner_id,
        deployment_id=str(deployment.id),
        type=protocol.CommandType.CREATE_JOB,
        created_at=now,
        expires_at=now + ttl,
        payload=payload.model_dump(mode="json", exclude_none=True),
    )


async def publish_cancel(
    conn: AsyncConnection, deployment: Deployment, *, now: datetime, grace_seconds: float, ttl: timedelta
) -> bool:
    """A cancelled agent deployment: True if a ``cancel-job`` command for its agent was stored (the agent
    stops the run; its runner reports, ending the deployment ``cancelled``). False if none is needed:
    its ``create-job`` was never delivered (it is closed, and the deployment ends ``cancelled`` here) or
    the run is over already."""
    create_id = (deployment.handle or "").removeprefix(HANDLE_PREFIX)
    create = await store.get(conn, create_id, for_update=True)
    if create is None:
        return False
    if create.state == CommandState.PENDING and create.attempt == 0:
        await store.close(
            conn, create.id, state=CommandState.CANCELLED, now=now, reason="the deployment was cancelled"
        )
        await results_policy.fail(
            conn,
            deployment,
            "cancelled before the runner agent picked up its command",
            now=now,
            code="CANCELLED",
        )
        return False
    payload = create.envelope.get("payload") or {}
    spec = payload.get("spec") or {}
    cancel = protocol.CancelJobPayload(
        job_id=str(payload.get("job_id") or deployment.id),
        namespace=payload.get("namespace"),
        runner_type=str(spec.get("runner_type") or ""),
        grace_seconds=grace_seconds,
    )
    envelope = protocol.CommandEnvelope(
        protocol_version=protocol.PROTOCOL_VERSION,
        command_id=protocol.cancel_command_id(str(deployment.id)),
        organization_id=deployment.org_id,
        runner_id=deployment.runner_id,
        deployment_id=str(deployment.id),
        type=protocol.CommandType.CANCEL_JOB,
        created_at=now,
        expires_at=now + ttl,
        payload=cancel.model_dump(mode="json", exclude_none=True),
    )
    return await enqueue(conn, envelope, now=now)


def job_spec(spec: RunSpec) -> dict[str, Any]:
    """The JobSpec of a ``kubernetes-agent`` run (no ``TOKEN``); a non-retryable ``LaunchError`` if the
    runner's stored ``job`` no longer validates."""
    try:
        job_config = K8sRunnerJobConfig.model_validate(spec.runner_configuration.get("job"))
    except ValidationError as exc:
        # Without the input values: a pod template may hold secrets.
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        error = LaunchError(f"invalid job configuration of runner '{spec.runner_id}': {problems}")
        error.retryable = False
        raise error from exc
    return kubernetes_job.render_job_spec(spec, job_config, kubernetes_job.DEFAULT_RUNNER_IMAGE)


async def enqueue(conn: AsyncConnection, envelope: protocol.CommandEnvelope, *, now: datetime) -> bool:
    """Store the command (in the caller's transaction, which announces it to every replica); False if it
    exists already."""
    inserted = await store.insert(
        conn,
        {
            "id": envelope.command_id,
            "org_id": envelope.organization_id,
            "runner_id": envelope.runner_id,
            "deployment_id": uuid.UUID(envelope.deployment_id),
            "type": envelope.type,
            "envelope": envelope.model_dump(mode="json"),
            "state": CommandState.PENDING,
            "attempt": 0,
            "available_at": now,
            "expires_at": envelope.expires_at,
            "created_at": now,
            "updated_at": now,
        },
    )
    if inserted:
        await store.announce(conn, envelope.organization_id, envelope.runner_id)
    return inserted


def expired_message(command: AgentCommand) -> str:
    return (
        f"the runner agent did not pick up command '{command.id}' before it expired at "
        f"{command.expires_at.isoformat()}"
    )


async def expire(conn: AsyncConnection, command: AgentCommand, *, now: datetime) -> Deployment | None:
    """Close a command past its TTL and fail its deployment with ``COMMAND_EXPIRED``; the deployment if
    this failed it."""
    await store.close(conn, command.id, state=CommandState.EXPIRED, now=now, reason="expired")
    deployment = await deployment_store.get(conn, command.org_id, command.deployment_id, for_update=True)
    if deployment is None:
        return None
    failed = await results_policy.fail(
        conn,
        deployment,
        expired_message(command),
        now=now,
        code=protocol.COMMAND_EXPIRED_CODE,
        before_start=command.type == protocol.CommandType.CREATE_JOB,
    )
    return deployment if failed else None


async def expire_due(conn: AsyncConnection, *, now: datetime, limit: int = 50) -> list[Deployment]:
    """Expire every open command past its TTL; the deployments failed by it."""
    failed = []
    for command in await store.lock_expired(conn, now=now, limit=limit):
        deployment = await expire(conn, command, now=now)
        if deployment is not None:
            failed.append(deployment)
    return failed


@dataclass(frozen=True, kw_only=True)
class Claimed:
    command: AgentCommand
    attempt: int
    lease_expires_at: datetime


@dataclass(frozen=True, kw_only=True)
class ClaimOutcome:
    claimed: Claimed | None
    #: Deployments failed on the way (their commands had expired).
    failed: list[Deployment]


async def claim_next(
    conn: AsyncConnection, org_id: str, runner_id: str, *, now: datetime, lease: timedelta
) -> ClaimOutcome:
    """Lease the runner's next command: the oldest open one, if it is deliverable now.

    One command per runner is out at a time, so commands are delivered in order and never to two agents
    at once. A head that expired is expired (failing its deployment), one whose deployment is final is
    cancelled, and the next one is looked at.
    """
    failed: list[Deployment] = []
    for _ in range(_MAX_SKIPPED_HEADS):
        command = await store.lock_head(conn, org_id, runner_id)
        if command is None:
            break
        if command.expires_at <= now:
            deployment = await expire(conn, command, now=now)
            if deployment is not None:
                failed.append(deployment)
            continue
        deployment = await deployment_store.get(conn, org_id, command.deployment_id)
        if deployment is None or deployment.status != Status.EXECUTING:
            await store.close(
                conn, command.id, state=CommandState.CANCELLED, now=now, reason="the deployment is final"
            )
            continue
        if command.available_at > now:
            # Leased to an agent, or waiting out a retry delay: the runner's queue waits with it.
            break
        until = now + lease
        attempt = command.attempt + 1
        await store.lease(conn, command.id, attempt=attempt, until=until, now=now)
        return ClaimOutcome(
            claimed=Claimed(command=command, attempt=attempt, lease_expires_at=until), failed=failed
        )
    return ClaimOutcome(claimed=None, failed=failed)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A delivery of a command: its ``attempt``, until ``expires_at``."""

    command_id: str
    org_id: str
    runner_id: str
    attempt: int
    expires_at: datetime


async def hand_back(conn: AsyncConnection, leases: list[Lease], *, now: datetime) -> list[Lease]:
    """The server is stopping: the commands still leased as these deliveries (no answer came, none was
    delivered again) become deliverable at once instead of after their lease, and their runners' polls
    are told; the leases handed back. A redelivery is harmless: the agent adopts the run it started, and
    its answer to the old attempt is refused (409)."""
    handed_back = []
    for lease in leases:
        if lease.expires_at > now and await store.release_lease(
            conn, lease.command_id, attempt=lease.attempt, now=now
        ):
            handed_back.append(lease)
    for org_id, runner_id in sorted({(lease.org_id, lease.runner_id) for lease in handed_back}):
        await store.announce(conn, org_id, runner_id)
    return handed_back


async def leased_command(
    conn: AsyncConnection, org_id: str, runner_id: str, command_id: str, *, attempt: int
) -> AgentCommand:
    """The command an agent answers for, locked; ConflictError unless its lease ``attempt`` still holds."""
    command = await store.get(conn, command_id, for_update=True)
    if command is None or command.org_id != org_id or command.runner_id != runner_id:
        raise NotFoundError(f"command '{command_id}' not found")
    if command.attempt != attempt:
        raise ConflictError(f"command '{command_id}' was delivered again since (attempt {command.attempt})")
    return command


def _closed_as(command: AgentCommand, state: CommandState) -> bool:
    """True if the command is closed already and this answer changes nothing: a repeat, or a command
    cancelled because its deployment is final; ConflictError if the answer contradicts its state."""
    if command.state in store.OPEN_STATES:
        if command.state == CommandState.PENDING:
            raise ConflictError(f"command '{command.id}' is not leased (its lease ran out)")
        return False
    if command.state in (state, CommandState.CANCELLED):
        return True
    raise ConflictError(f"command '{command.id}' is {command.state}")


async def ack(conn: AsyncConnection, command: AgentCommand, *, now: datetime) -> None:
    if _closed_as(command, CommandState.ACKED):
        return
    await store.close(conn, command.id, state=CommandState.ACKED, now=now)
    await store.announce(conn, command.org_id, command.runner_id)  # the next command may go out now


async def retry(conn: AsyncConnection, command: AgentCommand, *, delay: timedelta, now: datetime) -> None:
    if command.state != CommandState.LEASED:
        raise ConflictError(f"command '{command.id}' is {command.state}, not leased")
    await store.reschedule(conn, command.id, available_at=now + delay, now=now)
    if not delay:
        await store.announce(conn, command.org_id, command.runner_id)


async def reject(
    conn: AsyncConnection, command: AgentCommand, *, reason: str, now: datetime
) -> Deployment | None:
    """Dead-letter the command and fail its deployment with the reason; the deployment if this failed it.
    A rejected ``cancel-job`` (an agent that cannot cancel: upstream's knows only ``create-job``) fails
    nothing: the run goes on and reports, and the deployment's message says so."""
    if _closed_as(command, CommandState.REJECTED):
        return None
    await store.close(conn, command.id, state=CommandState.REJECTED, now=now, reason=reason)
    await store.announce(conn, command.org_id, command.runner_id)
    if command.type == protocol.CommandType.CANCEL_JOB:
        log.warning("the runner agent rejected a cancel", command_id=command.id, reason=reason)
        await deployment_store.set_status_message(
            conn,
            command.deployment_id,
            f"Cancelling: the runner agent cannot stop the run (it rejected the cancel: {reason[:500]}); "
            "the deployment ends cancelled when its run ends",
            now=now,
        )
        return None
    deployment = await deployment_store.get(conn, command.org_id, command.deployment_id, for_update=True)
    if deployment is None:
        return None
    message = f"the runner agent rejected the command: {reason}"
    # A rejected create-job: the agent started no runner.
    failed = await results_policy.fail(
        conn, deployment, message, now=now, code="COMMAND_REJECTED", before_start=True
    )
    return deployment if failed else None


# --- events ---------------------------------------------------------------------------------------------


def _payload(model: type[BaseModel], event: protocol.EventEnvelope) -> Any:
    try:
        return model.model_validate(event.payload)
    except ValidationError as exc:
        found = problems.of(exc, prefix="payload.")
        raise InvalidInputError(f"invalid {event.type} event", details={"errors": found}) from exc


def check_event(event: protocol.EventEnvelope) -> Any:
    """The event's payload, validated for its type (before any database work)."""
    models: dict[protocol.EventType, type[BaseModel]] = {
        protocol.EventType.JOB_CREATED: protocol.JobCreatedPayload,
        protocol.EventType.RUNNER_ERROR: protocol.RunnerErrorPayload,
        protocol.EventType.LOG_OBJECT_READY: protocol.LogObjectReadyPayload,
    }
    if event.type is protocol.EventType.DEPLOYMENT_RESULT:
        try:
            return DeploymentResults.model_validate(event.payload)
        except ValidationError as exc:
            raise InvalidInputError("invalid deployment-result event") from exc
    return _payload(models[event.type], event)


async def apply_event(
    conn: AsyncConnection, event: protocol.EventEnvelope, payload: Any, *, now: datetime
) -> Deployment | None:
    """Apply an agent's event exactly once (the inbox row and its effect commit together); the deployment
    if the event finished it."""
    deployment_id = _deployment_uuid(event.deployment_id)
    deployment = await deployment_store.get(conn, event.organization_id, deployment_id, for_update=True)
    if deployment is None or deployment.runner_id != event.runner_id:
        raise NotFoundError(f"deployment '{event.deployment_id}' not found")
    first = await store.record_event(
        conn,
        org_id=event.organization_id,
        runner_id=event.runner_id,
        event_id=event.event_id,
        event_type=event.type,
        deployment_id=deployment_id,
        now=now,
    )
    if not first:
        return None
    context = {**deployment.log_context(), "runner_id": event.runner_id, "event_id": event.event_id}
    if isinstance(payload, protocol.JobCreatedPayload):
        await store.record_job_created(conn, deployment_id, job_id=payload.job_id, now=now)
        log.info("agent created the job", job_id=payload.job_id, **context)
        return None
    if isinstance(payload, protocol.RunnerErrorPayload):
        if payload.retryable:
            log.warning(
                "agent reported a retryable error", code=payload.code, error=payload.message, **context
            )
            return None
        message = f"runner error {payload.code}: {payload.message}"
        # The command stays as it is: the agent rejects it next (recording why); one never answered is
        # cancelled when it comes up again, its deployment being final.
        failed = await results_policy.fail(conn, deployment, message, now=now, code=payload.code)
        return deployment if failed else None
    if isinstance(payload, DeploymentResults):
        applied = await results_policy.apply_results(conn, deployment, payload, now=now)
        return deployment if applied else None
    log.info("agent reported a log object", key=payload.key, size=payload.size, **context)
    return None


def _deployment_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise NotFoundError(f"deployment '{value}' not found") from exc
