"""``AgentSettings``: the configuration of ``po-runner remote``, from the upstream environment variables.

``ORG_ID``, ``RUNNER_ID``, ``PRIVATE_KEY`` (PKCS#8 PEM), ``RUNNER_GATEWAY_URL`` and the CA/mTLS files are
upstream's names; the ``AGENT_*`` tuning variables are ours.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_runs_dir() -> Path:
    """Where local runs get their working directories (XDG data dir)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "po-agent" / "runs"


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
        default_factory=default_runs_dir, description="Working directories of local runs (vm runners)."
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

    k8s_runner_pod_scheduling_delay: float = Field(
        default=300.0,
        ge=0,
        description="kubernetes-agent: how long a runner pod may stay pending before its Warning events fail "
        "the deployment (K8S_RUNNER_POD_SCHEDULING_DELAY; a Go duration such as 5m, or seconds).",
    )
    agent_pod_watch_interval_seconds: float = Field(
        default=5.0, gt=0, description="kubernetes-agent: how often a pending runner pod is checked."
    )
    agent_pod_watch_max_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="kubernetes-agent: how long after the delay a pending pod is watched.",
    )

    @field_validator("k8s_runner_pod_scheduling_delay", mode="before")
    @classmethod
    def _go_duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("runner_gateway_url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("RUNNER_GATEWAY_URL must be an absolute http:// or https:// URL")
        return value

    def runner_environment(self) -> dict[str, str]:
        """What the runners this agent launches get from it besides their spec: the gateway's CA file (as
        upstream mounts the CA into the Job). Never the private key, nor the agent's mTLS identity."""
        if self.runner_gateway_ca_file is None:
            return {}
        return {"RUNNER_GATEWAY_CA_FILE": str(self.runner_gateway_ca_file)}
