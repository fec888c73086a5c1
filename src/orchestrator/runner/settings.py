"""``RunnerSettings``: the configuration of ``po-runner standard``, from the upstream environment variables.

Built once at the CLI edge and passed down. The variable names are the upstream ones (no prefix), set
by whatever launches the runner (the dispatcher's Job spec, the ECS task, the local launcher).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.client.tls import GatewayTls, check_ca_pem
from orchestrator.protocol import results
from orchestrator.protocol.launch import METADATA_KEY
from orchestrator.runner.engine import IacBackend

DEFAULT_METADATA_KEY = METADATA_KEY


class RunnerSettings(BaseSettings):
    """Settings of one runner execution (one deployment)."""

    model_config = SettingsConfigDict(
        env_prefix="", env_ignore_empty=True, extra="ignore", populate_by_name=True, frozen=True
    )

    # Set by the dispatcher (upstream runnercommon/env.go).
    org_id: str = Field(min_length=1, description="Organization of the deployment (ORG_ID).")
    runner_id: str = Field(min_length=1, description="Runner executing the deployment (RUNNER_ID).")
    deployment_id: str = Field(min_length=1, description="Deployment to run (DEPLOYMENT_ID).")
    deployment_env_uuid: str | None = Field(
        default=None, description="UUID of the deployment's environment; needed to upload logs."
    )
    mode: results.RunnerMode = Field(description="deploy, plan_only or destroy (MODE).")
    token: SecretStr = Field(description="Deployment token, sent as X-Deployment-Token (TOKEN).")
    runner_gateway_url: str = Field(
        description="Runner gateway URL; a URL without a path gets the default base path /runner-gateway."
    )
    encrypting_key: str | None = Field(
        default=None, description="age recipient for the outputs; without it no outputs are reported."
    )
    encrypting_logs_key: str | None = Field(
        default=None, description="age recipient for the logs; without it no logs are uploaded."
    )
    log_level: str = Field(default="info", description="debug, info, warn or error.")
    metadata_key: str = Field(
        default=DEFAULT_METADATA_KEY, description="Output holding the per-node resource metadata."
    )

    # Runner-side.
    iac_backend: IacBackend | None = Field(
        default=None, description="opentofu, terraform or embedded; default: tofu, terraform, embedded."
    )
    iac_code_dir: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("IAC_CODE_DIR", "TOFU_CODE_DIR", "iac_code_dir"),
        description="Where the bundle is unpacked; default /opt/runner/tofu if writable, else a temp dir.",
    )
    runner_gateway_ca_file: Path | None = Field(default=None, description="Extra CA (PEM) for the gateway.")
    runner_gateway_ca: str | None = Field(
        default=None,
        description="Extra CA for the gateway as PEM text (RUNNER_GATEWAY_CA): how an agent hands its CA to "
        "the Jobs it launches. Trusted together with RUNNER_GATEWAY_CA_FILE when both are set.",
    )
    runner_gateway_client_cert_file: Path | None = Field(default=None, description="mTLS client certificate.")
    runner_gateway_client_key_file: Path | None = Field(default=None, description="mTLS client key.")
    runner_logs_max_bytes: int = Field(
        default=results.RUNNER_LOG_BUFFER_BYTES,
        ge=1024,
        le=results.RUNNER_LOG_BUFFER_BYTES,
        description="Cap on the logs kept for upload (plain text, before encryption).",
    )
    runner_log_stream_max_bytes: int = Field(
        default=256 << 20,
        ge=0,
        le=1 << 40,
        description="Cap on the log text streamed live to the gateway while the deployment runs, in "
        "encrypted chunks (to the ENCRYPTING_LOGS_KEY recipient); past it a last chunk says the stream was "
        "truncated. "
        "0: no live stream. The whole log uploaded at the end is capped by RUNNER_LOGS_MAX_BYTES.",
    )
    runner_log_stream_drain_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="At the end of the run, before the results: how long the runner waits for each live log "
        "chunk not yet delivered (a gateway outage) before it gives up on the rest (3 s at most after "
        "SIGTERM/SIGINT or when the gateway was never reached).",
    )
    runner_http_timeout_seconds: float = Field(
        default=40.0, gt=0, description="Timeout of one gateway request."
    )
    runner_http_attempts: int = Field(
        default=40,
        ge=1,
        le=1000,
        # 1+2+4+8+10*35 s: bundle, logs and results survive an orchestrator outage of about six minutes.
        description="Attempts per gateway request (about 6 minutes of retries by default).",
    )
    runner_gateway_connect_seconds: float = Field(
        default=20.0,
        ge=0,
        le=86400,
        description="How long the runner tries to reach the gateway before it has answered once "
        "(connection refused, reset, timeouts); a certificate that does not verify or a host name that does "
        "not resolve fails at once. No attempt waits past this window (nor RUNNER_HTTP_TIMEOUT_SECONDS); "
        "then the logs and results are tried once, 3 s each, and the deployment fails, naming the cause.",
    )
    runner_http_backoff_seconds: float = Field(
        default=1.0, ge=0, description="First retry delay; doubles per attempt, capped at 10 s."
    )
    runner_state_http_retry_seconds: float = Field(
        default=600.0,
        ge=0,
        le=86400,
        description="How long Terraform's http backend (state storage `orchestrator`) retries a state read, "
        "write, lock or unlock while the orchestrator is unreachable or answers 5xx: sets TF_HTTP_RETRY_MAX, "
        "TF_HTTP_RETRY_WAIT_MIN and TF_HTTP_RETRY_WAIT_MAX, unless the job environment sets them.",
    )
    runner_state_recovery_seconds: float = Field(
        default=3000.0,
        ge=0,
        le=86400,
        description="How long the runner keeps trying to save a state Terraform could not save "
        "(errored.tfstate): pushing it to the backend and handing it to the orchestrator.",
    )

    runner_stop_grace_seconds: float = Field(
        default=20.0,
        ge=0,
        le=3600,
        description="After SIGTERM/SIGINT: how long the IaC engine gets, after its one SIGINT, to stop and "
        "save its state before it is killed. The default leaves 10 s of Kubernetes' 30 s "
        "terminationGracePeriodSeconds to report the results.",
    )

    @field_validator("runner_gateway_url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        return results.check_gateway_url(value)

    @field_validator("runner_gateway_ca")
    @classmethod
    def _pem_certificate(cls, value: str | None) -> str | None:
        return None if value is None else check_ca_pem(value)

    @field_validator("log_level")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.strip().lower()

    def gateway_tls(self) -> GatewayTls:
        """The extra CA (file and/or PEM text) and the mTLS pair for ``GatewayClient``."""
        return GatewayTls(
            ca_file=self.runner_gateway_ca_file,
            ca_pem=self.runner_gateway_ca,
            client_cert_file=self.runner_gateway_client_cert_file,
            client_key_file=self.runner_gateway_client_key_file,
        )
