"""What a launcher needs to start one runner execution, and the environment the runner receives.

Shared by the server's dispatcher (direct runner types) and the agent (which receives it in a command).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WarmOrder:
    """What the local launcher sends a warm runner (``po-runner warm``, see ``launchers.warm``) to make it a
    deployment's, as one JSON line on its stdin: the run's whole environment (the runner's own is
    replaced by it) and working directory."""

    environ: Mapping[str, str]
    cwd: str

    def encode(self) -> bytes:
        return json.dumps({"environ": dict(self.environ), "cwd": self.cwd}).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> WarmOrder:
        """The order of one line; ValueError naming what is wrong."""
        value = json.loads(line)
        if not isinstance(value, dict):
            raise ValueError("a warm runner's order is a JSON object")
        environ, cwd = value.get("environ"), value.get("cwd")
        if not isinstance(environ, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items()
        ):
            raise ValueError("a warm runner's order needs 'environ', an object of strings")
        if not isinstance(cwd, str) or not cwd:
            raise ValueError("a warm runner's order needs 'cwd', a path")
        return cls(environ=environ, cwd=cwd)
