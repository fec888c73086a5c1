"""The command protocol between the runner gateway and runner agents (version ``v1``), pydantic only.

An agent long-polls ``POST {runner}/commands/next`` and gets ``NextCommand``: a ``CommandEnvelope``, an
opaque ``receipt`` (the gateway's proof of the lease, verifiable by any replica), the delivery ``attempt``
and when the lease ends. It answers ``ack``, ``retry`` (with a delay) or ``reject`` (dead letter) with the
receipt, and reports what happened as ``EventEnvelope``s on ``POST {runner}/events``. Upstream: §4 of the
runner notes (``RUN:internal/gatewayapi/types.go``, ``DP:internal/runners/nats_commands.go``); the
snake_case field names are the proposal there.

Everything here is part of the compatibility promise: fields are added as optional, never renamed. What
the agent receives ignores unknown fields (newer gateways); what the gateway receives forbids them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Final
from urllib.parse import quote

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import MAX_RESULTS_BYTES, RunnerMode, runner_path

PROTOCOL_VERSION: Final = "v1"
#: Longest ``reason`` of a reject, in UTF-8 bytes.
MAX_REJECT_REASON_BYTES: Final = 4096
#: Largest events body the gateway accepts.
MAX_EVENT_BYTES: Final = MAX_RESULTS_BYTES
#: Longest retry delay an agent may ask for.
MAX_RETRY_DELAY_SECONDS: Final = 60
#: Error code of an agent's launch failure (upstream ``REMOTE_RUNNER``).
REMOTE_RUNNER_ERROR_CODE: Final = "REMOTE_RUNNER"
#: Error code of a command that expired before an agent launched it.
COMMAND_EXPIRED_CODE: Final = "COMMAND_EXPIRED"
#: The runner's container in a ``create-job`` JobSpec, and the variable holding the deployment token.
JOB_CONTAINER: Final = "main"
TOKEN_ENV: Final = "TOKEN"


class CommandType(StrEnum):
    CREATE_JOB = "create-job"
    #: Ours, not upstream's: stop the run of ``job_id`` (a cancelled deployment). Upstream's agent
    #: rejects a type it does not know; a rejected ``cancel-job`` changes nothing about the deployment
    #: (its run goes on and reports), see ``dispatch.agent_commands.reject``.
    CANCEL_JOB = "cancel-job"


class EventType(StrEnum):
    JOB_CREATED = "job-created"
    RUNNER_ERROR = "runner-error"
    DEPLOYMENT_RESULT = "deployment-result"
    LOG_OBJECT_READY = "log-object-ready"


class _Sent(BaseModel):
    """What the gateway sends to agents: unknown fields of newer gateways are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _Received(BaseModel):
    """What the gateway receives: an unknown field is a 400, not silently dropped data."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: The fields a ``RunDescription`` takes over from its ``RunSpec`` as they are (and gives back).
_FROM_RUN_SPEC: Final[set[str]] = {
    "deployment_id",
    "env_uuid",
    "mode",
    "gateway_url",
    "encrypting_key",
    "encrypting_logs_key",
    "log_level",
}


# --- commands -----------------------------------------------------------------------------------------


class RunDescription(_Sent):
    """One runner execution as an agent receives it: a ``RunSpec`` without the runner's secrets.

    The deployment token is the only secret; the gateway adds it when it delivers the command (it is
    derived from the server key and stored nowhere). ``job`` is the runner's ``job`` configuration with
    ``secrets`` left out.
    """

    deployment_id: str
    env_uuid: str
    mode: RunnerMode
    token: SecretStr | None = None
    gateway_url: str
    encrypting_key: str | None = None
    encrypting_logs_key: str | None = None
    log_level: str = "info"
    runner_type: str
    job: dict[str, Any] = Field(default_factory=dict)

    @field_serializer("token", when_used="json")
    def _reveal_token(self, token: SecretStr | None) -> str | None:
        return None if token is None else token.get_secret_value()

    @classmethod
    def from_run_spec(cls, spec: RunSpec, runner_type: str) -> RunDescription:
        """The description of ``spec`` without any token or runner secret (what the database keeps)."""
        job = dict(spec.runner_configuration.get("job") or {})
        job.pop("secrets", None)
        return cls(**spec.model_dump(include=_FROM_RUN_SPEC), runner_type=runner_type, job=job)

    def to_run_spec(
        self,
        org_id: str,
        runner_id: str,
        *,
        gateway_url: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> RunSpec:
        """The spec a launcher runs; ``gateway_url`` and ``environment`` are the agent's own additions (its
        view of the gateway, CA files)."""
        if self.token is None:
            raise ValueError("the run description carries no deployment token")
        job = dict(self.job)
        if environment:
            job["environment"] = {**dict(job.get("environment") or {}), **environment}
        return RunSpec(
            **self.model_dump(include=_FROM_RUN_SPEC - {"gateway_url"}),
            org_id=org_id,
            runner_id=runner_id,
            token=self.token,
            gateway_url=gateway_url or self.gateway_url,
            runner_configuration={"type": self.runner_type, "job": job},
        )


class CreateJobPayload(_Sent):
    """``payload`` of a ``create-job`` command: launch ``job_id`` (the deployment id) once.

    Two descriptions of the same run travel side by side: ``spec`` for our agent (``po-runner remote``),
    and, for ``kubernetes-agent`` runners, ``configuration``: the complete Kubernetes JobSpec upstream's
    agent creates as Job ``job_id`` in ``namespace`` (upstream notes §4, "Agent loop"), container
    ``main`` carrying the runner's environment. The deployment token is in neither as stored; the gateway
    adds it to both on delivery (``with_deployment_token``).
    """

    job_id: str
    #: Kubernetes runners: the namespace of the Job.
    namespace: str | None = None
    #: ``kubernetes-agent`` runners: the JobSpec (JSON object) of the runner's Job.
    configuration: dict[str, Any] | None = None
    spec: RunDescription


class CancelJobPayload(_Sent):
    """``payload`` of a ``cancel-job`` command: stop the run ``create-job`` launched as ``job_id``, as
    Terraform expects (the runner gets SIGTERM and passes one SIGINT to the engine, which saves its state
    and releases its lock), killing it after ``grace_seconds``. A run that is gone already is fine."""

    job_id: str
    namespace: str | None = None
    #: The runner type of the run (``vm``, ``kubernetes-agent``): which launcher stops it.
    runner_type: str
    grace_seconds: float = Field(ge=0, le=3600)


def with_deployment_token(payload: Mapping[str, Any], token: str) -> dict[str, Any]:
    """A stored ``create-job`` payload as it is delivered: ``token`` as ``spec.token`` and, when the payload
    has a JobSpec, as the ``TOKEN`` variable of its container ``main`` (first, replacing any other)."""
    delivered = dict(payload)
    if isinstance(payload.get("spec"), Mapping):
        delivered["spec"] = {**payload["spec"], "token": token}
    configuration = payload.get("configuration")
    if isinstance(configuration, Mapping):
        delivered["configuration"] = _with_token_env(configuration, token)
    return delivered


def _with_token_env(job_spec: Mapping[str, Any], token: str) -> dict[str, Any]:
    result = copy.deepcopy(dict(job_spec))
    pod_spec = (result.get("template") or {}).get("spec") or {}
    for container in pod_spec.get("containers") or []:
        if isinstance(container, dict) and container.get("name") == JOB_CONTAINER:
            env = [
                var
                for var in container.get("env") or []
                if not (isinstance(var, Mapping) and var.get("name") == TOKEN_ENV)
            ]
            container["env"] = [{"name": TOKEN_ENV, "value": token}, *env]
    return result


class CommandEnvelope(_Sent):
    """A command for one runner. ``command_id`` is ``create-job:<deployment id>:<revision>``."""

    protocol_version: str
    command_id: str
    organization_id: str
    runner_id: str
    deployment_id: str
    type: str
    created_at: datetime
    expires_at: datetime
    payload: dict[str, Any]


class NextCommand(_Sent):
    """200 answer of ``commands/next``."""

    command: CommandEnvelope
    receipt: str
    attempt: int
    lease_expires_at: datetime


def command_id(deployment_id: str, revision: int = 1) -> str:
    return f"{CommandType.CREATE_JOB.value}:{deployment_id}:{revision}"


def cancel_command_id(deployment_id: str) -> str:
    return f"{CommandType.CANCEL_JOB.value}:{deployment_id}"


class EnvelopeError(ValueError):
    """A command the agent must not run; ``code`` says why (``COMMAND_EXPIRED``, ...)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def check_envelope(
    envelope: CommandEnvelope, *, org_id: str, runner_id: str, now: datetime
) -> CreateJobPayload:
    """The payload of a command this agent may run, or ``EnvelopeError`` (upstream agent loop step 2)."""
    _check_addressing(envelope, org_id=org_id, runner_id=runner_id, now=now)
    if envelope.type != CommandType.CREATE_JOB:
        raise EnvelopeError("UNSUPPORTED_COMMAND_TYPE", f"command type '{envelope.type}' is not supported")
    return _create_job_payload(envelope)


