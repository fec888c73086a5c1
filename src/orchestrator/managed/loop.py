"""The managed runner's loop: register, heartbeat, claim, run, report (MANAGED.md's contract).

1. Register on every start (``POST /runner/register`` with the secret, the name and the tags); the answer's
   token is used for every later call, the secret never again.
2. A background task heartbeats every ``heartbeatSeconds`` (``POST /runner/heartbeat``), carrying the
   deployment being run: the server renews its lease.
3. Long-poll ``POST /runner/claim``; per claim, ``po-runner standard`` runs in a fresh work directory
   (``managed.child``), which is removed afterwards, and ``POST /runner/deployments/{id}/finished`` reports
   its exit code. One deployment at a time.

Resilience: no answer, 429 and 5xx on any call are tried again after :class:`Delays` (2 s, doubling to
60 s, jittered; reset after a success). A 401 to ``register`` (wrong secret) or a 404 (managed runners not
enabled) stops the runner with exit code 1 and a message naming the cause; a 401 to a later call (token
not accepted: record replaced or pruned) makes it register again. Registering again while running a
deployment, or a heartbeat's 409, means the server no longer counts the deployment as this runner's
claim: its po-runner is stopped and nothing is reported (the server settles it when the lease ends). A
heartbeat answered ``cancel: true`` (the deployment was cancelled): po-runner gets SIGTERM at once (it
interrupts Terraform, which saves its state, and reports), SIGKILL after ``cancelGraceSeconds``, and its
exit code is reported.

Stopping (``stop`` set: SIGTERM/SIGINT): no more claims; a running po-runner may finish within
``RUNNER_STOP_GRACE_SECONDS``, then gets SIGTERM (it reports the deployment as failed) and, after
``RUNNER_KILL_GRACE_SECONDS``, SIGKILL; ``hurry`` (a second signal) skips the first wait. Exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

import structlog

from orchestrator.client.errors import ClientError
from orchestrator.client.http import Backoff
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids, sweep
from orchestrator.managed import child as children
from orchestrator.managed.client import (
    Claim,
    ClaimConflictError,
    ManagedClient,
    NotEnabledError,
    SecretRefusedError,
    Timing,
    TokenRefusedError,
)
from orchestrator.managed.settings import ManagedSettings

log = structlog.get_logger("po-runner.managed")
T = TypeVar("T")

#: How often to heartbeat before the server said (``heartbeatSeconds``).
DEFAULT_HEARTBEAT_SECONDS: Final = 15.0
#: Attempts of the ``finished`` report once the runner is stopping (else: until it goes through).
REPORT_ATTEMPTS_WHEN_STOPPING: Final = 3
#: Exit codes of ``po-runner managed``.
EXIT_STOPPED: Final = 0
EXIT_REFUSED: Final = 1


@dataclass
class Delays:
    """Waits between failed attempts: attempt ``n``'s ceiling is ``first_seconds`` doubled ``n - 1`` times,
    at most ``max_seconds``; the wait is a uniformly random point between ``first_seconds`` and that
    ceiling (full jitter, so runners that lost the server together do not come back together). A success
    resets it (:meth:`reset`)."""

    first_seconds: float = 2.0
    max_seconds: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def ceiling(self, attempt: int) -> float:
        return Backoff(first_seconds=self.first_seconds, max_seconds=self.max_seconds).delay(attempt)

    def next(self) -> float:
        self.failures += 1
        return self.rng.uniform(self.first_seconds, self.ceiling(self.failures))

    def reset(self) -> None:
        self.failures = 0


class RefusedError(Exception):
    """A definite answer that stops the runner (exit code 1): ``message`` names the cause."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _StoppedError(Exception):
    """``stop`` was set while waiting."""


def _refusal(exc: ClientError) -> RefusedError | None:
    """The stop an answer means, if it means one."""
    if isinstance(exc, SecretRefusedError):
        return RefusedError(
            "the orchestrator refused the managed runner secret: RUNNER_MANAGED_SECRET is not the server's "
            f"MANAGED_RUNNER_SECRET ({exc.message})"
        )
    if isinstance(exc, NotEnabledError):
        return RefusedError(
            "managed runners are not enabled on the orchestrator at RUNNER_URL (it needs "
            f"MANAGED_RUNNER_SECRET) ({exc.message})"
        )
    return None


