"""``po-runner standard``: run one deployment from its bundle and report back (upstream §5 algorithm).

    download bundle → unpack → require main.tf → version → init
      destroy:   destroy                                          → counts
      plan_only: plan -out plan.tfplan, show -json plan.tfplan    → planned outputs, counts
      deploy:    apply (which plans first), the new state         → outputs, metadata, counts
                 (the orchestrator's state read as Terraform reads it; another backend's with show -json)
    → save an errored.tfstate Terraform left (``runner.state``) → upload the encrypted logs
    → POST the results (always, failures included)

Meanwhile the log is streamed (``runner.log_stream``), in the phases ``init`` (from the start), ``plan``,
``apply`` or ``destroy`` (after the plan's change summary: ``apply`` and ``destroy`` plan first), then
``reporting``; the stream's last chunk is delivered before the logs and the results.

Every failure becomes ``DeploymentResults(status=failure, error=...)``: ``RUNNER`` for the runner's own
steps, ``TF_DIAGNOSTIC_ERROR`` when the engine left an error diagnostic, ``IAC_COMMAND_ERROR`` otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, TextIO

from orchestrator import errors
from orchestrator.client.errors import ClientError
from orchestrator.client.gateway import RunnerGateway
from orchestrator.protocol import age, results
from orchestrator.protocol.log_stream import Phase
from orchestrator.runner import bundle, diagnostics, engine, gateway_client, iac, log_stream, logs, state
from orchestrator.runner.settings import RunnerSettings

#: Where the Job spec mounts its emptyDir; used when writable and IAC_CODE_DIR is not set.
DEFAULT_CODE_DIR = Path("/opt/runner/tofu")
PLAN_FILE = "plan.tfplan"
#: Lines of stderr quoted in an ``IAC_COMMAND_ERROR`` message.
_STDERR_TAIL_LINES = 20
#: The address of the ``http`` backend block the orchestrator compiles (``compiler.backend``).
_HTTP_ADDRESS = re.compile(r'backend\s+"http"\s*\{[^{}]*?\baddress\s*=\s*"([^"\\]+)"', re.S)


class TerminatedError(errors.OrchestratorError):
    """The runner was stopped before the deployment finished."""


class StopSignals:
    """What SIGTERM/SIGINT do to a runner (installed by ``po-runner standard``).

    The first signal while the deployment runs raises :class:`TerminatedError` in the main thread: the
    engine command in progress gets one SIGINT (Terraform stops gracefully, saves its state, releases
    its lock), up to ``RUNNER_STOP_GRACE_SECONDS`` to exit, then SIGKILL; the failure is reported with
    the log so far. Any later signal is only noted (a second interrupt would make Terraform exit at once,
    losing its state), and a signal that arrives while the state is rescued, the logs uploaded or the
    results posted interrupts none of it: those steps finish and the runner exits.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._armed = False

    def handler(self, signum: int, frame: object) -> None:
        if self.received is not None:
            return
        self.received = signal.Signals(signum).name
        if self._armed:
            self._armed = False
            raise TerminatedError(f"received signal {self.received}")

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While the deployment runs: a signal interrupts it (one received before raises at once)."""
        if self.received is not None:
            raise TerminatedError(f"received signal {self.received}")
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def disarmed(self) -> Iterator[None]:
        """A step no signal may cut short (saving state); the deployment stays interruptible after it
        only if no signal came meanwhile."""
        was, self._armed = self._armed, False
        try:
            yield
        finally:
            self._armed = was and self.received is None


#: The runner process's signal state (one deployment per process).
STOP_SIGNALS = StopSignals()


class StepFailedError(errors.OrchestratorError):
    """A step of the deployment failed; ``error`` is what the results report."""

    def __init__(self, error: results.ResultError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What happened: the results, whether the gateway took them, and if not, why."""

    results: results.DeploymentResults
    receipt: gateway_client.ResultsReceipt | None
    problem: str | None = None

    @property
    def exit_code(self) -> int:
        delivered = self.receipt is not None
        return 0 if delivered and self.results.status is results.ResultStatus.SUCCESS else 1


