"""``AgentSettings``: the configuration of ``po-runner remote``, from the upstream environment variables.

``ORG_ID``, ``RUNNER_ID``, ``PRIVATE_KEY`` (PKCS#8 PEM), ``RUNNER_GATEWAY_URL`` and the CA/mTLS files are
upstream's names; the ``AGENT_*`` tuning variables are ours.

``RUNNER_GATEWAY_CA_FILE`` is read and checked when the settings are built (a clear error naming the
variable if it is not a readable PEM certificate). The runners the agent launches get that CA: local (vm)
runs the file's path (``RUNNER_GATEWAY_CA_FILE``, same file system), Kubernetes Jobs its PEM text in the
non-secret variable ``RUNNER_GATEWAY_CA`` (their pods do not have the agent's files; a CA certificate is
public). Never the private key, nor the agent's mTLS client certificate or key.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.agent.metrics import parse_address
from orchestrator.client.tls import GatewayTls, read_ca_file
from orchestrator.protocol import results

#: The variable that carries the gateway CA's PEM text to a runner (``RunnerSettings.runner_gateway_ca``).
RUNNER_GATEWAY_CA_ENV = "RUNNER_GATEWAY_CA"


def default_runs_dir() -> Path:
    """Where local runs get their working directories: in the system temp dir, one per agent user (the
    run user must reach it, which it cannot under the agent's home)."""
    return Path(tempfile.gettempdir()) / f"po-agent-runs-{os.geteuid()}"


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds of a Go duration (``5m``, ``1m30s``, ``250ms``) or of a plain number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"'{text}' is not a duration such as 5m, 90s or 1m30s")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


