"""The dispatcher: launches runners for new deployments and watches them until they report.

Runs inside ``orchestrator serve``. Work is claimed with leases in the database, so several replicas on one
PostgreSQL share it safely, and a restarted server picks up whatever was pending or launched.

Agent runners (``kubernetes-agent``, ``vm`` with ``connection: {type: agent}``) are launched by their agent:
here "launch" is enqueueing a ``create-job`` command in the transaction that marks the deployment launched
(handle ``agent:<command id>``), and checks only enforce the deployment timeout; commands past their TTL
fail their deployment with ``COMMAND_EXPIRED``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.blobs import BlobStore
from orchestrator.dispatch import agent_commands as agent_policy
from orchestrator.dispatch import errored_states
from orchestrator.dispatch import results as results_policy
from orchestrator.domain.deployments import TIMEOUT_MESSAGE, Deployment, DispatchState, runner_mode
from orchestrator.domain.runner_secrets import restore_secrets
from orchestrator.domain.runner_types import launched_by
from orchestrator.errors import OrchestratorError
from orchestrator.gateway import tokens
from orchestrator.launchers.base import KeepsUnsavedState, Launcher, LaunchError, RunState, UnsavedState
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from orchestrator.secretbox import SecretBox
from orchestrator.store import agent_commands as command_store
from orchestrator.store import db
from orchestrator.store import deployments as store
from orchestrator.store import runners as runner_store

log = structlog.get_logger(__name__)

#: Picks the launcher for a runner (type, full configuration); None when this server cannot launch it.
LauncherFor = Callable[[str, dict[str, object]], Launcher | None]
#: Told (org, runner) after a command for an agent runner was committed: wakes the agent's long poll.
CommandCommitted = Callable[[str, str], None]


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
    cancel_grace_seconds: float = 10.0
    #: How long an agent runner's command waits to be picked up (upstream RUNNER_COMMAND_TTL, 24 h).
    command_ttl_seconds: float = 24 * 3600.0


class Dispatcher:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        box: SecretBox,
        blobs: BlobStore,
        token_key: bytes,
        gateway_url: str,
        launcher_for: LauncherFor,
        on_final: Callable[[str], None],
        settings: DispatchSettings | None = None,
        on_command: CommandCommitted | None = None,
    ) -> None:
        self.engine = engine
        self.box = box
        self.blobs = blobs
        self.token_key = token_key
        self.gateway_url = gateway_url
        self.launcher_for = launcher_for
        self.on_final = on_final
        self.settings = settings or DispatchSettings()
        self.on_command = on_command
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Look for work now (a deployment was just committed)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and the loop goes on."""
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

    async def run_once(self) -> None:
        now = datetime.now(UTC)
        lease = timedelta(seconds=self.settings.lease_seconds)
        # Cheap reads first: a round with nothing to do takes no write transaction (on SQLite the one
        # writer is shared with the API and the gateway's command claims).
        async with db.readonly(self.engine).connect() as conn:
            pending_due = await store.has_pending(conn, now=now)
            checks_due = await store.has_checks_due(conn, now=now)
            expiry_due = await command_store.has_expired(conn, now=now)
        if pending_due:
            async with self.engine.begin() as conn:
                pending = await store.claim_pending(
                    conn, owner=self.owner, now=now, lease=lease, limit=self.settings.batch_size
                )
            if pending:
                await asyncio.gather(*(self._launch(d) for d in pending))
        if checks_due:
            async with self.engine.begin() as conn:
                due = await store.claim_checks(
                    conn, owner=self.owner, now=now, lease=lease, limit=self.settings.batch_size
                )
            if due:
                await asyncio.gather(*(self._check(d) for d in due))
        if expiry_due:
            async with self.engine.begin() as conn:
                expired = await agent_policy.expire_due(conn, now=now, limit=self.settings.batch_size)
            for deployment in expired:
                log.info("agent command expired", deployment_id=str(deployment.id))
                self.on_final(str(deployment.id))

    async def _release(self, deployment: Deployment, **values: object) -> None:
        async with self.engine.begin() as conn:
            await store.release(conn, deployment.id, owner=self.owner, now=datetime.now(UTC), **values)

    async def _fail(self, deployment: Deployment, message: str, *, code: str) -> None:
        async with self.engine.begin() as conn:
            await results_policy.fail(conn, deployment, message, now=datetime.now(UTC), code=code)
            await store.release(conn, deployment.id, owner=self.owner, now=datetime.now(UTC))
            await command_store.cancel_for_deployment(
                conn, deployment.id, now=datetime.now(UTC), reason=f"the deployment failed ({code})"
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
        secrets = (
            json.loads(self.box.open(sealed, context=f"runner:{deployment.org_id}/{runner.id}"))
            if sealed
            else {}
        )
        configuration = restore_secrets(runner.configuration, secrets)
        agent = launched_by(runner.type, configuration) == "agent"
        launcher = None if agent else self.launcher_for(runner.type, configuration)
        if launcher is None and not agent:
            return f"runner '{runner.id}' of type '{runner.type}' cannot be launched by this orchestrator"
        spec = RunSpec(
            org_id=deployment.org_id,
            runner_id=deployment.runner_id,
            deployment_id=str(deployment.id),
            env_uuid=str(deployment.env_uuid),
            mode=RunnerMode(runner_mode(deployment.mode, deployment.plan_only)),
            token=SecretStr(tokens.deployment_token(self.token_key, deployment.org_id, str(deployment.id))),
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
        if self.on_command is not None:
            self.on_command(deployment.org_id, deployment.runner_id)
        log.info("agent command enqueued", deployment_id=str(deployment.id), command_id=envelope.command_id)

    async def _launch(self, deployment: Deployment) -> None:
        found = await self._spec(deployment)
        if isinstance(found, str):
            await self._fail(deployment, found, code="RUNNER_UNAVAILABLE")
            return
        if found.launcher is None:
            await self._enqueue(deployment, found)
            return
        spec, launcher = found.spec, found.launcher
        attempts = deployment.dispatch_attempts + 1
        try:
            handle = await launcher.launch(spec)
        except LaunchError as exc:
            if not exc.retryable or attempts >= self.settings.launch_attempts:
                await self._fail(
                    deployment, f"the runner could not be launched: {exc.message}", code="LAUNCH_FAILED"
                )
                return
            log.warning("launch failed, will retry", deployment_id=str(deployment.id), error=exc.message)
            backoff = timedelta(seconds=min(60.0, 2.0**attempts))
            async with self.engine.begin() as conn:
                await store.release(
                    conn,
                    deployment.id,
                    owner=self.owner,
                    now=datetime.now(UTC),
                    dispatch_attempts=attempts,
                )
                # Keep it leased to nobody until the backoff has passed.
                await store.lease_until(conn, deployment.id, datetime.now(UTC) + backoff)
            return
        now = datetime.now(UTC)
        await self._release(
            deployment,
            dispatch_state=DispatchState.LAUNCHED,
            handle=handle,
            launched_at=now,
            dispatch_attempts=attempts,
            next_check_at=now + timedelta(seconds=self.settings.check_interval_seconds),
        )
        log.info("runner launched", deployment_id=str(deployment.id), handle=handle)

    async def _check_agent_run(self, deployment: Deployment) -> None:
        """Agent runs are never polled: only the deployment timeout is enforced here."""
        if deployment.timeout_at <= datetime.now(UTC):
            await self._fail(deployment, TIMEOUT_MESSAGE, code="TIMEOUT")
            return
        await self._release(deployment, next_check_at=deployment.timeout_at)

    async def _check(self, deployment: Deployment) -> None:
        if agent_policy.is_agent_handle(deployment.handle):
            await self._check_agent_run(deployment)
            return
        found = await self._spec(deployment)
        launcher = None if isinstance(found, str) else found.launcher
        now = datetime.now(UTC)
        if deployment.timeout_at <= now:
            # Fail first, then stop the run: what the stopped runner still reports changes nothing.
            await self._fail(deployment, TIMEOUT_MESSAGE, code="TIMEOUT")
            if launcher is not None and deployment.handle:
                await launcher.cancel(deployment.handle, grace_seconds=self.settings.cancel_grace_seconds)
            return
        if launcher is None or deployment.handle is None:
            await self._fail(
                deployment, str(found) if isinstance(found, str) else "lost runner", code="RUNNER_LOST"
            )
            return
        status = await launcher.status(deployment.handle)
        interval = timedelta(seconds=self.settings.check_interval_seconds)
        if status.state is not RunState.EXITED:
            await self._release(deployment, next_check_at=now + interval)
            return
        grace = timedelta(seconds=self.settings.exit_grace_seconds)
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