def _check_addressing(envelope: CommandEnvelope, *, org_id: str, runner_id: str, now: datetime) -> None:
    if envelope.protocol_version != PROTOCOL_VERSION:
        raise EnvelopeError(
            "UNSUPPORTED_PROTOCOL_VERSION",
            f"protocol version '{envelope.protocol_version}' is not supported "
            f"(expected '{PROTOCOL_VERSION}')",
        )
    if envelope.organization_id != org_id or envelope.runner_id != runner_id:
        raise EnvelopeError(
            "WRONG_RUNNER",
            f"the command is for runner '{envelope.organization_id}/{envelope.runner_id}', "
            f"not '{org_id}/{runner_id}'",
        )
    if envelope.expires_at <= now:
        raise EnvelopeError(COMMAND_EXPIRED_CODE, f"the command expired at {envelope.expires_at.isoformat()}")


def check_cancel_envelope(
    envelope: CommandEnvelope, *, org_id: str, runner_id: str, now: datetime
) -> CancelJobPayload:
    """The payload of a ``cancel-job`` command this agent may run, or ``EnvelopeError``."""
    _check_addressing(envelope, org_id=org_id, runner_id=runner_id, now=now)
    try:
        return CancelJobPayload.model_validate(envelope.payload)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors(include_input=False)})
        raise EnvelopeError("INVALID_PAYLOAD", f"invalid cancel-job payload: {', '.join(fields)}") from exc