class AgentSettings(BaseSettings):
    """Settings of one agent process (one runner)."""

    model_config = SettingsConfigDict(
        env_prefix="", env_ignore_empty=True, extra="ignore", populate_by_name=True, frozen=True
    )

    org_id: str = Field(min_length=1, description="Organization of the runner (ORG_ID).")
    runner_id: str = Field(min_length=1, description="The runner this agent serves (RUNNER_ID).")
    private_key: SecretStr = Field(
        description="The agent's Ed25519 private key, PKCS#8 PEM (PRIVATE_KEY); signs every request."
    )
    runner_gateway_url: str = Field(
        description="Runner gateway URL; a URL without a path gets the default base path /runner-gateway."
    )
    runner_gateway_ca_file: Path | None = Field(default=None, description="Extra CA (PEM) for the gateway.")
    runner_gateway_client_cert_file: Path | None = Field(default=None, description="mTLS client certificate.")
    runner_gateway_client_key_file: Path | None = Field(default=None, description="mTLS client key.")

    agent_runs_dir: Path = Field(
        default_factory=default_runs_dir,
        description="Working directories of local runs (vm runners). Default: "
        "<temp dir>/po-agent-runs-<agent uid>.",
    )
    agent_run_user: str = Field(
        default="nobody",
        description="When the agent runs as root, local runs (vm, runtime process) execute as this "
        "unprivileged user (AGENT_RUN_USER); root: as root, without isolation.",
    )
    agent_run_uids: str = Field(
        default="2200000-2200999",
        description="When the agent runs as root, each local run executes as a uid of its own from this "
        "range START-END (AGENT_RUN_UIDS; see PO_LOCAL_RUN_UIDS); off (or empty): every run as "
        "AGENT_RUN_USER.",
    )
    agent_run_cgroups: str = Field(
        default="auto",
        description="auto: each local run gets a cgroup v2 of its own where this host lets the agent make "
        "one, killed whole when the run ends (AGENT_RUN_CGROUPS; see PO_LOCAL_RUN_CGROUPS); off: none.",
    )
    agent_request_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Timeout of a request other than the long poll."
    )
    agent_poll_timeout_seconds: float = Field(
        default=90.0, gt=0, description="Timeout of one commands/next long poll (longer than its wait)."
    )
    agent_max_backoff_seconds: float = Field(
        default=64.0, gt=0, description="Longest wait between attempts to reach an unreachable gateway."
    )
    agent_max_attempts: int = Field(
        default=10, ge=1, description="Deliveries of a command after which a launch error is terminal."
    )

    agent_metrics_addr: str = Field(
        default="",
        description="host:port where the agent serves its Prometheus metrics at /metrics (0.0.0.0:9090); "
        "empty: no metrics endpoint.",
    )

    k8s_runner_pod_scheduling_delay: float = Field(
        default=300.0,
        ge=0,
        description="kubernetes-agent: how long a runner pod may stay pending before its Warning events fail "
        "the deployment (K8S_RUNNER_POD_SCHEDULING_DELAY; a Go duration such as 5m, or seconds).",
    )
    agent_pod_watch_interval_seconds: float = Field(
        default=5.0, gt=0, description="kubernetes-agent: how often a pending runner pod is checked."
    )
    agent_job_namespaces: str = Field(
        default="",
        description="kubernetes-agent: comma-separated namespaces where the agent looks, when it starts, for "
        "the runner Jobs it launched that have not started yet; empty: every namespace, or the agent's own "
        "if it may not list Jobs cluster-wide.",
    )
    agent_pod_watch_max_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="kubernetes-agent: how long after the delay a pending pod is watched.",
    )

    #: The PEM text of ``runner_gateway_ca_file``, read once when the settings are built.
    _gateway_ca_pem: str | None = PrivateAttr(default=None)

    @field_validator("runner_gateway_ca_file")
    @classmethod
    def _readable_pem_certificate(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                read_ca_file(value)
            except ValueError as exc:
                raise ValueError(f"RUNNER_GATEWAY_CA_FILE must be a readable PEM certificate: {exc}") from exc
        return value

    @model_validator(mode="before")
    @classmethod
    def _run_uids_set_empty(cls, data: Any) -> Any:
        """An empty AGENT_RUN_UIDS means "no uid per run" (env_ignore_empty would drop it for the default)."""
        if isinstance(data, dict) and "agent_run_uids" not in data and os.environ.get("AGENT_RUN_UIDS") == "":
            return {**data, "agent_run_uids": ""}
        return data

    @model_validator(mode="after")
    def _read_gateway_ca(self) -> AgentSettings:
        if self.runner_gateway_ca_file is not None:
            self._gateway_ca_pem = read_ca_file(self.runner_gateway_ca_file)
        return self

    @field_validator("agent_metrics_addr")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if value.strip():
            parse_address(value)
        return value.strip()

    @field_validator("k8s_runner_pod_scheduling_delay", mode="before")
    @classmethod
    def _go_duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("runner_gateway_url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        return results.check_gateway_url(value)

    @property
    def gateway_ca_pem(self) -> str | None:
        """The PEM text of the gateway's extra CA (``RUNNER_GATEWAY_CA_FILE``), if any."""
        return self._gateway_ca_pem

    def job_namespaces(self) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.agent_job_namespaces.split(",") if part.strip())

    def gateway_tls(self) -> GatewayTls:
        """The agent's own TLS towards the gateway: the extra CA and its mTLS pair."""
        return GatewayTls(
            ca_file=self.runner_gateway_ca_file,
            client_cert_file=self.runner_gateway_client_cert_file,
            client_key_file=self.runner_gateway_client_key_file,
        )

    def runner_environment(self, *, other_user: bool = False) -> dict[str, str]:
        """What local (vm) runs get from the agent besides their spec: the gateway's CA file, which they
        can read (same file system), or its PEM text when they execute as another user (``other_user``),
        who may not read the agent's files. Never the private key, nor the agent's mTLS identity."""
        if self.runner_gateway_ca_file is None:
            return {}
        if other_user:
            return self.kubernetes_runner_environment()
        return {"RUNNER_GATEWAY_CA_FILE": str(self.runner_gateway_ca_file)}

    def kubernetes_runner_environment(self) -> dict[str, str]:
        """What Kubernetes Jobs get from the agent besides their spec: the gateway CA's PEM text (the pod
        has none of the agent's files). Never the private key, nor the agent's mTLS identity."""
        if self._gateway_ca_pem is None:
            return {}
        return {RUNNER_GATEWAY_CA_ENV: self._gateway_ca_pem}
