"""``ManagedSettings``: the configuration of ``po-runner managed``, from seed 004's environment variables.

``RUNNER_URL`` (the orchestrator's base URL), ``RUNNER_MANAGED_SECRET_FILE`` (a file holding the shared
secret; or, less safely, ``RUNNER_MANAGED_SECRET`` itself), ``RUNNER_NAME``, ``RUNNER_TAGS``
(comma-separated, added to the detected ones), ``RUNNER_WORK_DIR``, ``RUNNER_GATEWAY_CA`` (PEM text, or the
path of a PEM file) and ``RUNNER_RUN_UIDS`` (the uids the deployments run as, when the runner is root).
The secret is a ``SecretStr``: never printed, never in a message; ``po-runner managed`` drops
``RUNNER_MANAGED_SECRET`` from its environment at start and is not dumpable, so no run reads it.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.client.tls import PEM_CERTIFICATE_MARKER, GatewayTls, check_ca_pem, read_ca_file
from orchestrator.protocol.results import GATEWAY_BASE_PATH

#: A runner's name, as the server checks it (a DNS label: a StatefulSet pod's name fits).
NAME_PATTERN: Final = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
#: A tag, as the server checks it.
TAG_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
#: The server refuses a shorter ``MANAGED_RUNNER_SECRET``: a shorter one can never be accepted.
MIN_SECRET_LENGTH: Final = 48


def default_work_dir() -> Path:
    """Where deployments get their work directories: in the system temp dir, one per runner user."""
    return Path(tempfile.gettempdir()) / f"po-managed-runner-{os.geteuid()}"


def parse_tags(text: str) -> tuple[str, ...]:
    """The tags of a comma-separated list (blanks around them and empty items ignored), each checked."""
    tags = [part.strip() for part in text.split(",") if part.strip()]
    wrong = [tag for tag in tags if not TAG_PATTERN.fullmatch(tag)]
    if wrong:
        raise ValueError(
            f"{', '.join(repr(tag) for tag in wrong)}: a tag is 1 to 63 characters of a-z, 0-9, '.' and '-', "
            "starting with a letter or digit"
        )
    return tuple(dict.fromkeys(tags))


class ManagedSettings(BaseSettings):
    """Settings of one managed runner process."""

    model_config = SettingsConfigDict(
        env_prefix="", env_ignore_empty=True, extra="ignore", populate_by_name=True, frozen=True
    )

    runner_url: str = Field(description="The orchestrator's base URL, e.g. http://po:8080 (RUNNER_URL).")
    runner_managed_secret: SecretStr = Field(
        description="The installation's MANAGED_RUNNER_SECRET (RUNNER_MANAGED_SECRET); only sent to "
        "register. Prefer RUNNER_MANAGED_SECRET_FILE: a variable is visible to what reads the environment."
    )
    runner_managed_secret_file: Path | None = Field(
        default=None,
        description="A file holding the shared secret (RUNNER_MANAGED_SECRET_FILE; surrounding blanks "
        "ignored); keep it readable by the runner's user only.",
    )
    runner_run_uids: str = Field(
        default="2300000-2300999",
        description="When the runner runs as root, each deployment's po-runner executes as a uid of its own "
        "from this range START-END (RUNNER_RUN_UIDS), killed with everything it started when the run ends; "
        "off (or empty): as the runner's own user.",
    )
    runner_run_cgroups: str = Field(
        default="auto",
        description="auto: each deployment's po-runner gets a cgroup v2 of its own where this host lets the "
        "runner make one (root with a writable cgroup v2 hierarchy: not in a pod's read-only "
        "/sys/fs/cgroup), killed whole when the run ends (RUNNER_RUN_CGROUPS); off: none.",
    )
    runner_name: str = Field(description="This runner's name, unique in the pool (RUNNER_NAME).")
    runner_tags: str = Field(default="", description="Comma-separated tags added to the detected ones.")
    runner_work_dir: Path = Field(
        default_factory=default_work_dir,
        description="Where each deployment gets a fresh work directory, removed after its run.",
    )
    runner_gateway_ca: str | None = Field(
        default=None, description="Extra CA for an https RUNNER_URL: PEM text, or the path of a PEM file."
    )
    runner_stop_grace_seconds: float = Field(
        default=20.0,
        ge=0,
        description="On SIGTERM/SIGINT, how long a running deployment may still finish before its po-runner "
        "gets SIGTERM (it then reports the deployment as failed).",
    )
    runner_kill_grace_seconds: float = Field(
        default=8.0, ge=0, description="How long po-runner gets after SIGTERM before SIGKILL."
    )
    runner_request_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Timeout of one request other than the claim's long poll."
    )

    @field_validator("runner_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an absolute http:// or https:// URL, e.g. http://po:8080")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or a fragment")
        return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"

    @model_validator(mode="before")
    @classmethod
    def _run_uids_set_empty(cls, data: Any) -> Any:
        """An empty RUNNER_RUN_UIDS means "no uid per run" (env_ignore_empty would drop it otherwise)."""
        if (
            isinstance(data, dict)
            and "runner_run_uids" not in data
            and os.environ.get("RUNNER_RUN_UIDS") == ""
        ):
            return {**data, "runner_run_uids": ""}
        return data

    @model_validator(mode="before")
    @classmethod
    def _secret_from_file(cls, data: Any) -> Any:
        """``RUNNER_MANAGED_SECRET_FILE``'s content as the secret (the file wins over the variable)."""
        if not isinstance(data, dict):
            return data
        path = data.get("runner_managed_secret_file")
        if not path:
            return data
        try:
            secret = Path(str(path)).read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"RUNNER_MANAGED_SECRET_FILE {path}: cannot be read ({exc.strerror or exc})"
            ) from None
        return {**data, "runner_managed_secret": secret}

    @field_validator("runner_managed_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        length = len(value.get_secret_value())
        if length < MIN_SECRET_LENGTH:
            raise ValueError(f"must be at least {MIN_SECRET_LENGTH} characters (it has {length})")
        return value

    @field_validator("runner_name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"'{value}' is not a valid name: 1 to 63 characters of a-z, 0-9 and '-', starting and "
                "ending with a letter or digit"
            )
        return value

    @field_validator("runner_tags")
    @classmethod
    def _tags(cls, value: str) -> str:
        parse_tags(value)
        return value

    @field_validator("runner_gateway_ca")
    @classmethod
    def _pem(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if PEM_CERTIFICATE_MARKER in value:
            return check_ca_pem(value)
        return read_ca_file(Path(value.strip()))

    @property
    def extra_tags(self) -> tuple[str, ...]:
        return parse_tags(self.runner_tags)

    @property
    def gateway_url(self) -> str:
        """``RUNNER_GATEWAY_URL`` for the deployments' ``po-runner standard``: the runner gateway under
        ``RUNNER_URL`` (its base path kept), the explicit form ``runner.settings`` accepts."""
        return self.runner_url + GATEWAY_BASE_PATH

    def tls(self) -> GatewayTls:
        return GatewayTls(ca_pem=self.runner_gateway_ca)
