"""The dispatcher: launches runners for new deployments and watches them until they report.

Runs inside ``orchestrator serve``. Work is claimed with leases in the database, so several replicas on one
PostgreSQL share it safely, and a restarted server picks up whatever was pending or launched.

Agent runners (``kubernetes-agent``, ``vm`` with ``connection: {type: agent}``) are launched by their agent:
here "launch" is enqueueing a ``create-job`` command in the transaction that marks the deployment launched
(handle ``agent:<command id>``), and checks only enforce the deployment timeout; commands past their TTL
fail their deployment with ``COMMAND_EXPIRED``.

Faults stay with their deployment: whatever one launch or check raises is caught, logged with the
deployment id, and never stops the round for the others.

- Launching: a transient fault (the database or object store unavailable, a retryable ``LaunchError``) is
  retried with backoff; anything else (the runner's secrets do not open with the server key, a runs
  directory that cannot be written, a bug) fails the deployment with a message naming the cause, which
  releases its environment. Nothing runs yet, so nothing is lost by failing.
- Checking: a failing status call or runner lookup is retried at the next check (the run may be alive and
  still report its results); the deployment timeout is applied before anything that can fail, so every
  executing deployment ends by its ``timeout_at`` whatever its launcher does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy.exc
import structlog
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator import deployment_tokens, metrics
from orchestrator.blobs import BlobStore
from orchestrator.dispatch import agent_commands as agent_policy
from orchestrator.dispatch import errored_states, live_logs
from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import (
    EXECUTING_MESSAGE,
    TIMEOUT_MESSAGE,
    Deployment,
    DispatchState,
    queued_message,
    runner_mode,
    with_launch_note,
)
from orchestrator.domain.managed import MANAGED_RUNNER_ID, is_managed_handle
from orchestrator.domain.runner_secrets import restore_secrets
from orchestrator.domain.runner_types import launched_by
from orchestrator.errors import OrchestratorError, SealedValueError, ServiceUnavailableError
from orchestrator.launchers.availability import LauncherUnavailableError
from orchestrator.launchers.base import (
    BoundedRuns,
    KeepsUnsavedState,
    Launcher,
    LaunchError,
    LaunchTarget,
    RunState,
    RunStatus,
    UnsavedState,
    launched,
)
from orchestrator.notify import sleep_unless_stopped
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.log_stream import Phase
from orchestrator.protocol.results import RunnerMode
from orchestrator.secretbox import SecretBox
from orchestrator.store import agent_commands as command_store
from orchestrator.store import db
from orchestrator.store import deployments as store
from orchestrator.store import runners as runner_store

log = structlog.get_logger(__name__)

#: Picks the launcher for a runner (its org, id, type and full configuration); LauncherUnavailableError
#: saying why when this server cannot launch it (None says it without a reason).
LauncherFor = Callable[[LaunchTarget], Launcher | None]
#: Told (org, runner) after a command for an agent runner was committed: wakes the agent's long poll.
CommandCommitted = Callable[[str, str], None]


def transient(exc: BaseException) -> bool:
    """Whether retrying later can help: a dependency that is down now (database, object store, a pool
    with no free connection), or a launch error that says so."""
    if isinstance(exc, LaunchError):
        return exc.retryable
    if isinstance(exc, ServiceUnavailableError):
        return exc.retryable
    return isinstance(exc, sqlalchemy.exc.TimeoutError)


def describe(exc: BaseException, *, error_id: str) -> str:
    """What failed, for a status message that deployment viewers read: the messages of our errors and of
    OS errors say it without secrets; anything else is a bug, named by its class and an error id that
    the server log's line (with the traceback) carries too."""
    if isinstance(exc, OrchestratorError):
        return exc.message
    if isinstance(exc, OSError):
        reason = exc.strerror or type(exc).__name__
        return f"{reason}: {exc.filename}" if exc.filename else reason
    return f"unexpected {type(exc).__name__} (error id {error_id}; the server log has the details)"


