"""The agent loop (upstream ``remote_executor.go``):

1. long-poll ``commands/next``; gateway unreachable (no answer, 429, 5xx, a 4xx) → back off
   ``2^min(n,6)`` s with jitter and try again, forever; a 401 is logged loudly (the gateway does not know
   this key for this runner) and retried the same way;
2. validate the envelope (protocol version, org, runner, expiry, type): an expired command → terminal
   ``runner-error`` ``COMMAND_EXPIRED`` + reject; anything else invalid → reject;
3. launch the run (idempotent per deployment: a redelivered command adopts the run already started);
4. success → event ``job-created`` → ack;
5. a ``kubernetes-agent`` run is then watched in the background: after ``K8S_RUNNER_POD_SCHEDULING_DELAY``
   its Job/pod is checked every ``AGENT_POD_WATCH_INTERVAL_SECONDS`` (for at most
   ``AGENT_POD_WATCH_MAX_SECONDS``); a pod still pending with Warning events → terminal ``runner-error``
   ``REMOTE_RUNNER`` with the warnings, and the Job is deleted (it must not start after the deployment
   failed). When it starts, the agent looks for the runner Jobs it launched that have not started yet
   (``AgentLaunchers.cluster``) and watches them again, the remaining delay counted from each Job's
   creation; the runner-error has the event id a watch before the restart would have used (the command
   id is the Job's pod template annotation), so the gateway applies it once;
6. a permanent launch error, or a transient one at delivery ``max_attempts`` → terminal ``runner-error``
   ``REMOTE_RUNNER`` + reject; a transient one → retryable ``runner-error`` + retry after ``2^attempt`` s
   (at most 60).

Answers (events, ack, retry, reject) are retried briefly on transient failures; if they still fail, the
lease runs out and the gateway delivers the command again, which step 3 makes harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import structlog

from orchestrator.agent import metrics
from orchestrator.agent.client import AgentClient
from orchestrator.agent.kubernetes import job_with_agent_additions, stuck_detail
from orchestrator.agent.launchers import AgentLaunchers
from orchestrator.agent.settings import AgentSettings
from orchestrator.client.errors import AuthError, ClientError
from orchestrator.client.http import Backoff
from orchestrator.launchers.base import Launcher, LaunchError, RunState, launched
from orchestrator.protocol import commands as protocol
from orchestrator.protocol.launch import RunSpec

log = structlog.get_logger("po-runner.agent")

#: Attempts of one answer (event, ack, ...) before leaving it to the lease.
ANSWER_ATTEMPTS = 4


class Outcome(StrEnum):
    ACKED = "acked"
    RETRIED = "retried"
    REJECTED = "rejected"
    #: The answer did not reach the gateway; the command comes back after its lease.
    UNANSWERED = "unanswered"


@dataclass(frozen=True)
class ResumedCommand:
    """The command of a run launched before this agent started (found in the cluster, not delivered)."""

    command_id: str
    organization_id: str
    runner_id: str
    deployment_id: str


#: What events about a command need (its id, organization, runner and deployment).
Command = protocol.CommandEnvelope | ResumedCommand


def backoff_seconds(failures: int, *, cap: float, rng: random.Random | None = None) -> float:
    """``2^min(n,6)`` s capped at ``cap``, with jitter: a random point in its upper half."""
    return Backoff(first_seconds=2.0, max_seconds=cap, max_doublings=5, jitter=True).delay(failures, rng)


@dataclass
class Agent:
    settings: AgentSettings
    client: AgentClient
    launchers: AgentLaunchers
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    #: Background watches of launched Kubernetes runs, by command id.
    watches: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)
    #: Finding the runs launched before this agent started, to watch them again.
    resuming: asyncio.Task[None] | None = field(default=None, init=False)
    #: The runs this agent launched, by deployment id: what a ``cancel-job`` stops.
    runs: dict[str, tuple[Launcher, str]] = field(default_factory=dict, init=False)
    #: Runs being stopped (``cancel-job``), by deployment id.
    stopping: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and handle commands until ``stop`` is set."""
        failures = 0
        log.info("agent started", org_id=self.settings.org_id, runner_id=self.settings.runner_id)
        self.resuming = asyncio.create_task(self.resume_watches())
        while not stop.is_set():
            try:
                delivered = await self._next_or_stop(stop)
            except AuthError as exc:
                failures += 1
                metrics.POLLS.labels("unauthorized").inc()
                log.error(
                    "THE RUNNER GATEWAY REJECTS THIS AGENT'S CREDENTIALS: check ORG_ID, RUNNER_ID and that "
                    "PRIVATE_KEY matches the public key registered on the runner",
                    status=exc.status_code,
                    org_id=self.settings.org_id,
                    runner_id=self.settings.runner_id,
                )
                await self._pause(failures, stop)
                continue
            except ClientError as exc:
                failures += 1
                metrics.POLLS.labels("error").inc()
                log.warning("runner gateway unreachable", error=exc.message, failures=failures)
                await self._pause(failures, stop)
                continue
            failures = 0
            if delivered is not None:
                metrics.POLLS.labels("command").inc()
                await self.handle(delivered)
            elif not stop.is_set():
                metrics.POLLS.labels("empty").inc()
        await self.stop_watching()
        log.info("agent stopped")

    async def resume_watches(self) -> None:
        """Watch again the runs launched before this agent started whose pods have not started yet; a
        cluster that cannot be asked is asked again with backoff (unless asking again cannot help)."""
        cluster = self.launchers.cluster
        if cluster is None:
            return
        failures = 0
        while True:
            try:
                runs = await cluster.unstarted_runs(self.settings.org_id, self.settings.runner_id)
                launcher = cluster.launcher() if runs else None
                break
            except LaunchError as exc:
                failures += 1
                if not exc.retryable:
                    log.info("not looking for runs launched before the restart", reason=exc.message)
                    return
                log.warning("cannot look for runs launched before the restart", error=exc.message)
                await self.sleep(backoff_seconds(failures, cap=self.settings.agent_max_backoff_seconds))
        for run in runs:
            assert launcher is not None
            command = ResumedCommand(
                command_id=run.command_id,
                organization_id=self.settings.org_id,
                runner_id=self.settings.runner_id,
                deployment_id=run.deployment_id,
            )
            log.info(
                "watching a run launched before the restart", command_id=run.command_id, handle=run.handle
            )
            self._watch(launcher, run.handle, command, run.job_id, age_seconds=run.age_seconds)

    async def stop_watching(self) -> None:
        if self.resuming is not None:
            self.resuming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.resuming
        watches = list(self.watches.values())
        for task in watches:
            task.cancel()
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Runs being stopped are stopped to the end (each within its grace period).
        await asyncio.gather(*self.stopping.values(), return_exceptions=True)

    async def _next_or_stop(self, stop: asyncio.Event) -> protocol.NextCommand | None:
        poll = asyncio.ensure_future(self.client.next_command())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not poll.done():
            poll.cancel()
            return None
        return poll.result()

    async def _pause(self, failures: int, stop: asyncio.Event) -> None:
        delay = backoff_seconds(failures, cap=self.settings.agent_max_backoff_seconds)
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass

    async def handle(self, delivered: protocol.NextCommand) -> Outcome:
        """Steps 2-5 for one delivered command."""
        envelope = delivered.command
        # The command's lines, and those of the run's watch (a task made here), carry its deployment's ids.
        with structlog.contextvars.bound_contextvars(
            org_id=envelope.organization_id, deployment_id=envelope.deployment_id
        ):
            return await self._handle(delivered)

    async def _handle(self, delivered: protocol.NextCommand) -> Outcome:
        envelope = delivered.command
        context = {"command_id": envelope.command_id, "attempt": delivered.attempt}
        metrics.COMMANDS_RECEIVED.inc()
        if envelope.type == protocol.CommandType.CANCEL_JOB:
            return await self._cancel_job(delivered)
        try:
            payload = protocol.check_envelope(
                envelope,
                org_id=self.settings.org_id,
                runner_id=self.settings.runner_id,
                now=datetime.now(UTC),
            )
        except protocol.EnvelopeError as exc:
            log.warning("command refused", code=exc.code, reason=exc.reason, **context)
            metrics.COMMANDS_REFUSED.inc()
            if exc.code == protocol.COMMAND_EXPIRED_CODE:
                await self._runner_error(envelope, None, exc.code, exc.reason, retryable=False)
            return await self._answer("reject", envelope, delivered, reason=f"{exc.code}: {exc.reason}")
        try:
            launcher = self.launchers.for_command(payload)
            started = launched(await launcher.launch(self._run_spec(envelope, payload)))
            handle = started.handle
        except LaunchError as exc:
            return await self._launch_failed(delivered, payload, exc.message, retryable=exc.retryable)
        except Exception as exc:  # an unexpected failure of the launcher: worth another delivery
            log.exception("launch failed unexpectedly", **context)
            return await self._launch_failed(delivered, payload, f"unexpected error: {exc}", retryable=True)
        log.info("job launched", job_id=payload.job_id, handle=handle, note=started.note, **context)
        self.runs[envelope.deployment_id] = (launcher, handle)
        metrics.RUNS_LAUNCHED.labels("kubernetes" if self.launchers.watches_start(payload) else "local").inc()
        created = protocol.EventEnvelope(
            protocol_version=protocol.PROTOCOL_VERSION,
            event_id=protocol.event_id(envelope.command_id, protocol.EventType.JOB_CREATED),
            type=protocol.EventType.JOB_CREATED,
            organization_id=envelope.organization_id,
            runner_id=envelope.runner_id,
            deployment_id=envelope.deployment_id,
            created_at=datetime.now(UTC),
            payload={
                "job_id": payload.job_id,
                **({"namespace": payload.namespace} if payload.namespace else {}),
            },
        )
        if not await self._deliver(lambda: self.client.send_event(created), "job-created event", context):
            return Outcome.UNANSWERED
        outcome = await self._answer("ack", envelope, delivered)
        if outcome is Outcome.ACKED and self.launchers.watches_start(payload):
            self._watch(launcher, handle, envelope, payload.job_id)
        return outcome

    async def _cancel_job(self, delivered: protocol.NextCommand) -> Outcome:
        """``cancel-job``: ack, then stop the run in the background (its runner gets SIGTERM, interrupts
        Terraform once, reports; killed after the grace period), so other commands are not held up. A
        run this agent does not know of (it is over, or another agent's) is fine: nothing to stop."""
        envelope = delivered.command
        context = {"command_id": envelope.command_id, "attempt": delivered.attempt}
        try:
            payload = protocol.check_cancel_envelope(
                envelope,
                org_id=self.settings.org_id,
                runner_id=self.settings.runner_id,
                now=datetime.now(UTC),
            )
        except protocol.EnvelopeError as exc:
            log.warning("command refused", code=exc.code, reason=exc.reason, **context)
            metrics.COMMANDS_REFUSED.inc()
            return await self._answer("reject", envelope, delivered, reason=f"{exc.code}: {exc.reason}")
        found = self._run_of(envelope.deployment_id, payload)
        outcome = await self._answer("ack", envelope, delivered)
        if found is None:
            log.info("cancel: no run of this deployment here", **context)
            return outcome
        launcher, handle = found
        running = self.stopping.get(envelope.deployment_id)
        if running is None or running.done():
            log.info(
                "cancel: stopping the run", handle=handle, grace_seconds=payload.grace_seconds, **context
            )
            task = asyncio.create_task(self._stop_run(launcher, handle, payload.grace_seconds, context))
            self.stopping[envelope.deployment_id] = task
            task.add_done_callback(lambda _: self.stopping.pop(envelope.deployment_id, None))
        return outcome

    def _run_of(self, deployment_id: str, payload: protocol.CancelJobPayload) -> tuple[Launcher, str] | None:
        """The launcher and handle of a deployment's run: as launched by this agent, else found where a
        launch puts it (a local run's pid file; a Kubernetes Job named after the job id)."""
        known = self.runs.pop(deployment_id, None)
        if known is not None:
            return known
        if payload.runner_type == "vm":
            with contextlib.suppress(OSError):
                handle = (self.launchers.local.runs_dir / deployment_id / "runner.pid").read_text().strip()
                if handle:
                    return self.launchers.local, handle
            return None
        if (
            payload.runner_type == "kubernetes-agent"
            and self.launchers.cluster is not None
            and payload.namespace
        ):
            return self.launchers.cluster.launcher(), f"k8s:{payload.namespace}:{payload.job_id}"
        return None

    async def _stop_run(
        self, launcher: Launcher, handle: str, grace_seconds: float, context: dict[str, Any]
    ) -> None:
        try:
            await launcher.cancel(handle, grace_seconds=grace_seconds)
        except Exception as exc:  # logged: the deployment still ends (its runner's results, or the timeout)
            log.error("cancel: could not stop the run", handle=handle, error=str(exc), **context)
        else:
            log.info("cancel: run stopped", handle=handle, **context)

    def _run_spec(self, envelope: protocol.CommandEnvelope, payload: protocol.CreateJobPayload) -> RunSpec:
        """The run with the agent's additions: local runs get the CA file path in their environment;
        Kubernetes Jobs the CA's PEM text on the runner's container and the command id as an annotation."""
        description, environment = payload.spec, None
        if self.launchers.local_environment(payload):
            environment = self.settings.runner_environment(
                other_user=self.launchers.local.run_user is not None
            )
        elif self.launchers.watches_start(payload):
            job = job_with_agent_additions(
                description.job,
                command_id=envelope.command_id,
                environment=self.settings.kubernetes_runner_environment(),
            )
            description = description.model_copy(update={"job": job})
        return description.to_run_spec(
            self.settings.org_id,
            self.settings.runner_id,
            gateway_url=self.settings.runner_gateway_url,
            environment=environment,
        )

    def _watch(
        self, launcher: Launcher, handle: str, command: Command, job_id: str, *, age_seconds: float = 0.0
    ) -> None:
        command_id = command.command_id
        running = self.watches.get(command_id)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(
            self._watch_start(launcher, handle, command, job_id, age_seconds=age_seconds)
        )
        self.watches[command_id] = task
        metrics.RUNS_WATCHED.inc()
        task.add_done_callback(lambda done: self._watch_done(command_id, done))

    def _watch_done(self, command_id: str, task: asyncio.Task[None]) -> None:
        metrics.RUNS_WATCHED.dec()
        if self.watches.get(command_id) is task:
            del self.watches[command_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("watching the run failed", command_id=command_id, error=repr(task.exception()))

    async def _watch_start(
        self, launcher: Launcher, handle: str, command: Command, job_id: str, *, age_seconds: float = 0.0
    ) -> None:
        """Upstream step 7: after the scheduling delay, until the pod starts (or the watch's end).
        ``age_seconds``: how long ago the run was launched (a watch resumed after a restart); a run past
        the end of its watch is still checked once."""
        context = {"command_id": command.command_id, "handle": handle}
        delay = self.settings.k8s_runner_pod_scheduling_delay
        await self.sleep(max(0.0, delay - age_seconds))
        overdue = max(0.0, age_seconds - delay)
        deadline = time.monotonic() + max(0.0, self.settings.agent_pod_watch_max_seconds - overdue)
        while True:
            status = await launcher.status(handle)
            stuck = stuck_detail(status)
            if stuck is not None:
                log.warning("the runner pod did not start", detail=stuck, **context)
                await self._runner_error(
                    command, job_id, protocol.REMOTE_RUNNER_ERROR_CODE, stuck[:8000], retryable=False
                )
                try:
                    await launcher.cancel(handle, grace_seconds=0)
                except LaunchError as exc:
                    log.warning("could not delete the stuck job", error=exc.message, **context)
                return
            if status.state is RunState.EXITED or (
                status.state is RunState.RUNNING and status.detail is None
            ):
                return  # started (or over): the runner reports for itself
            if time.monotonic() >= deadline:
                log.info("stopped watching a run that has not started", detail=status.detail, **context)
                return
            await self.sleep(self.settings.agent_pod_watch_interval_seconds)

    async def _launch_failed(
        self,
        delivered: protocol.NextCommand,
        payload: protocol.CreateJobPayload,
        message: str,
        *,
        retryable: bool,
    ) -> Outcome:
        envelope = delivered.command
        terminal = not retryable or delivered.attempt >= self.settings.agent_max_attempts
        metrics.LAUNCH_FAILURES.labels("true" if terminal else "false").inc()
        log.warning(
            "launch failed",
            command_id=envelope.command_id,
            attempt=delivered.attempt,
            terminal=terminal,
            error=message,
        )
        await self._runner_error(
            envelope, payload.job_id, protocol.REMOTE_RUNNER_ERROR_CODE, message, retryable=not terminal
        )
        if terminal:
            return await self._answer("reject", envelope, delivered, reason=message)
        delay = min(protocol.MAX_RETRY_DELAY_SECONDS, 2**delivered.attempt)
        return await self._answer("retry", envelope, delivered, delay_seconds=delay)

    async def _runner_error(
        self,
        envelope: Command,
        job_id: str | None,
        code: str,
        message: str,
        *,
        retryable: bool,
    ) -> None:
        event = protocol.EventEnvelope(
            protocol_version=protocol.PROTOCOL_VERSION,
            event_id=protocol.event_id(
                envelope.command_id, protocol.EventType.RUNNER_ERROR, retryable=retryable
            ),
            type=protocol.EventType.RUNNER_ERROR,
            organization_id=envelope.organization_id,
            runner_id=envelope.runner_id,
            deployment_id=envelope.deployment_id,
            created_at=datetime.now(UTC),
            payload={"job_id": job_id, "code": code, "message": message, "retryable": retryable},
        )
        await self._deliver(
            lambda: self.client.send_event(event), "runner-error event", {"command_id": envelope.command_id}
        )

    async def _answer(
        self,
        action: str,
        envelope: protocol.CommandEnvelope,
        delivered: protocol.NextCommand,
        *,
        reason: str = "",
        delay_seconds: int = 0,
    ) -> Outcome:
        command_id, receipt = envelope.command_id, delivered.receipt
        calls: dict[str, tuple[Callable[[], Awaitable[None]], Outcome]] = {
            "ack": (lambda: self.client.ack(command_id, receipt), Outcome.ACKED),
            "retry": (
                lambda: self.client.retry(command_id, receipt, delay_seconds=delay_seconds),
                Outcome.RETRIED,
            ),
            "reject": (lambda: self.client.reject(command_id, receipt, reason=reason), Outcome.REJECTED),
        }
        call, outcome = calls[action]
        context = {"command_id": command_id, "attempt": delivered.attempt}
        if await self._deliver(call, action, context):
            log.info(f"command {outcome}", **context)
            metrics.ANSWERS.labels(action).inc()
            return outcome
        metrics.ANSWERS.labels("unanswered").inc()
        return Outcome.UNANSWERED

    async def _deliver(self, call: Callable[[], Awaitable[None]], what: str, context: dict[str, Any]) -> bool:
        """Send one answer, retrying transient failures briefly; False if it did not get through."""
        for attempt in range(1, ANSWER_ATTEMPTS + 1):
            try:
                await call()
                return True
            except ClientError as exc:
                if not exc.retryable or attempt == ANSWER_ATTEMPTS:
                    log.warning(f"could not send the {what}", error=exc.message, **context)
                    return False
            await self.sleep(backoff_seconds(attempt, cap=8.0))
        return False