def _create_job_payload(envelope: CommandEnvelope) -> CreateJobPayload:
    try:
        payload = CreateJobPayload.model_validate(envelope.payload)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors(include_input=False)})
        raise EnvelopeError("INVALID_PAYLOAD", f"invalid create-job payload: {', '.join(fields)}") from exc
    if payload.spec.token is None:
        raise EnvelopeError("INVALID_PAYLOAD", "invalid create-job payload: spec.token missing")
    if payload.spec.deployment_id != envelope.deployment_id:
        raise EnvelopeError("INVALID_PAYLOAD", "the payload is for another deployment")
    return payload


class AckRequest(_Received):
    receipt: str = Field(min_length=1, max_length=4096)


class RetryRequest(_Received):
    receipt: str = Field(min_length=1, max_length=4096)
    delay_seconds: int = Field(default=0, ge=0, le=MAX_RETRY_DELAY_SECONDS)


class RejectRequest(_Received):
    receipt: str = Field(min_length=1, max_length=4096)
    reason: str = Field(min_length=1)

    @field_validator("reason")
    @classmethod
    def _reason_bytes(cls, value: str) -> str:
        if len(value.encode()) > MAX_REJECT_REASON_BYTES:
            raise ValueError(f"must be at most {MAX_REJECT_REASON_BYTES} bytes")
        return value


# --- events -------------------------------------------------------------------------------------------


class EventEnvelope(_Received):
    """Something an agent (or a runner) reports; applied once per ``event_id`` however often it is sent.

    Ids: ``<command_id>:job-created``, ``<command_id>:runner-error-terminal|retryable``,
    ``<deployment_id>:deployment-result``.
    """

    #: Upstream agents always send it; absent means ``v1`` (our agents before it was sent).
    protocol_version: str | None = None
    event_id: str = Field(min_length=1, max_length=300)
    type: EventType
    organization_id: str
    runner_id: str
    deployment_id: str
    created_at: datetime | None = None
    payload: dict[str, Any] = Field(default_factory=dict)

    @field_validator("protocol_version")
    @classmethod
    def _supported_version(cls, value: str | None) -> str | None:
        if value is not None and value != PROTOCOL_VERSION:
            raise PydanticCustomError(
                "protocol_version",
                "protocol version '{version}' is not supported: this gateway speaks '{supported}'",
                {"version": value, "supported": PROTOCOL_VERSION},
            )
        return value


class JobCreatedPayload(_Received):
    job_id: str = Field(min_length=1)
    namespace: str | None = None


class RunnerErrorPayload(_Received):
    job_id: str | None = None
    code: str = Field(min_length=1, max_length=256)
    message: str = Field(max_length=8192)
    #: False: the deployment fails with ``code`` and ``message``; true: logged only (the agent retries).
    retryable: bool


class LogObjectReadyPayload(_Received):
    bucket: str
    key: str
    size: int = Field(ge=0)
    sha256: str


def event_id(command: str, event_type: EventType, *, retryable: bool | None = None) -> str:
    """Upstream event ids: errors are ``runner-error-terminal`` or ``runner-error-retryable``."""
    suffix = event_type.value
    if event_type is EventType.RUNNER_ERROR:
        suffix += "-retryable" if retryable else "-terminal"
    return f"{command}:{suffix}"


# --- paths --------------------------------------------------------------------------------------------


def next_command_path(org_id: str, runner_id: str, *, base_path: str | None = None) -> str:
    return f"{_runner(org_id, runner_id, base_path)}/commands/next"


def command_action_path(
    org_id: str, runner_id: str, command: str, action: str, *, base_path: str | None = None
) -> str:
    """``ack``, ``retry`` or ``reject`` of one command (its id escaped as one segment)."""
    if action not in ("ack", "retry", "reject"):
        raise ValueError(action)
    return f"{_runner(org_id, runner_id, base_path)}/commands/{quote(command, safe='')}/{action}"


def events_path(org_id: str, runner_id: str, *, base_path: str | None = None) -> str:
    return f"{_runner(org_id, runner_id, base_path)}/events"


def _runner(org_id: str, runner_id: str, base_path: str | None) -> str:
    if base_path is None:
        return runner_path(org_id, runner_id)
    return runner_path(org_id, runner_id, base_path=base_path)