def _launched(deployment: Deployment, runner_type: str, now: datetime) -> None:
    """Observe the dispatch latency: from the deployment's creation to its launch."""
    metrics.DISPATCH_LATENCY.labels(runner_type).observe(
        max(0.0, (now - deployment.created_at).total_seconds())
    )


@dataclass(eq=False, kw_only=True)
class _Round:
    """A round's run slots: free slots per host (its handle prefix), counted once from the database and
    taken by each launch of the round; the deployments left waiting, per status message."""

    free: dict[str, int] = field(default_factory=dict)
    queued: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _LeaseLostError(Exception):
    """Another dispatcher took the deployment over meanwhile."""


@dataclass(frozen=True, kw_only=True)
class _Target:
    spec: RunSpec
    runner_type: str
    #: None for agent runners: their agent launches the run.
    launcher: Launcher | None


@dataclass(frozen=True, kw_only=True)
class DispatchSettings:
    poll_interval_seconds: float = 1.0
    check_interval_seconds: float = 5.0
    #: How long a run may be gone without results before its deployment fails (results may be in flight).
    exit_grace_seconds: float = 5.0
    lease_seconds: float = 60.0
    launch_attempts: int = 5
    batch_size: int = 20
    #: How long a stopped run's runner gets after SIGTERM before SIGKILL (PO_CANCEL_GRACE_SECONDS).
    cancel_grace_seconds: float = 30.0
    #: How long an agent runner's command waits to be picked up (upstream RUNNER_COMMAND_TTL, 24 h).
    command_ttl_seconds: float = 24 * 3600.0
    #: State versions kept per environment when a recovered errored state is stored (PO_STATE_VERSIONS_KEPT).
    state_versions_kept: int = 100


