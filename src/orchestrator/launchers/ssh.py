"""Runs ``po-runner standard`` on a machine over SSH: the ``vm`` runner with ``connection: {type: ssh}``.

The orchestrator connects to ``connection.host``:``port`` as ``connection.username`` with
``connection.private_key`` (asyncssh), and trusts exactly one host key: ``connection.host_public_key``
(``known_hosts=([key], [], [])``). There is no trust on first use, no ``~/.ssh/known_hosts``, no
``~/.ssh/config``, no SSH agent and no other key of the server's user: a host that presents another key
ends the deployment, saying so. Each launch, status check and cancel is one connection.

What runs on the host is in ``launchers.ssh_scripts``: the run is a detached session (``setsid``) in
``<job.work_dir or ~/.po-runs>/<deployment id>/``, which outlives the connection and an orchestrator
restart; the handle (``ssh:<user>@<host>:<port>:<runtime>:<run dir>``) is all a later status check,
cancel or relaunch needs to find it again, with any instance of this launcher. The run's environment
(the runner's variables, ``job.environment``, ``job.secrets``) goes over the channel's stdin: never on a
command line (``ps``), never into a file on the host. The host needs ``po-runner`` on the PATH the run
gets (the login's, or ``job.environment.PATH``), and ``sh``, ``setsid`` and ``/proc`` (Linux).

Errors never hold a secret: every text that comes from the host (the runner's stderr, the engine's
message) has the run's secret values, the deployment token and the private key replaced by
``[secret]`` before it goes into an error or a status.

The server passes its egress policy (``launchers.egress``): every address the host resolves to is checked
against the denied networks when connecting, and the connection goes to the address that was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Final, NoReturn

import asyncssh
import structlog

from orchestrator.domain.runner_types import VmRunnerConfiguration, VmRunnerJob, VmSshConnection
from orchestrator.launchers import images, ssh_scripts
from orchestrator.launchers.base import LaunchError, RunState, RunStatus, UnsavedState, fail
from orchestrator.launchers.egress import EgressDeniedError, EgressPolicy
from orchestrator.launchers.ssh_scripts import Handle
from orchestrator.protocol.launch import RunSpec

__all__ = ["DEFAULT_RUNNER_IMAGE", "SshConnection", "SshLauncher", "redact"]

log = structlog.get_logger(__name__)

#: The image of runtime ``docker`` / ``podman`` when ``job.image`` is not set (validation requires it).
DEFAULT_RUNNER_IMAGE: Final = images.DEFAULT_RUNNER_IMAGE
CONNECT_TIMEOUT_SECONDS: Final = 20.0
#: How long one script (launch, status) may take on the host.
COMMAND_TIMEOUT_SECONDS: Final = 60.0
#: As the local launcher's: what the runner left running gets this long after SIGTERM, before SIGKILL.
REAP_GRACE_SECONDS: Final = 60
MAX_UNSAVED_STATE_BYTES: Final = 64 * 1024 * 1024
#: Secret values shorter than this are not searched for in texts from the host (they would garble them).
MIN_REDACTED_LENGTH: Final = 4
REDACTED: Final = "[secret]"
#: Tasks started by ``forget_unsaved_state`` (a launcher lives for one call; the loop keeps weak refs).
_BACKGROUND: set[asyncio.Task[None]] = set()


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value (and each line of a multi-line one) replaced by ``[secret]``."""
    parts: set[str] = set()
    for secret in secrets:
        parts.add(secret.strip())
        parts.update(line.strip() for line in secret.splitlines())
    for part in sorted((p for p in parts if len(p) >= MIN_REDACTED_LENGTH), key=len, reverse=True):
        text = text.replace(part, REDACTED)
    return text