def run_standard(
    settings: RunnerSettings,
    *,
    environ: Mapping[str, str],
    echo: TextIO | None,
    stop: StopSignals | None = None,
) -> Outcome:
    """Run the deployment described by ``settings`` and report it to the gateway.

    ``environ`` is passed (minus secrets) to the IaC engine; ``echo`` receives every log line as it
    happens (the container's stdout). Raises ``ConfigurationError`` only when the gateway itself
    cannot be reached as configured (TLS files); everything else is reported as results.
    """
    token = settings.token.get_secret_value()
    sink = logs.LogBuffer(max_bytes=settings.runner_logs_max_bytes, echo=echo, secrets=[token])
    log = logs.make_logger(
        sink,
        level=settings.log_level,
        org_id=settings.org_id,
        runner_id=settings.runner_id,
        deployment_id=settings.deployment_id,
        mode=settings.mode.value,
        # As the server's lines about the deployment (they carry env_id too, which the runner is not told).
        **({"env_uuid": settings.deployment_env_uuid} if settings.deployment_env_uuid else {}),
    )
    log.info("platform orchestrator runner starting", version=_version())
    with gateway_client.GatewayClient(
        # ConfigurationError here when the CA (file or PEM text) or the mTLS pair are unusable.
        gateway=RunnerGateway.of(settings, timeout_seconds=settings.runner_http_timeout_seconds),
        token=settings.token,
        retry=gateway_client.runner_retry(
            attempts=settings.runner_http_attempts, backoff_seconds=settings.runner_http_backoff_seconds
        ),
        first_contact_seconds=settings.runner_gateway_connect_seconds,
    ) as gateway:
        stream = _open_stream(settings, gateway=gateway, sink=sink, log=log)
        try:
            body = _execute(
                settings, gateway=gateway, sink=sink, log=log, environ=environ, stop=stop, stream=stream
            )
            stream.set_phase(Phase.REPORTING)
            log.info("reporting the deployment", status=body.status.value)
            # The stream first, then the whole log: once the results arrive the deployment is complete, and
            # its logs should be there.
            stream.finish(drain_seconds=_drain_seconds(settings, gateway=gateway, stop=stop))
            _upload_logs(settings, gateway=gateway, sink=sink, log=log)
            return _report(settings, gateway=gateway, log=log, body=body)
        finally:
            stream.close()


def _open_stream(
    settings: RunnerSettings,
    *,
    gateway: gateway_client.GatewayClient,
    sink: logs.LogBuffer,
    log: logs.RunnerLogger,
) -> log_stream.Stream:
    """The live log stream, when the deployment has a logs recipient (without one, nothing is streamed
    nor uploaded) and ``RUNNER_LOG_STREAM_MAX_BYTES`` is not 0."""
    recipient, env_uuid = settings.encrypting_logs_key, settings.deployment_env_uuid
    if recipient is None or env_uuid is None:
        return log_stream.Stream()
    if settings.runner_log_stream_max_bytes == 0:
        log.info("live log streaming is off (RUNNER_LOG_STREAM_MAX_BYTES=0)")
        return log_stream.Stream()
    try:
        age.check_recipient(recipient)
    except age.AgeKeyError:
        return log_stream.Stream()  # The run fails on it before anything is applied (_check_keys).
    stream = log_stream.LogStream(
        gateway=gateway,
        env_uuid=env_uuid,
        deployment_id=settings.deployment_id,
        recipient=recipient,
        log=log,
        max_bytes=settings.runner_log_stream_max_bytes,
        backoff=gateway_client.runner_retry(backoff_seconds=settings.runner_http_backoff_seconds).backoff,
    )
    stream.open(sink)
    return stream


def _drain_seconds(
    settings: RunnerSettings, *, gateway: gateway_client.GatewayClient, stop: StopSignals | None
) -> float:
    """How long the end of the run waits for each undelivered chunk: as a last try when the runner was
    stopped by a signal (the results come first) or the gateway was never reached."""
    if gateway.unreachable or (stop is not None and stop.received is not None):
        return min(settings.runner_log_stream_drain_seconds, gateway_client.LAST_TRY_SECONDS)
    return settings.runner_log_stream_drain_seconds


