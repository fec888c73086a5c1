"""What a launcher needs to start one runner execution, and the environment the runner receives.

Shared by the server's dispatcher (direct runner types) and the agent (which receives it in a command).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, SecretStr

from orchestrator.protocol.results import RunnerMode

#: The root module's output holding each node's resource metadata (upstream ``METADATA_KEY``'s default).
METADATA_KEY: Final = "platform_orchestrator_metadata"


class RunSpec(BaseModel):
    """One runner execution for one deployment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    org_id: str
    runner_id: str
    deployment_id: str
    env_uuid: str
    mode: RunnerMode
    token: SecretStr
    gateway_url: str
    encrypting_key: str | None = None
    encrypting_logs_key: str | None = None
    log_level: str = "info"
    #: The runner's full configuration (secrets included): only the launcher of this run sees it.
    runner_configuration: dict[str, Any]

    def runner_environment(self) -> dict[str, str]:
        """The upstream environment variables of ``po-runner standard`` (runnercommon/env.go)."""
        env = {
            "ORG_ID": self.org_id,
            "RUNNER_ID": self.runner_id,
            "DEPLOYMENT_ID": self.deployment_id,
            "DEPLOYMENT_ENV_UUID": self.env_uuid,
            "MODE": self.mode.value,
            "TOKEN": self.token.get_secret_value(),
            "RUNNER_GATEWAY_URL": self.gateway_url,
            "LOG_LEVEL": self.log_level,
            "METADATA_KEY": METADATA_KEY,
        }
        if self.encrypting_key:
            env["ENCRYPTING_KEY"] = self.encrypting_key
        if self.encrypting_logs_key:
            env["ENCRYPTING_LOGS_KEY"] = self.encrypting_logs_key
        return env