@dataclass(frozen=True, kw_only=True)
class SshConnection:
    """Where and as whom to connect; the private key is never shown (``repr``)."""

    host: str
    port: int = 22
    username: str
    host_public_key: str
    private_key: str = field(repr=False)
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS

    @classmethod
    def from_connection(cls, connection: VmSshConnection) -> SshConnection:
        return cls(
            host=connection.host,
            port=connection.port,
            username=connection.username,
            host_public_key=connection.host_public_key,
            private_key=connection.private_key,
        )

    @property
    def bare_host(self) -> str:
        """The host without the brackets of an IPv6 literal (``[::1]``)."""
        return self.host[1:-1] if self.host.startswith("[") and self.host.endswith("]") else self.host

    @property
    def where(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"


class SshLauncher:
    """Launcher for one ``vm`` runner reached over SSH (one per launch, status check or cancel: any
    instance finds the runs of the runner from their handles)."""

    def __init__(
        self,
        connection: SshConnection,
        *,
        job: VmRunnerJob | None = None,
        egress: EgressPolicy | None,
        reap_grace_seconds: int = REAP_GRACE_SECONDS,
        command_timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
    ) -> None:
        self.connection = connection
        self.job = job or VmRunnerJob()
        #: What the server may connect to (``launchers.egress``); None: anywhere.
        self.egress = egress
        self.reap_grace_seconds = reap_grace_seconds
        self.command_timeout_seconds = command_timeout_seconds

    @classmethod
    def from_configuration(
        cls, configuration: VmRunnerConfiguration, *, egress: EgressPolicy | None
    ) -> SshLauncher:
        if not isinstance(configuration.connection, VmSshConnection):
            raise ValueError("not a vm runner with an ssh connection")
        return cls(
            SshConnection.from_connection(configuration.connection), job=configuration.job, egress=egress
        )

    # --- plumbing -----------------------------------------------------------------------------------

    def _secrets(self, job: VmRunnerJob, spec: RunSpec | None = None) -> list[str]:
        values = [self.connection.private_key, *job.secrets.values()]
        if spec is not None:
            values.append(spec.token.get_secret_value())
        return values

    async def _addresses(self) -> list[str]:
        """The host's addresses, each checked against the egress policy (a LaunchError if one is denied)."""
        host, port = self.connection.bare_host, self.connection.port
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            fail(f"cannot resolve the SSH host {host}: {exc.strerror or exc}", retryable=True, cause=exc)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if not addresses:
            fail(f"the SSH host {host} resolves to no address", retryable=True)
        if self.egress is not None:
            try:
                for address in addresses:
                    self.egress.check_address(host, address)
            except EgressDeniedError as exc:
                fail(f"the SSH host of this runner is not reachable: {exc.message}", retryable=False)
        return addresses

    def _keys(self) -> tuple[asyncssh.SSHKey, asyncssh.SSHKey]:
        try:
            pinned = asyncssh.import_public_key(self.connection.host_public_key)
        except (asyncssh.KeyImportError, ValueError) as exc:
            fail(
                "the runner's connection.host_public_key is not an SSH public key", retryable=False, cause=exc
            )
        try:
            key = asyncssh.import_private_key(self.connection.private_key)
        except (asyncssh.KeyImportError, ValueError) as exc:
            # Never the key, nor asyncssh's text about it.
            fail(
                "the runner's connection.private_key is not an unencrypted SSH private key",
                retryable=False,
                cause=exc,
            )
        return pinned, key

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """A connection that trusts only the pinned host key and offers only the runner's private key;
        every failure a LaunchError naming its cause (``retryable`` False when retrying cannot help)."""
        pinned, key = self._keys()
        addresses = await self._addresses()
        where = self.connection.where
        last: BaseException | None = None
        for address in addresses:
            try:
                conn = await asyncssh.connect(
                    address,
                    self.connection.port,
                    username=self.connection.username,
                    known_hosts=([pinned], [], []),
                    x509_trusted_certs=None,
                    client_keys=[key],
                    client_host_keys=None,
                    agent_path=None,
                    config=[],
                    preferred_auth="publickey",
                    password_auth=False,
                    kbdint_auth=False,
                    gss_auth=False,
                    gss_kex=False,
                    connect_timeout=self.connection.connect_timeout_seconds,
                    keepalive_interval=15,
                )
            except asyncssh.HostKeyNotVerifiable as exc:
                await self._host_key_mismatch(address, pinned, exc)
            except asyncssh.PermissionDenied as exc:
                fail(
                    f"{where} refused the runner's connection.private_key: public key authentication "
                    f"failed (is its public key in ~{self.connection.username}/.ssh/authorized_keys?)",
                    retryable=False,
                    cause=exc,
                )
            except (ConnectionRefusedError, TimeoutError) as exc:
                last = exc
                continue
            except (OSError, asyncssh.Error) as exc:
                # A host whose key is not of the pinned key's algorithm ends the key exchange (a reset
                # connection, or one lost): what it presents tells a mismatch from a broken connection.
                offered = await self._offered_key(address)
                if offered is not None and offered != pinned:
                    await self._host_key_mismatch(address, pinned, exc, offered=offered)
                last = exc
                continue
            try:
                yield conn
            finally:
                conn.close()
                with contextlib.suppress(Exception):
                    await conn.wait_closed()
            return
        assert last is not None
        fail(f"cannot connect to {where} over SSH: {_describe(last)}", retryable=True, cause=last)

    async def _offered_key(self, address: str) -> asyncssh.SSHKey | None:
        """The host key the server presents to any client (for the message of a mismatch)."""
        try:
            return await asyncio.wait_for(
                asyncssh.get_server_host_key(address, self.connection.port, config=[]),
                self.connection.connect_timeout_seconds,
            )
        except (OSError, TimeoutError, asyncssh.Error):
            return None

    async def _host_key_mismatch(
        self,
        address: str,
        pinned: asyncssh.SSHKey,
        cause: BaseException,
        *,
        offered: asyncssh.SSHKey | None = None,
    ) -> NoReturn:
        offered = offered or await self._offered_key(address)
        presented = (
            f"it presents {offered.get_algorithm()} {offered.get_fingerprint()}"
            if offered is not None
            else "it presents another key"
        )
        fail(
            f"the SSH host key of {self.connection.host}:{self.connection.port} does not match the runner's "
            f"connection.host_public_key ({pinned.get_algorithm()} {pinned.get_fingerprint()}; {presented}): "
            "the orchestrator does not connect (update connection.host_public_key if the host's key "
            "changed on purpose)",
            retryable=False,
            cause=cause,
        )

    async def _run(
        self,
        conn: asyncssh.SSHClientConnection,
        script: str,
        *args: str,
        stdin: str = "",
        timeout_seconds: float | None = None,
    ) -> asyncssh.SSHCompletedProcess:
        try:
            return await conn.run(
                ssh_scripts.command(script, *args),
                input=stdin,
                check=False,
                timeout=timeout_seconds or self.command_timeout_seconds,
            )
        except (TimeoutError, asyncssh.TimeoutError) as exc:
            fail(f"a command on {self.connection.where} did not finish in time", retryable=True, cause=exc)
        except (OSError, asyncssh.Error) as exc:
            fail(
                f"the SSH connection to {self.connection.where} broke: {_describe(exc)}",
                retryable=True,
                cause=exc,
            )

    # --- Launcher -------------------------------------------------------------------------------------

    async def launch(self, spec: RunSpec) -> str:
        job = _job(spec.runner_configuration.get("job"), spec.runner_id)
        environment = {**job.environment, **job.secrets, **spec.runner_environment()}
        bad = ssh_scripts.check_names(environment)
        if bad:
            fail(
                f"job.environment or job.secrets of runner '{spec.runner_id}' set "
                f"{', '.join(sorted(bad))}, which runs over SSH cannot get (names starting with "
                f"'{ssh_scripts.RESERVED_PREFIX}' and IFS are the launch script's own)",
                retryable=False,
            )
        base = job.work_dir or ""
        if job.runtime == "process":
            script = ssh_scripts.PROCESS_LAUNCH_SCRIPT
            args = [base, spec.deployment_id, str(self.reap_grace_seconds), ssh_scripts.RUN_SCRIPT]
        else:
            script = ssh_scripts.CONTAINER_LAUNCH_SCRIPT
            image = job.image or DEFAULT_RUNNER_IMAGE
            args = [base, spec.deployment_id, job.runtime, image, *sorted(environment)]
        secrets = self._secrets(job, spec)
        async with self._connect() as conn:
            done = await self._run(conn, script, *args, stdin=ssh_scripts.environment_script(environment))
        answer = ssh_scripts.parse_launch(done.stdout if isinstance(done.stdout, str) else "")
        if answer is None:
            stderr = redact(str(done.stderr or "").strip(), secrets)
            last = stderr.splitlines()[-1] if stderr else f"exit code {done.exit_status}"
            fail(
                f"the launch script did not run on {self.connection.where}: {last} (its login shell must "
                "run `sh -c`)",
                retryable=False,
            )
        handle = Handle(
            username=self.connection.username,
            host=self.connection.host,
            port=self.connection.port,
            runtime=job.runtime,
            run_dir=answer.text,
        )
        if answer.word in ("started", "adopted"):
            if not answer.text.startswith("/") or not answer.text.endswith(f"/{spec.deployment_id}"):
                fail(
                    f"the launch on {self.connection.where} answered an unusable run directory",
                    retryable=False,
                )
            log.info("ssh run " + answer.word, deployment_id=spec.deployment_id, host=self.connection.host)
            return str(handle)
        self._refused(answer, job, secrets)

    def _refused(self, answer: ssh_scripts.LaunchAnswer, job: VmRunnerJob, secrets: list[str]) -> NoReturn:
        where = self.connection.where
        path = job.environment.get("PATH")
        searched = f"job.environment.PATH {path}" if path else "the login's PATH"
        text = redact(answer.text, secrets)
        messages = {
            "no-runner": (
                f"po-runner is not on the PATH of {where} ({searched}): install it there (pip install "
                "platform-orchestrator) or set job.environment.PATH",
                False,
            ),
            "no-setsid": (f"setsid (util-linux) is not on the PATH of {where} ({searched})", False),
            "no-engine": (f"the container engine {text} is not on the PATH of {where} ({searched})", False),
            "no-daemon": (_no_daemon(text, where), False),
            "engine-failed": (f"{job.runtime} run failed on {where}: {text}", True),
            "cannot-create": (f"cannot create the run's directory {text} on {where}", False),
            "unsaved-state": (
                f"the run's directory on {where} holds state Terraform could not save ({text}): it is "
                "kept there until it is recovered",
                False,
            ),
            "not-started": (f"the run did not start on {where}: see {text}/stderr.log", True),
            "bad-environment": (f"the shell on {where} could not read the run's environment", False),
            "no-environment": (f"the run's environment did not reach {where}", True),
        }
        message, retryable = messages.get(
            answer.word, (f"the launch on {where} answered {answer.word}", True)
        )
        fail(message, retryable=retryable)

    def _own(self, handle: Handle) -> str | None:
        """Why the run of ``handle`` is not this launcher's to see (another host or login), or None."""
        if (handle.username, handle.host, handle.port) != (
            self.connection.username,
            self.connection.host,
            self.connection.port,
        ):
            return f"the run is on {handle.username}@{handle.host}:{handle.port}"
        return None

    def _container_environment(self, runtime: str) -> str:
        """What a status check or cancel of a container gets on stdin: the job's (not secret) environment,
        for the engine's client (its PATH, DOCKER_HOST, ...)."""
        if runtime == "process":
            return ""
        usable = {k: v for k, v in self.job.environment.items() if not ssh_scripts.check_names([k])}
        return ssh_scripts.environment_script(usable)

    async def status(self, handle: str) -> RunStatus:
        run = Handle.parse(handle)
        elsewhere = self._own(run)
        if elsewhere is not None:
            return RunStatus(state=RunState.UNKNOWN, detail=elsewhere)
        secrets = self._secrets(self.job)
        try:
            async with self._connect() as conn:
                done = await self._run(
                    conn,
                    ssh_scripts.STATUS_SCRIPT,
                    run.run_dir,
                    run.runtime,
                    run.deployment_id,
                    stdin=self._container_environment(run.runtime),
                )
                answer = ssh_scripts.parse_status(str(done.stdout or ""))
                if answer is None:
                    return RunStatus(
                        state=RunState.UNKNOWN,
                        detail=f"the status check on {self.connection.where} gave no answer",
                    )
                unsaved = await self._unsaved(conn, answer)
        except LaunchError as exc:
            return RunStatus(state=RunState.UNKNOWN, detail=exc.message)
        last = _last_line(redact(answer.stderr_tail, secrets))
        if answer.word in ("running", "leftovers"):
            return RunStatus(state=RunState.RUNNING)
        if answer.word == "no-engine":
            return RunStatus(
                state=RunState.UNKNOWN, detail=f"{run.runtime} is not on the PATH of {self.connection.where}"
            )
        if answer.word == "exited":
            return RunStatus(
                state=RunState.EXITED, exit_code=answer.exit_code, detail=last, unsaved_state=unsaved
            )
        if answer.word == "gone":
            return RunStatus(
                state=RunState.EXITED,
                detail=f"the run's directory {run.run_dir} is gone from {self.connection.host}",
            )
        return RunStatus(
            state=RunState.EXITED, detail=last or "the runner process is gone", unsaved_state=unsaved
        )

    async def _unsaved(
        self, conn: asyncssh.SSHClientConnection, answer: ssh_scripts.RemoteStatus
    ) -> UnsavedState | None:
        """The state file the ended run left on the host, read back (None while it runs, or if too big)."""
        if answer.word in ("running", "leftovers") or answer.unsaved_path is None:
            return None
        if answer.unsaved_size is None or answer.unsaved_size > MAX_UNSAVED_STATE_BYTES:
            return None
        try:
            done = await conn.run(
                ssh_scripts.command(ssh_scripts.READ_SCRIPT, answer.unsaved_path),
                check=False,
                encoding=None,
                timeout=self.command_timeout_seconds,
            )
        except (OSError, TimeoutError, asyncssh.Error):
            return None
        data = done.stdout
        if done.exit_status != 0 or not isinstance(data, bytes):
            return None
        return UnsavedState(path=f"{self.connection.host}:{answer.unsaved_path}", data=data)

    def forget_unsaved_state(self, handle: str) -> None:
        """The run's unsaved state is saved elsewhere now (the orchestrator recovered it): remove it from
        the host, and the run's ``work/`` with it, in the background (a failure leaves it there)."""
        task = asyncio.get_running_loop().create_task(self._forget(handle))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)

    async def _forget(self, handle: str) -> None:
        run = Handle.parse(handle)
        if self._own(run) is not None:
            return
        try:
            async with self._connect() as conn:
                await self._run(conn, ssh_scripts.FORGET_SCRIPT, run.run_dir)
        except LaunchError as exc:
            log.warning("unsaved state left on the host", handle=handle, problem=exc.message)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        """SIGTERM the run (its leader passes it on to the runner once), SIGKILL what is left of it after
        the grace period; a container: ``<engine> stop -t GRACE``. A run already gone is fine."""
        run = Handle.parse(handle)
        if self._own(run) is not None:
            return
        grace = max(0, round(grace_seconds))
        async with self._connect() as conn:
            await self._run(
                conn,
                ssh_scripts.CANCEL_SCRIPT,
                run.run_dir,
                run.runtime,
                run.deployment_id,
                str(grace),
                stdin=self._container_environment(run.runtime),
                timeout_seconds=grace + self.command_timeout_seconds,
            )


def _job(data: object, runner_id: str) -> VmRunnerJob:
    try:
        return VmRunnerJob.model_validate(data or {})
    except ValueError as exc:
        # Without the input: the job holds secrets.
        fail(f"invalid job configuration of runner '{runner_id}'", retryable=False, cause=exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def _last_line(text: str) -> str | None:
    lines = text.strip().splitlines()
    return lines[-1] if lines else None


def _no_daemon(text: str, where: str) -> str:
    """The message of the launch script's ``no-daemon ADDRESS STDERR`` answer."""
    address, _, said = text.partition(" ")
    said = said.strip()
    return f"no container engine answers at {address} on {where}" + (f": {said}" if said else "")