def _execute(
    settings: RunnerSettings,
    *,
    gateway: gateway_client.GatewayClient,
    sink: logs.LogBuffer,
    log: logs.RunnerLogger,
    environ: Mapping[str, str],
    stop: StopSignals | None = None,
    stream: log_stream.Stream | None = None,
) -> results.DeploymentResults:
    stop = stop or StopSignals()
    rescued: list[str] = []
    try:
        with stop.armed(), _code_dir(settings.iac_code_dir) as code_dir:
            deployment = _Deployment(
                settings,
                gateway=gateway,
                sink=sink,
                log=log,
                environ=environ,
                stream=stream or log_stream.Stream(),
            )
            try:
                body = deployment.run(code_dir)
            finally:
                # Whatever ended the run (a failed apply, SIGTERM): state Terraform could not save is
                # saved now, before the results; no signal cuts that short. Then the engine session ends.
                with stop.disarmed():
                    try:
                        rescued.extend(filter(None, [deployment.rescue_state(code_dir)]))
                    finally:
                        deployment.close()
    except StepFailedError as exc:
        error = exc.error
    except TerminatedError as exc:
        log.warning("stopped by a signal: the engine was interrupted; reporting the deployment")
        error = _runner_error("the runner was stopped before the deployment finished", exc)
    except Exception as exc:  # The boundary: whatever broke, the results are still reported.
        log.exception("unexpected runner error")
        error = _runner_error("unexpected runner error", exc)
    else:
        counts = body.tf_resource_counts
        log.info("deployment succeeded", **(counts.model_dump() if counts else {}))
        return body
    if rescued:
        error = error.model_copy(update={"message": f"{rescued[0]}. {error.message}"})
    log.error("deployment failed", error=error.error, message=error.message)
    return results.DeploymentResults(status=results.ResultStatus.FAILURE, error=error)