@dataclass(kw_only=True)
class ManagedRunner:
    """One managed runner process. ``sleep`` makes every wait but the heartbeat interval (backoff, stop
    graces), ``tick`` the heartbeat interval: tests inject both."""

    settings: ManagedSettings
    client: ManagedClient
    tags: list[str]
    argv: Sequence[str] = field(default_factory=children.standard_argv)
    sink: TextIO = field(default_factory=lambda: sys.stderr)
    path: str | None = field(default_factory=lambda: os.environ.get("PATH"))
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    tick: Callable[[float], Awaitable[Any]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    #: Set on a second signal: a running po-runner gets SIGTERM at once.
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    #: A uid of its own for each deployment's po-runner (runner as root), else None: the runner's own.
    uids: RunUids | None = None
    #: A cgroup v2 of its own for each deployment's po-runner, where this host lets the runner make one
    #: (``launchers.run_cgroups``), else None.
    cgroups: RunCgroups | None = None

    _token: str | None = field(default=None, init=False, repr=False)
    _timing: Timing | None = field(default=None, init=False)
    _deployment: str | None = field(default=None, init=False)
    _lost: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    #: Set when a heartbeat's answer says the running deployment was cancelled.
    _cancelled: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _registering: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _refused: RefusedError | None = field(default=None, init=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    #: Registrations so far (the first one included).
    registrations: int = field(default=0, init=False)

    async def run(self, stop: asyncio.Event) -> int:
        """Serve until ``stop`` is set (exit code 0) or a definite refusal (1, logged with its cause)."""
        self._stop = stop
        log.info("managed runner started", name=self.settings.runner_name, tags=self.tags)
        heartbeats = asyncio.create_task(self._heartbeats())
        try:
            await self._serve()
        except RefusedError as exc:
            self._refused = self._refused or exc
        finally:
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
        if self._refused is not None:
            log.error("managed runner stopped", reason=self._refused.message)
            return EXIT_REFUSED
        log.info("managed runner stopped", reason="signal")
        return EXIT_STOPPED

    # Registration and the token.

    async def _registered(self) -> str:
        """This runner's token, registering first when it has none."""
        async with self._registering:
            if self._token is not None:
                return self._token
            try:
                registration = await self.client.register(
                    secret=self.settings.runner_managed_secret.get_secret_value(),
                    name=self.settings.runner_name,
                    tags=self.tags,
                )
            except ClientError as exc:
                refusal = _refusal(exc)
                if refusal is None and not exc.retryable:
                    refusal = RefusedError(f"the orchestrator refused the registration: {exc.message}")
                if refusal is not None:
                    raise refusal from exc
                raise
            self.registrations += 1
            if self._deployment is not None and not self._lost.is_set():
                self._lose("this runner registered again: its earlier record and its claim are gone")
            self._token, self._timing = registration.token, registration
            log.info(
                "registered",
                runner_id=registration.runner_id,
                name=registration.name,
                pool=registration.pool,
                tags=registration.tags,
                lease_seconds=registration.lease_seconds,
                heartbeat_seconds=registration.heartbeat_seconds,
            )
            return registration.token

    def _forget(self, token: str, exc: ClientError) -> None:
        """The server no longer accepts ``token``: the next call registers again."""
        if self._token == token:
            log.warning(
                "the orchestrator no longer accepts this runner's token: registering again", error=exc.message
            )
            self._token = None

    def _settled(self, exc: ClientError, token: str | None) -> bool:
        """What every call made with ``token`` does with an error answer first: a refused token is
        forgotten (True: call again, registering again); a definite refusal (wrong secret, managed runners
        not enabled) raises RefusedError; False: the answer is the caller's to handle."""
        if isinstance(exc, TokenRefusedError):
            if token is not None:
                self._forget(token, exc)
            return True
        refusal = _refusal(exc)
        if refusal is not None:
            raise refusal from exc
        return False

    def _lose(self, reason: str) -> None:
        log.warning(
            "the claim of the running deployment is lost", deployment_id=self._deployment, reason=reason
        )
        self._lost.set()

    # Waiting.

    async def _until_stopped(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, or :class:`_StoppedError` (it is cancelled) when ``stop`` is set first."""
        work = asyncio.ensure_future(awaitable)
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise _StoppedError

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(_StoppedError):
            await self._until_stopped(self.sleep(seconds))

    # The main loop.

    async def _serve(self) -> None:
        delays = Delays(rng=self.rng)
        while not self._stop.is_set() and self._refused is None:
            token: str | None = None
            try:
                token = await self._until_stopped(self._registered())
                claim = await self._until_stopped(self.client.claim(token))
            except _StoppedError:
                return
            except ClientError as exc:
                if self._settled(exc, token):
                    continue
                if exc.status_code == 409 and token is not None:
                    # The server says this runner holds a claim it is not running: a new record drops it.
                    log.warning(
                        "the orchestrator counts a claim this runner does not hold", error=exc.message
                    )
                    self._forget(token, exc)
                    continue
                delay = delays.next()
                log.warning(
                    "the orchestrator is not answering as expected",
                    error=exc.message,
                    retry_in_seconds=round(delay, 1),
                )
                await self._pause(delay)
                continue
            delays.reset()
            if claim is not None:
                await self._run(claim)

    async def _run(self, claim: Claim) -> None:
        deployment = claim.deployment
        # Every line until the exit code is reported is about this deployment (heartbeats included: a task
        # of its own, made before, they do not see this context).
        with structlog.contextvars.bound_contextvars(
            org_id=deployment.org_id,
            project_id=deployment.project_id,
            env_id=deployment.env_id,
            deployment_id=deployment.id,
        ):
            await self._run_claimed(claim)

    async def _run_claimed(self, claim: Claim) -> None:
        deployment = claim.deployment
        self._deployment, self._lost, self._cancelled = deployment.id, asyncio.Event(), asyncio.Event()
        log.info("deployment claimed")
        exit_code = children.NOT_STARTED_EXIT_CODE
        work, uid, cgroup = None, None, None
        try:
            work = await asyncio.to_thread(
                children.make_work_dir, self.settings.runner_work_dir, deployment.id
            )
            if self.uids is not None:
                uid = await asyncio.to_thread(self.uids.take, work)
                await asyncio.to_thread(children.give_work_dir, work, uid)
            env = children.child_environment(
                claim.environment,
                gateway_url=self.settings.gateway_url,
                gateway_ca=self.settings.runner_gateway_ca,
                work=work,
                path=self.path,
            )
            process = await children.start(
                self.argv, env, work, deployment_id=deployment.id, sink=self.sink, uid=uid
            )
            log.info("po-runner started", pid=process.process.pid)
            cgroup = await asyncio.to_thread(self._contain, deployment.id, process.process.pid)
            exit_code = await self._supervise(process)
            log.info("po-runner exited", exit_code=exit_code)
        except OSError as exc:
            log.error("cannot start po-runner", error=str(exc))
        finally:
            if cgroup is not None and self.cgroups is not None:
                # Whatever the run started, in whatever session, as whatever uid.
                await asyncio.to_thread(self.cgroups.kill, cgroup)
            if uid is not None and self.uids is not None:
                # Whatever the run started, in whatever session: gone before its directory goes.
                await asyncio.to_thread(sweep, uid, self.uids.uids)
            if work is not None:
                removed = await asyncio.to_thread(children.remove_tree, work)
                log.info("work directory removed", removed=removed)
            if uid is not None and self.uids is not None:
                await asyncio.to_thread(self.uids.release, uid)
        try:
            await self._report(deployment.id, exit_code)
        finally:
            self._deployment = None

    def _contain(self, deployment_id: str, pid: int) -> Path | None:
        """Move the po-runner just started into a new cgroup of its own (before it starts anything of the
        run's); None without run cgroups or when that fails (the uid sweep is left)."""
        if self.cgroups is None:
            return None
        cgroup: Path | None = None
        try:
            cgroup = self.cgroups.create(f"{deployment_id}.{secrets.token_hex(4)}")
            self.cgroups.enter(cgroup, pid)
        except OSError as exc:
            log.warning("cannot put po-runner into a cgroup of its own", error=exc.strerror or str(exc))
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
            return None
        return cgroup

    async def _supervise(self, process: children.Child) -> int:
        """The child's exit code; stopping, a lost claim or ``hurry`` end it early (SIGTERM, SIGKILL)."""
        waiting = asyncio.create_task(process.wait())
        stopping = asyncio.create_task(self._stop.wait())
        urgent = asyncio.create_task(_first(self._lost.wait(), self.hurry.wait()))
        cancelled = asyncio.create_task(self._cancelled.wait())
        try:
            await asyncio.wait({waiting, stopping, urgent, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            if cancelled.done() and not waiting.done():
                grace = (
                    self._timing.cancel_grace_seconds
                    if self._timing
                    else self.settings.runner_kill_grace_seconds
                )
                log.info("the deployment was cancelled: sending SIGTERM to po-runner", grace_seconds=grace)
                process.signal(signal.SIGTERM)
                killing = asyncio.ensure_future(self.sleep(grace))
                await asyncio.wait({waiting, killing}, return_when=asyncio.FIRST_COMPLETED)
                killing.cancel()
                if not waiting.done():
                    log.warning("sending SIGKILL to po-runner", deployment_id=self._deployment)
                    process.signal(signal.SIGKILL)
                return await waiting
            if not waiting.done() and not urgent.done():
                grace = self.settings.runner_stop_grace_seconds
                log.info(
                    "stopping: the running deployment may finish first",
                    deployment_id=self._deployment,
                    grace_seconds=grace,
                )
                graced = asyncio.ensure_future(self.sleep(grace))
                await asyncio.wait({waiting, urgent, graced}, return_when=asyncio.FIRST_COMPLETED)
                graced.cancel()
            if not waiting.done():
                log.warning("sending SIGTERM to po-runner", deployment_id=self._deployment)
                process.signal(signal.SIGTERM)
                killing = asyncio.ensure_future(self.sleep(self.settings.runner_kill_grace_seconds))
                await asyncio.wait({waiting, killing}, return_when=asyncio.FIRST_COMPLETED)
                killing.cancel()
            if not waiting.done():
                log.warning("sending SIGKILL to po-runner", deployment_id=self._deployment)
                process.signal(signal.SIGKILL)
            return await waiting
        finally:
            for task in (stopping, urgent, cancelled):
                task.cancel()

    async def _report(self, deployment_id: str, exit_code: int) -> None:
        """``finished`` with the exit code, until it goes through; nothing when the claim is lost."""
        delays = Delays(rng=self.rng)
        attempts = 0
        while True:
            if self._lost.is_set():
                log.warning("not reporting the exit code: the claim is lost", deployment_id=deployment_id)
                return
            attempts += 1
            token: str | None = None
            try:
                token = await self._registered()
                await self.client.finished(token, deployment_id, exit_code)
            except ClientError as exc:
                if self._settled(exc, token):
                    continue
                if not exc.retryable:
                    log.error(
                        "the orchestrator refused the report", deployment_id=deployment_id, error=exc.message
                    )
                    return
                if self._stop.is_set() and attempts >= REPORT_ATTEMPTS_WHEN_STOPPING:
                    log.error(
                        "stopping without reporting the exit code",
                        deployment_id=deployment_id,
                        error=exc.message,
                    )
                    return
                delay = delays.next()
                log.warning(
                    "cannot report the exit code yet",
                    deployment_id=deployment_id,
                    error=exc.message,
                    retry_in_seconds=round(delay, 1),
                )
                await self.sleep(delay)
                continue
            log.info("exit code reported", deployment_id=deployment_id, exit_code=exit_code)
            return

    # Heartbeats.

    async def _heartbeats(self) -> None:
        delays = Delays(rng=self.rng)
        wait: float | None = None
        while True:
            interval = float(self._timing.heartbeat_seconds) if self._timing else DEFAULT_HEARTBEAT_SECONDS
            await self.tick(interval if wait is None else wait)
            wait = None
            if self._token is None and self._deployment is None:
                continue  # the main loop registers
            token: str | None = None
            try:
                token = await self._registered()
                held = None if self._lost.is_set() else self._deployment
                self._timing = await self.client.heartbeat(token, held)
                if self._timing.cancel and held is not None and held == self._deployment:
                    self._cancelled.set()
            except TokenRefusedError as exc:
                if token is not None:
                    self._forget(token, exc)
                wait = 0.0
            except ClaimConflictError as exc:
                if self._deployment is not None and not self._lost.is_set():
                    self._lose(f"the orchestrator says so: {exc.message}")
            except RefusedError as exc:
                return self._give_up(exc)
            except ClientError as exc:
                refusal = _refusal(exc)
                if refusal is not None:
                    return self._give_up(refusal)
                # Never less often than the server asks: the lease must not run out while it answers again.
                wait = min(delays.next(), interval)
                log.warning("heartbeat failed", error=exc.message, retry_in_seconds=round(wait, 1))
            else:
                delays.reset()

    def _give_up(self, refusal: RefusedError) -> None:
        self._refused = self._refused or refusal
        self._stop.set()


async def _first(*awaitables: Awaitable[Any]) -> None:
    """Returns when the first of ``awaitables`` does; the others are cancelled."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