@dataclass(eq=False, repr=False, kw_only=True)
class Dispatcher:
    engine: AsyncEngine
    box: SecretBox
    blobs: BlobStore
    token_key: bytes
    gateway_url: str
    launcher_for: LauncherFor
    on_final: Callable[[str], None]
    settings: DispatchSettings = field(default_factory=DispatchSettings)
    on_command: CommandCommitted | None = None
    owner: str = field(
        init=False, default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _round: _Round = field(init=False, default_factory=_Round)
    #: (org, runner) -> (handle prefix, limit) of runners whose launcher bounds its runs, as last seen.
    _bounded: dict[tuple[str, str], tuple[str, int]] = field(init=False, default_factory=dict)
    #: Steps (launches, checks) running now: the heartbeat renews leases only while there are some.
    _in_flight: int = field(init=False, default=0)
    #: The runs a check round found still running: their leases end together, in one transaction (on
    #: SQLite the one writer is shared with the gateway: a live log's chunks wait for it).
    _still_running: list[uuid.UUID] = field(init=False, default_factory=list)

    def wake(self) -> None:
        """Look for work now (a deployment was just committed)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and the loop goes on."""
        heartbeat = asyncio.create_task(self._heartbeat(stop), name="dispatch-lease-heartbeat")
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                except Exception:
                    log.exception("dispatch round failed", owner=self.owner)
                try:
                    await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_seconds)
                except TimeoutError:
                    pass
                self._wake.clear()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """While steps are in flight, renew this server's leases every third of a lease: a step may take
        longer than a lease (a slow launch), and a dead server's leases run out one lease after its last
        heartbeat, so the lease can stay short and a replica takes over soon."""
        interval = self.settings.lease_seconds / 3
        while not await sleep_unless_stopped(stop, interval):
            if not self._in_flight:
                continue
            try:
                now = datetime.now(UTC)
                async with self.engine.begin() as conn:
                    await store.renew_leases(
                        conn, owner=self.owner, now=now, lease=timedelta(seconds=self.settings.lease_seconds)
                    )
            except Exception:
                log.exception("dispatch lease heartbeat failed", owner=self.owner)

    async def run_once(self) -> None:
        now = datetime.now(UTC)
        lease = timedelta(seconds=self.settings.lease_seconds)
        # Cheap reads first: a round with nothing to do takes no write transaction (on SQLite the one
        # writer is shared with the API and the gateway's command claims).
        async with db.readonly(self.engine).connect() as conn:
            pending_due, checks_due, expiry_due = await store.work_due(
                conn, now=now, also=[command_store.expired_exists(now)]
            )
        if pending_due:
            async with self.engine.begin() as conn:
                pending = await store.claim_pending(
                    conn, owner=self.owner, now=now, lease=lease, limit=self.settings.batch_size
                )
            if pending:
                self._round = _Round()
                await asyncio.gather(*(self._guarded(self._launch, d) for d in pending))
                await self._release_queued(self._round)
        if checks_due:
            async with self.engine.begin() as conn:
                due = await store.claim_checks(
                    conn, owner=self.owner, now=now, lease=lease, limit=self.settings.batch_size
                )
            if due:
                self._still_running = []
                await asyncio.gather(*(self._guarded(self._check, d) for d in due))
                await self._release_still_running()
        if expiry_due:
            async with self.engine.begin() as conn:
                expired = await agent_policy.expire_due(conn, now=now, limit=self.settings.batch_size)
            metrics.AGENT_COMMANDS_EXPIRED.inc(len(expired))
            for deployment in expired:
                log.info("agent command expired", **deployment.log_context())
                self.on_final(str(deployment.id))

    async def _guarded(self, step: Callable[[Deployment], Awaitable[None]], deployment: Deployment) -> None:
        """Run one deployment's step; what escapes it is logged and ends there. Its lease runs out and
        the next round takes the deployment up again (a database that was down is back by then)."""
        # Each step runs in its own task (gather): the ids are bound for its lines, the launcher's included.
        structlog.contextvars.bind_contextvars(**deployment.log_context())
        self._in_flight += 1
        try:
            await step(deployment)
        except Exception:
            log.exception("dispatch step failed", step=step.__name__)
        finally:
            self._in_flight -= 1

    async def _release_still_running(self) -> None:
        """End the leases of the runs this round found running; they are checked again an interval on. A
        fault here leaves the leases to run out: the next round after them checks those runs again."""
        running, self._still_running = self._still_running, []
        if not running:
            return
        now = datetime.now(UTC)
        try:
            async with self.engine.begin() as conn:
                await store.release_many(
                    conn,
                    running,
                    owner=self.owner,
                    now=now,
                    next_check_at=now + timedelta(seconds=self.settings.check_interval_seconds),
                )
        except Exception:
            log.exception("dispatch: releasing the checked runs failed", runs=len(running))

    async def _release(self, deployment: Deployment, **values: object) -> None:
        async with self.engine.begin() as conn:
            await store.release(conn, deployment.id, owner=self.owner, now=datetime.now(UTC), **values)

    async def _fail(
        self, deployment: Deployment, message: str, *, code: str, before_start: bool = False
    ) -> None:
        now = datetime.now(UTC)
        async with self.engine.begin() as conn:
            await results_policy.fail(
                conn, deployment, message, now=now, code=code, before_start=before_start
            )
            await store.release(conn, deployment.id, owner=self.owner, now=now)
            await command_store.cancel_for_deployment(
                conn, deployment.id, now=now, reason=f"the deployment failed ({code})"
            )
        log.info("deployment failed", deployment_id=str(deployment.id), reason=message)
        self.on_final(str(deployment.id))

    async def _spec(self, deployment: Deployment) -> _Target | str:
        """The run spec and launcher, or why there is none."""
        async with db.readonly(self.engine).connect() as conn:
            runner = await runner_store.get_runner(conn, deployment.org_id, deployment.runner_id)
            sealed = await runner_store.get_runner_secret(conn, deployment.org_id, deployment.runner_id)
        if runner is None:
            return f"runner '{deployment.runner_id}' no longer exists"
        try:
            secrets = (
                json.loads(self.box.open(sealed, context=f"runner:{deployment.org_id}/{runner.id}"))
                if sealed
                else {}
            )
        except SealedValueError:
            return (
                f"the secrets of runner '{runner.id}' do not open with the server key (they were sealed "
                "under another key): send every secret value of the runner again (octl update runner)"
            )
        configuration = restore_secrets(runner.configuration, secrets)
        agent = launched_by(runner.type, configuration) == "agent"
        try:
            launcher = (
                None
                if agent
                else self.launcher_for(
                    LaunchTarget(
                        org_id=deployment.org_id,
                        runner_id=runner.id,
                        runner_type=runner.type,
                        configuration=configuration,
                    )
                )
            )
        except LauncherUnavailableError as exc:
            # The message GET runner shows in its status (launchers.availability).
            return f"runner '{runner.id}': {exc.message}"
        if launcher is None and not agent:
            return f"runner '{runner.id}' of type '{runner.type}' cannot be launched by this orchestrator"
        spec = RunSpec(
            org_id=deployment.org_id,
            runner_id=deployment.runner_id,
            deployment_id=str(deployment.id),
            env_uuid=str(deployment.env_uuid),
            mode=RunnerMode(runner_mode(deployment.mode, deployment.plan_only)),
            token=SecretStr(
                deployment_tokens.deployment_token(self.token_key, deployment.org_id, str(deployment.id))
            ),
            gateway_url=self.gateway_url,
            encrypting_key=deployment.encrypted_outputs_recipient,
            encrypting_logs_key=deployment.encrypted_logs_recipient,
            log_level=deployment.runner_log_level,
            runner_configuration=configuration,
        )
        return _Target(spec=spec, runner_type=runner.type, launcher=launcher)

    async def _enqueue(self, deployment: Deployment, target: _Target) -> None:
        """Launch on an agent runner: the command and the launched deployment commit together."""
        now = datetime.now(UTC)
        envelope = agent_policy.envelope_for(
            deployment,
            target.spec,
            runner_type=target.runner_type,
            now=now,
            ttl=timedelta(seconds=self.settings.command_ttl_seconds),
        )
        handle = agent_policy.handle_for(envelope.command_id)
        try:
            async with self.engine.begin() as conn:
                await agent_policy.enqueue(conn, envelope, now=now)
                await live_logs.record_phase(conn, deployment, Phase.LAUNCHING, now=now)
                released = await store.release(
                    conn,
                    deployment.id,
                    owner=self.owner,
                    now=now,
                    dispatch_state=DispatchState.LAUNCHED,
                    handle=handle,
                    launched_at=now,
                    dispatch_attempts=deployment.dispatch_attempts + 1,
                    # Event-driven from here: the only check due is the deployment timeout.
                    next_check_at=deployment.timeout_at,
                )
                if not released:
                    raise _LeaseLostError()
        except _LeaseLostError:
            log.warning("lost the dispatch lease before enqueueing", deployment_id=str(deployment.id))
            return
        metrics.AGENT_COMMANDS_QUEUED.inc()
        _launched(deployment, target.runner_type, now)
        if self.on_command is not None:
            self.on_command(deployment.org_id, deployment.runner_id)
        log.info("agent command enqueued", deployment_id=str(deployment.id), command_id=envelope.command_id)

    async def _take_slot(self, deployment: Deployment, prefix: str, limit: int) -> bool:
        """Whether the deployment may launch now: a launcher of bounded runs (local) has a free slot on
        its host, counted from the database (launched, executing deployments: so the queue is the pending
        rows themselves and survives a restart) and taken. Rounds run one after another and a round's
        launches are released as launched before the next begins, so counts never miss one in flight
        (several servers on one host each count all of its runs, and may each take the last slot)."""
        round_ = self._round
        async with round_.lock:
            free = round_.free.get(prefix)
            if free is None:
                async with db.readonly(self.engine).connect() as conn:
                    free = limit - await store.count_launched(conn, handle_prefix=prefix)
            if free <= 0:
                round_.free[prefix] = 0
                host = prefix.split(":")[1] if prefix.count(":") >= 2 else prefix
                round_.queued.setdefault(queued_message(limit, host), []).append(deployment.id)
                return False
            round_.free[prefix] = free - 1
            return True

    async def _release_queued(self, round_: _Round) -> None:
        """Release the round's deployments that found no run slot: pending, claimable at the next round
        (a finished run wakes the dispatcher), their status message saying they are queued."""
        for message, ids in round_.queued.items():
            async with self.engine.begin() as conn:
                await store.release_queued(
                    conn, ids, owner=self.owner, now=datetime.now(UTC), message=message
                )
            log.debug("deployments queued for a run slot", count=len(ids))

    async def _launch(self, deployment: Deployment) -> None:
        if deployment.runner_id == MANAGED_RUNNER_ID:
            # Never launched here: a managed runner claims it (dispatch.managed).
            await self._release(deployment, dispatch_state=DispatchState.QUEUED)
            return
        if deployment.timeout_at <= datetime.now(UTC):
            metrics.LAUNCH_FAILURES.labels("timeout").inc()
            await self._fail(deployment, TIMEOUT_MESSAGE, code="TIMEOUT", before_start=True)
            return
        attempts = deployment.dispatch_attempts + 1
        # A runner whose runs are bounded (seen at an earlier launch) takes its slot before anything is
        # read: a queued deployment costs its round nothing but the slot count.
        runner_key = (deployment.org_id, deployment.runner_id)
        known = self._bounded.get(runner_key)
        if known is not None and not await self._take_slot(deployment, *known):
            return
        try:
            found = await self._spec(deployment)
            if isinstance(found, str):
                metrics.LAUNCH_FAILURES.labels("runner_unavailable").inc()
                await self._fail(deployment, found, code="RUNNER_UNAVAILABLE", before_start=True)
                return
            if found.launcher is None:
                await self._enqueue(deployment, found)
                return
            bounded = found.launcher.run_slots() if isinstance(found.launcher, BoundedRuns) else None
            if bounded is None:
                self._bounded.pop(runner_key, None)
            elif known != bounded:
                self._bounded[runner_key] = bounded
                if known is None and not await self._take_slot(deployment, *bounded):
                    return
            # Recorded before the launch: the runner's own phases may arrive before the launch returns.
            async with self.engine.begin() as conn:
                await live_logs.record_phase(conn, deployment, Phase.LAUNCHING, now=datetime.now(UTC))
            started = launched(await found.launcher.launch(found.spec))
        except LaunchError as exc:
            if not exc.retryable or attempts >= self.settings.launch_attempts:
                metrics.LAUNCH_FAILURES.labels("launch_error").inc()
                await self._fail(
                    deployment,
                    f"the runner could not be launched: {exc.message}",
                    code="LAUNCH_FAILED",
                    before_start=True,
                )
                return
            metrics.LAUNCH_FAILURES.labels("launch_error_retried").inc()
            log.warning("launch failed, will retry", deployment_id=str(deployment.id), error=exc.message)
            await self._retry_later(deployment, attempts)
            return
        except Exception as exc:
            if transient(exc):
                # Not counted against launch_attempts: the dependency may take a while to come back;
                # the deployment timeout bounds the wait.
                metrics.LAUNCH_FAILURES.labels("dependency_unavailable").inc()
                log.warning(
                    "launch interrupted, will retry", deployment_id=str(deployment.id), error=str(exc)
                )
                await self._retry_later(deployment, attempts)
                return
            error_id = uuid.uuid4().hex[:16]
            metrics.LAUNCH_FAILURES.labels("internal_error").inc()
            log.error("launch failed", deployment_id=str(deployment.id), error_id=error_id, exc_info=exc)
            await self._fail(
                deployment,
                f"the runner could not be launched: {describe(exc, error_id=error_id)}",
                code="LAUNCH_FAILED",
                before_start=True,
            )
            return
        now = datetime.now(UTC)
        # The launcher's note is told while the deployment executes, and kept for its final message.
        note = started.note[:1000] if started.note else None
        await self._release(
            deployment,
            dispatch_state=DispatchState.LAUNCHED,
            handle=started.handle,
            launched_at=now,
            dispatch_attempts=attempts,
            next_check_at=now + timedelta(seconds=self.settings.check_interval_seconds),
            # Also the message of a deployment that waited queued for a run slot.
            status_message=with_launch_note(EXECUTING_MESSAGE, note),
            **({"launch_note": note} if note else {}),
        )
        _launched(deployment, found.runner_type, now)
        log.info("runner launched", deployment_id=str(deployment.id), handle=started.handle, note=note)

    async def _retry_later(self, deployment: Deployment, attempts: int) -> None:
        """Hold the deployment back from claims for a backoff (never past its timeout), then launch again."""
        now = datetime.now(UTC)
        until = min(now + timedelta(seconds=min(60.0, 2.0**attempts)), deployment.timeout_at)
        async with self.engine.begin() as conn:
            await store.release(conn, deployment.id, owner=self.owner, now=now, dispatch_attempts=attempts)
            # Leased to nobody until the backoff has passed.
            await store.lease_until(conn, deployment.id, until)

    async def _check(self, deployment: Deployment) -> None:
        if deployment.timeout_at <= datetime.now(UTC):
            # First, and depending on nothing that can fail: fail, then stop the run (what the stopped
            # runner still reports changes nothing).
            await self._fail(deployment, TIMEOUT_MESSAGE, code="TIMEOUT")
            await self._cancel(deployment)
            return
        if deployment.cancel_requested_at is not None and deployment.cancel_sent_at is None:
            await self._stop_cancelled(deployment)
            return
        if agent_policy.is_agent_handle(deployment.handle) or is_managed_handle(deployment.handle):
            # Agent and managed runs are never polled: only the deployment timeout is enforced here.
            await self._release(deployment, next_check_at=deployment.timeout_at)
            return
        try:
            found = await self._spec(deployment)
            if isinstance(found, str) or found.launcher is None or deployment.handle is None:
                reason = found if isinstance(found, str) else "lost runner"
                await self._fail(deployment, reason, code="RUNNER_LOST")
                return
            status = await found.launcher.status(deployment.handle)
        except Exception as exc:
            # The run may be alive and still report its results: check again later; the timeout above
            # ends the deployment if the checks keep failing.
            log.warning(
                "status check failed, will check again",
                deployment_id=str(deployment.id),
                error=str(exc),
                exc_info=not transient(exc),
            )
            retry_at = datetime.now(UTC) + timedelta(seconds=self.settings.check_interval_seconds)
            await self._release(deployment, next_check_at=min(retry_at, deployment.timeout_at))
            return
        await self._observe(deployment, found.launcher, status)

    async def _observe(self, deployment: Deployment, launcher: Launcher, status: RunStatus) -> None:
        """Act on a launched run's status: wait while it runs; after it exited, give its results a grace
        period to arrive, then fail the deployment."""
        if status.state is not RunState.EXITED:
            self._still_running.append(deployment.id)  # released with the round's others
            return
        now = datetime.now(UTC)
        grace = timedelta(seconds=self.settings.exit_grace_seconds)
        if deployment.cancel_sent_at is not None:
            # A stopped run may look gone (a deleted Job, a stopped task) while its runner still stops
            # Terraform, saves the state and reports: it has the cancel's grace to do so.
            grace = max(grace, timedelta(seconds=self.settings.cancel_grace_seconds))
        if deployment.exited_at is None:
            await self._release(deployment, exited_at=now, next_check_at=now + grace)
            return
        if now - deployment.exited_at < grace:
            await self._release(deployment, next_check_at=deployment.exited_at + grace)
            return
        code = "" if status.exit_code is None else f" with code {status.exit_code}"
        detail = f": {status.detail}" if status.detail else ""
        message = f"the runner exited{code} without reporting results{detail}"
        if status.unsaved_state is not None:
            message += await self._recover(deployment, launcher, status.unsaved_state)
        await self._fail(deployment, message, code="RUNNER_EXITED")

    async def _recover(self, deployment: Deployment, launcher: Launcher, state: UnsavedState) -> str:
        """The run died leaving state Terraform could not save (``errored.tfstate``) before its runner
        handed it over: recover it here; the words for the deployment's message."""
        try:
            receipt = await errored_states.recover(
                self.engine,
                box=self.box,
                blobs=self.blobs,
                deployment=deployment,
                data=state.data,
                now=datetime.now(UTC),
                keep=self.settings.state_versions_kept,
            )
        except OrchestratorError as exc:
            log.error("unsaved state not recovered", deployment_id=str(deployment.id), path=state.path)
            return (
                f"; Terraform left state it could not save in {state.path}, which the orchestrator could "
                f"not recover ({exc.message}): it stays there, push it with `terraform state push`"
            )
        log.warning("unsaved state recovered", deployment_id=str(deployment.id), outcome=receipt.outcome)
        if isinstance(launcher, KeepsUnsavedState) and deployment.handle:
            launcher.forget_unsaved_state(deployment.handle)
        return (
            f"; Terraform could not save its state and left it in {state.path}; "
            f"the orchestrator recovered it: {receipt.message}"
        )

    async def _stop_cancelled(self, deployment: Deployment) -> None:
        """A cancel was asked for: stop the run once (recorded first, so no other round asks again); the
        checks that follow see it end, and whatever ends it ends it ``cancelled`` (``dispatch.cancel``)."""
        now = datetime.now(UTC)
        await self._release(deployment, cancel_sent_at=now, next_check_at=now)
        log.info("cancel: stopping the run", deployment_id=str(deployment.id), handle=deployment.handle)
        if deployment.handle is not None and agent_policy.is_agent_handle(deployment.handle):
            async with self.engine.begin() as conn:
                published = await agent_policy.publish_cancel(
                    conn,
                    deployment,
                    now=now,
                    grace_seconds=self.settings.cancel_grace_seconds,
                    ttl=timedelta(seconds=self.settings.command_ttl_seconds),
                )
            if published and self.on_command is not None:
                self.on_command(deployment.org_id, deployment.runner_id)
            if not published:
                self.on_final(str(deployment.id))
        elif deployment.handle is not None and is_managed_handle(deployment.handle):
            # The managed runner learns it from its next heartbeat's answer (``cancel: true``) and stops
            # its po-runner itself.
            log.info(
                "cancel: the managed runner is told at its next heartbeat", deployment_id=str(deployment.id)
            )
        else:
            await self._cancel(deployment)
        self.wake()

    async def _cancel(self, deployment: Deployment) -> None:
        """Stop a deployment's run (failed, timed out or cancelled), if this server launched one; a failure
        is only logged."""
        if (
            deployment.handle is None
            or agent_policy.is_agent_handle(deployment.handle)
            or is_managed_handle(deployment.handle)
        ):
            return
        try:
            found = await self._spec(deployment)
            if not isinstance(found, str) and found.launcher is not None:
                await found.launcher.cancel(
                    deployment.handle, grace_seconds=self.settings.cancel_grace_seconds
                )
        except Exception:
            log.exception(
                "could not stop the run", deployment_id=str(deployment.id), handle=deployment.handle
            )