@dataclass(eq=False, repr=False)
class _Deployment:
    """The steps of one run, sharing settings, gateway, log and (once known) the IaC command line."""

    settings: RunnerSettings
    _: KW_ONLY
    gateway: gateway_client.GatewayClient
    sink: logs.LogBuffer
    log: logs.RunnerLogger
    environ: Mapping[str, str]
    stream: log_stream.Stream
    started_at: datetime = field(init=False, default_factory=lambda: datetime.now(UTC))
    cli: iac.IacCli | None = field(init=False, default=None)

    @staticmethod
    def _http_backend(code_dir: Path) -> bool:
        main_tf = code_dir / "main.tf"
        return main_tf.is_file() and 'backend "http"' in main_tf.read_text(errors="replace")

    def _engine_environ(self, code_dir: Path) -> Mapping[str, str]:
        """The orchestrator's own state backend (Terraform's ``http`` backend) authenticates with the
        deployment token; hand it over only when the bundle uses that backend, with retries that outlast
        an orchestrator restart and the gateway's CA and mTLS pair (``runner.state``; the job environment
        may set its own)."""
        if self._http_backend(code_dir):
            retries = state.http_retry_environment(self.settings.runner_state_http_retry_seconds)
            tls = state.http_tls_environment(self.settings.gateway_tls())
            return {
                **retries,
                **tls,
                **self.environ,
                "TF_HTTP_USERNAME": self.settings.deployment_id,
                "TF_HTTP_PASSWORD": self.settings.token.get_secret_value(),
            }
        return self.environ

    def close(self) -> None:
        """End the engine session, if one runs."""
        if self.cli is not None:
            self.cli.close()

    def rescue_state(self, code_dir: Path) -> str | None:
        """Save the ``errored.tfstate`` a failed engine command left; the words for the message."""
        if self.cli is None:
            return None
        rescue = state.StateRescue(
            cli=self.cli,
            gateway=self.gateway,
            log=self.log,
            env_uuid=self.settings.deployment_env_uuid,
            deployment_id=self.settings.deployment_id,
            retry_seconds=self.settings.runner_state_recovery_seconds,
            started_at=self.started_at,
        )
        return rescue.rescue(code_dir, http_backend=self._http_backend(code_dir))

    def run(self, code_dir: Path) -> results.DeploymentResults:
        self._check_keys()
        try:
            chosen = engine.select_engine(self.settings.iac_backend, search_path=self.environ.get("PATH"))
        except errors.ConfigurationError as exc:
            raise StepFailedError(_runner_error("no IaC engine available", exc)) from exc
        self._fetch_bundle(code_dir)
        cli = iac.IacCli(
            chosen,
            workdir=code_dir,
            environ=self._engine_environ(code_dir),
            sink=self.sink,
            terminate_grace_seconds=self.settings.runner_stop_grace_seconds,
        )
        self.cli = cli
        self.log.info("IaC engine", engine=cli.engine.display_name)
        initialized = self._checked(cli, "init", "-no-color", "-input=false", "-json")
        # The version from init's first line: no `version` command (an engine start) for it.
        version = initialized.stdout_scan.version
        if version is not None:
            self.log.info("IaC engine is available", engine=cli.engine.display_name, version=version)
        mode = self.settings.mode
        # `plan` until the plan's change summary; `apply` and `destroy` plan first.
        self.stream.set_phase(Phase.PLAN)
        if mode is results.RunnerMode.DESTROY:
            self.stream.switch_after(diagnostics.is_plan_summary, Phase.DESTROY)
            self.log.info("executing destroy")
            destroyed = self._checked(cli, "destroy", "-auto-approve", "-no-color", "-input=false", "-json")
            summary = self._summary(destroyed)
            return _success(counts=_counts(summary, num_resources=summary.remove))

        if mode is results.RunnerMode.PLAN_ONLY:
            self.log.info("executing plan")
            planned = self._checked(cli, "plan", "-no-color", "-input=false", "-json", "-out", PLAN_FILE)
            plan = self._json(
                self._checked(cli, "show", "-no-color", "-json", PLAN_FILE, log_stdout=False), "show"
            )
            num_resources = diagnostics.planned_resource_count(plan)
            outputs = diagnostics.planned_outputs(plan)
            outputs.pop(self.settings.metadata_key, None)
            return _success(
                outputs=self._encrypt_outputs(outputs),
                counts=_counts(self._summary(planned), num_resources=num_resources),
            )

        self.stream.switch_after(diagnostics.is_plan_summary, Phase.APPLY)
        self.log.info("executing apply")
        # No separate `plan -out` + `apply PLAN`: `apply` without a plan file makes the same plan first
        # (under one state lock instead of two) and stops at its errors as `plan` did: one engine start
        # less. A failure before its plan's change summary is reported with action `plan`, as before.
        applied = self._checked(
            cli,
            "apply",
            "-auto-approve",
            "-no-color",
            "-input=false",
            "-json",
            action_of=lambda result: "apply" if result.stdout_scan.planned else "plan",
        )
        # The new state yields the outputs, the metadata output and the resources.
        state = self._applied_state(cli, code_dir)
        num_resources, outputs = state.num_resources, state.outputs
        metadata: list[results.ResourceMetadata] = []
        if self.settings.metadata_key in outputs:
            try:
                metadata = diagnostics.resource_metadata(outputs.pop(self.settings.metadata_key))
            except ValueError as exc:
                raise StepFailedError(_runner_error("failed to parse metadata output", exc)) from exc
        return _success(
            outputs=self._encrypt_outputs(outputs),
            counts=_counts(self._summary(applied), num_resources=num_resources),
            metadata=metadata,
        )

    def _check_keys(self) -> None:
        # Before anything is applied: a bad key found after apply would lose the outputs.
        for variable, key in (
            ("ENCRYPTING_KEY", self.settings.encrypting_key),
            ("ENCRYPTING_LOGS_KEY", self.settings.encrypting_logs_key),
        ):
            if key is not None:
                try:
                    age.check_recipient(key)
                except age.AgeKeyError as exc:
                    raise StepFailedError(
                        _runner_error(f"{variable} is not a valid age recipient", exc)
                    ) from exc

    def _fetch_bundle(self, code_dir: Path) -> None:
        self.log.info("downloading deployment bundle")
        try:
            data = self.gateway.download_bundle(self.settings.deployment_id)
        except ClientError as exc:
            message = "failed to obtain deployment bundle from runner gateway"
            raise StepFailedError(_runner_error(message, exc)) from exc
        try:
            names = bundle.extract_bundle(data, code_dir)
        except bundle.BundleError as exc:
            raise StepFailedError(_runner_error("failed to create a folder with IaC files", exc)) from exc
        self.log.info("deployment bundle unpacked", files=len(names), bytes=len(data), code_dir=str(code_dir))
        if not (code_dir / bundle.MAIN_FILE).is_file():
            message = (
                f"failed to check content of the folder with IaC files: the bundle has no {bundle.MAIN_FILE}"
            )
            raise StepFailedError(results.ResultError(error=results.RUNNER_ERROR_CODE, message=message))

    def _applied_state(self, cli: iac.IacCli, code_dir: Path) -> diagnostics.AppliedState:
        """Outputs and resources of the state ``apply`` left. The orchestrator's own state (this
        environment's ``http`` backend) is read from it as Terraform reads it, one request and no engine
        start; any other backend, or a state that is not plain Terraform state (OpenTofu's encrypted
        state), with ``show -json``."""
        address = self._own_state_address(code_dir)
        if address is not None:
            try:
                document = self.gateway.get_state(address, self.settings.deployment_id)
            except ClientError as exc:
                self.log.warning(
                    "could not read the state from the orchestrator; asking the engine", reason=exc.message
                )
            else:
                read = diagnostics.raw_applied_state(document)
                if read is not None:
                    return read
                self.log.info("the state is not plain Terraform state (encrypted?); asking the engine")
        shown = self._json(self._checked(cli, "show", "-no-color", "-json", log_stdout=False), "show")
        return diagnostics.applied_state(shown)

    def _own_state_address(self, code_dir: Path) -> str | None:
        """The ``http`` backend's address when it is this environment's state in the orchestrator, and
        nothing in the engine's environment points Terraform elsewhere."""
        env_uuid = self.settings.deployment_env_uuid
        if env_uuid is None or not self._http_backend(code_dir) or "TF_HTTP_ADDRESS" in self.environ:
            return None
        match = _HTTP_ADDRESS.search((code_dir / bundle.MAIN_FILE).read_text(errors="replace"))
        if match is None:
            return None
        address = match.group(1)
        own = f"/orgs/{self.settings.org_id}/environments/{env_uuid}/state"
        return address if address.startswith(("https://", "http://")) and address.endswith(own) else None

    def _checked(
        self,
        cli: iac.IacCli,
        command: str,
        *args: str,
        log_stdout: bool = True,
        action_of: Callable[[iac.CommandResult], str] | None = None,
    ) -> iac.CommandResult:
        """Run ``command``; on failure, raise the error of the step ``action_of`` names (default: the
        command itself)."""
        try:
            result = cli.run(command, *args, log_stdout=log_stdout)
        except OSError as exc:
            raise StepFailedError(
                _runner_error(f"cannot run `{cli.engine.display_name} {command}`", exc)
            ) from exc
        if result.ok:
            return result
        action = command if action_of is None else action_of(result)
        chosen = result.error_diagnostic
        error = None if chosen is None else diagnostics.diagnostic_error(chosen, action=action)
        if error is None:
            tail = "\n".join(line for line in result.stderr[-_STDERR_TAIL_LINES:] if line.strip())
            message = f"`{cli.engine.display_name} {action}` failed with exit code {result.exit_code}"
            error = results.ResultError(
                error=results.IAC_COMMAND_ERROR_CODE,
                message=f"{message}: {tail}" if tail else message,
                details={"action": action, "exit_code": result.exit_code},
            )
        raise StepFailedError(error)

    def _json(self, result: iac.CommandResult, action: str) -> dict[str, Any]:
        # Skip anything printed before the document (upstream takes the last line starting with "{").
        text = "\n".join(result.stdout)
        start = text.find("{")
        try:
            value = json.loads(text[start:]) if start >= 0 else None
        except ValueError as exc:
            raise StepFailedError(_runner_error(f"failed to parse the JSON of `{action}`", exc)) from exc
        if not isinstance(value, dict):
            raise StepFailedError(
                results.ResultError(
                    error=results.RUNNER_ERROR_CODE, message=f"`{action} -json` did not print a JSON object"
                )
            )
        return value

    def _summary(self, result: iac.CommandResult) -> diagnostics.ChangeSummary:
        summary = result.stdout_scan.summary
        if summary is None:
            self.log.warning("no change summary in the engine output; counts are reported as 0")
            return diagnostics.ChangeSummary(add=0, change=0, remove=0, operation="")
        return summary

    def _encrypt_outputs(self, outputs: dict[str, Any]) -> str | None:
        if self.settings.encrypting_key is None:
            self.log.warning("ENCRYPTING_KEY is not set: outputs are not reported")
            return None
        document = json.dumps(outputs, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            return age.encrypt_b64(document, self.settings.encrypting_key)
        except errors.OrchestratorError as exc:
            raise StepFailedError(_runner_error("failed to encrypt outputs", exc)) from exc


def _upload_logs(
    settings: RunnerSettings,
    *,
    gateway: gateway_client.GatewayClient,
    sink: logs.LogBuffer,
    log: logs.RunnerLogger,
) -> None:
    if settings.encrypting_logs_key is None:
        log.info("ENCRYPTING_LOGS_KEY is not set: logs are not uploaded")
        return
    if settings.deployment_env_uuid is None:
        log.warning("DEPLOYMENT_ENV_UUID is not set: logs are not uploaded")
        return
    log.info("uploading logs", truncated=sink.truncated)
    try:
        encrypted = age.encrypt_b64(sink.getvalue(), settings.encrypting_logs_key).encode("ascii")
        gateway.put_logs(settings.deployment_env_uuid, settings.deployment_id, encrypted)
    except errors.OrchestratorError as exc:
        # Past the snapshot: this line reaches the container log only. A lost log does not fail the run.
        log.error("failed to upload logs", reason=exc.message)


def _report(
    settings: RunnerSettings,
    *,
    gateway: gateway_client.GatewayClient,
    log: logs.RunnerLogger,
    body: results.DeploymentResults,
) -> Outcome:
    try:
        receipt = gateway.post_results(settings.deployment_id, body)
    except ClientError as exc:
        log.error("failed to report the results", reason=exc.message)
        return Outcome(results=body, receipt=None, problem=f"could not report the results: {exc.message}")
    if receipt is gateway_client.ResultsReceipt.ALREADY_REPORTED:
        log.warning("the gateway already had results for this deployment (409)")
    else:
        log.info("results reported", status=body.status.value)
    return Outcome(results=body, receipt=receipt)


@contextlib.contextmanager
def _code_dir(configured: Path | None) -> Iterator[Path]:
    """The configured directory, else the Job's emptyDir if writable, else a temp dir removed afterwards."""
    if configured is not None:
        configured.mkdir(parents=True, exist_ok=True)
        yield configured
    elif DEFAULT_CODE_DIR.is_dir() and os.access(DEFAULT_CODE_DIR, os.W_OK):
        yield DEFAULT_CODE_DIR
    else:
        # The plan file holds output values in clear text: do not leave it behind; but never state
        # Terraform could not save (the deployment's message names the file).
        created = Path(tempfile.mkdtemp(prefix="po-runner-"))
        try:
            yield created
        finally:
            if not (created / state.ERRORED_STATE).is_file():
                shutil.rmtree(created, ignore_errors=True)


def _success(
    *,
    counts: results.TfResourceCounts,
    outputs: str | None = None,
    metadata: list[results.ResourceMetadata] | None = None,
) -> results.DeploymentResults:
    return results.DeploymentResults(
        status=results.ResultStatus.SUCCESS, outputs=outputs, tf_resource_counts=counts, metadata=metadata
    )


def _counts(summary: diagnostics.ChangeSummary, *, num_resources: int) -> results.TfResourceCounts:
    return results.TfResourceCounts(
        num_resources=num_resources,
        num_resources_added=summary.add,
        num_resources_removed=summary.remove,
        num_resources_changed=summary.change,
    )


def _runner_error(what: str, exc: BaseException) -> results.ResultError:
    reason = exc.message if isinstance(exc, errors.OrchestratorError) else str(exc) or type(exc).__name__
    return results.ResultError(error=results.RUNNER_ERROR_CODE, message=f"{what}: {reason}")


@functools.cache  # once per process: it scans the installed distributions (a zygote's children share it)
def _version() -> str:
    try:
        return importlib_metadata.version("platform-orchestrator")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"
