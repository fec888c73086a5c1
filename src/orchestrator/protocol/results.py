"""The deployment results a runner reports, the gateway routes it uses, and the gateway's size limits.

Names follow the upstream data-plane schema ``DeploymentResultsUpdateBody``. What the gateway receives
forbids unknown fields, so a typo in a runner is a 400, not silently dropped data.
"""

from __future__ import annotations

import base64
import binascii
from enum import StrEnum
from typing import Any, Final
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator import errors
from orchestrator.protocol import problems

MiB: Final = 1024 * 1024

#: Largest results body the gateway accepts.
MAX_RESULTS_BYTES: Final = 4 * MiB
#: Largest (encrypted, base64) log upload the gateway accepts (``RUNNER_GATEWAY_MAX_LOG_BYTES``).
MAX_LOG_BYTES: Final = 16 * MiB
#: Largest bundle a runner downloads; the client refuses anything bigger.
MAX_BUNDLE_BYTES: Final = 64 * MiB
#: Runner-side cap on the plain-text logs it keeps for upload (before encryption and base64).
RUNNER_LOG_BUFFER_BYTES: Final = 10 * MiB
#: Largest Terraform state the gateway accepts (the state backend, an errored state upload).
MAX_STATE_BYTES: Final = 64 * MiB

#: Default ``RUNNER_GATEWAY_BASE_PATH`` of the gateway.
GATEWAY_BASE_PATH: Final = "/runner-gateway"


def check_gateway_url(value: str) -> str:
    """``value`` if it is an absolute http(s) URL (``RUNNER_GATEWAY_URL``), else ``ValueError``."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("RUNNER_GATEWAY_URL must be an absolute http:// or https:// URL")
    return value


def split_gateway_url(url: str) -> tuple[str, str, str]:
    """``(scheme, origin, base path)`` of ``RUNNER_GATEWAY_URL``: a URL without a path gets the default
    base path ``/runner-gateway``; one with a path (upstream style) uses that path as the base."""
    parts = urlsplit(url)
    return parts.scheme, f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/") or GATEWAY_BASE_PATH


#: Header carrying the per-deployment token on the bundle, results and logs routes.
DEPLOYMENT_TOKEN_HEADER: Final = "X-Deployment-Token"
#: The gateway's 400 message for a deployment token that is not the deployment's (upstream's words).
RUNNER_TOKEN_INVALID: Final = "the runner token is not valid"
#: Error code a runner uses for failures of its own (bundle, files, encryption, gateway).
RUNNER_ERROR_CODE: Final = "RUNNER"
#: Error code for an IaC command that failed without a parseable diagnostic.
IAC_COMMAND_ERROR_CODE: Final = "IAC_COMMAND_ERROR"
#: Error code for a failure described by the last Terraform/OpenTofu error diagnostic.
TF_DIAGNOSTIC_ERROR_CODE: Final = "TF_DIAGNOSTIC_ERROR"


class RunnerMode(StrEnum):
    """What the runner does with the bundle (env ``MODE``)."""

    DEPLOY = "deploy"
    PLAN_ONLY = "plan_only"
    DESTROY = "destroy"


class ResultStatus(StrEnum):
    """Overall outcome of the runner execution."""

    SUCCESS = "success"
    FAILURE = "failure"


class _Received(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResultError(_Received):
    """Why a deployment failed: a short code and a human-readable message.

    Runners use ``RUNNER``, ``IAC_COMMAND_ERROR`` and ``TF_DIAGNOSTIC_ERROR`` (see the constants).
    """

    error: str = Field(min_length=1, max_length=256)
    message: str
    details: dict[str, Any] | None = None


class TfResourceCounts(_Received):
    """Terraform resources involved in, added, removed and changed by the run."""

    num_resources: int = Field(ge=0)
    num_resources_added: int = Field(ge=0)
    num_resources_removed: int = Field(ge=0)
    num_resources_changed: int = Field(ge=0)


class ResourceMetadata(_Received):
    """Metadata a module reported for one active-resource node (keyed by the node's hash)."""

    node_id: str = Field(min_length=1)
    metadata: dict[str, Any]


class DeploymentResults(_Received):
    """The body of ``POST .../deployments/{dep}/results``.

    ``outputs`` is the age ciphertext of the JSON object ``{output name: value}``, in standard base64;
    only the holder of the identity matching the deployment's ``ENCRYPTING_KEY`` can read it.
    """

    status: ResultStatus
    outputs: str | None = None
    error: ResultError | None = None
    tf_resource_counts: TfResourceCounts | None = None
    metadata: list[ResourceMetadata] | None = None

    @field_validator("outputs")
    @classmethod
    def _outputs_are_base64(cls, value: str | None) -> str | None:
        if value:
            try:
                base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise ValueError("outputs must be standard base64") from exc
        return value

    def to_json_bytes(self) -> bytes:
        """Serialise for the wire, leaving out unset optional fields."""
        return self.model_dump_json(exclude_none=True).encode()


def parse_results(body: bytes) -> DeploymentResults:
    """Validate a results body as the gateway receives it.

    Raises ``PayloadTooLargeError`` over ``MAX_RESULTS_BYTES`` and ``InvalidInputError`` (naming the
    offending fields in ``details``) when the body does not match the schema.
    """
    if len(body) > MAX_RESULTS_BYTES:
        raise errors.PayloadTooLargeError(
            f"results body is {len(body)} bytes; the limit is {MAX_RESULTS_BYTES}"
        )
    try:
        return DeploymentResults.model_validate_json(body)
    except ValidationError as exc:
        raise errors.InvalidInputError(
            "invalid deployment results", details={"errors": problems.of(exc)}
        ) from exc


def runner_path(org_id: str, runner_id: str, *, base_path: str = GATEWAY_BASE_PATH) -> str:
    """``{base}/v1/orgs/{org}/runners/{runner}``, each id escaped as one path segment."""
    return f"{base_path.rstrip('/')}/v1/orgs/{_segment(org_id)}/runners/{_segment(runner_id)}"


def bundle_path(
    org_id: str, runner_id: str, deployment_id: str, *, base_path: str = GATEWAY_BASE_PATH
) -> str:
    """``GET``: the deployment's tar.gz bundle (``X-Deployment-Token``)."""
    return (
        f"{runner_path(org_id, runner_id, base_path=base_path)}/deployments/{_segment(deployment_id)}/bundle"
    )


def results_path(
    org_id: str, runner_id: str, deployment_id: str, *, base_path: str = GATEWAY_BASE_PATH
) -> str:
    """``POST``: the deployment's ``DeploymentResults`` (``X-Deployment-Token``)."""
    return (
        f"{runner_path(org_id, runner_id, base_path=base_path)}/deployments/{_segment(deployment_id)}/results"
    )


def logs_path(
    org_id: str, runner_id: str, env_uuid: str, deployment_id: str, *, base_path: str = GATEWAY_BASE_PATH
) -> str:
    """``PUT``: the deployment's encrypted logs, base64 text (``X-Deployment-Token``)."""
    runner = runner_path(org_id, runner_id, base_path=base_path)
    return f"{runner}/environments/{_segment(env_uuid)}/deployments/{_segment(deployment_id)}/logs"


def errored_state_path(
    org_id: str, runner_id: str, env_uuid: str, deployment_id: str, *, base_path: str = GATEWAY_BASE_PATH
) -> str:
    """``POST``: a Terraform state the engine could not save (``errored.tfstate``), as it is
    (``X-Deployment-Token``); answered with an ``ErroredStateReceipt``."""
    runner = runner_path(org_id, runner_id, base_path=base_path)
    return f"{runner}/environments/{_segment(env_uuid)}/deployments/{_segment(deployment_id)}/errored-state"


class ErroredStateOutcome(StrEnum):
    """What the orchestrator did with an errored state."""

    #: It is the environment's newest state version now (state storage ``orchestrator``).
    STORED = "stored"
    #: Kept sealed with the deployment, for an admin to download and push (other state storage, or its
    #: lineage or serial did not fit the environment's state).
    KEPT = "kept"


class ErroredStateReceipt(BaseModel):
    """The gateway's answer to an errored state upload."""

    model_config = ConfigDict(extra="ignore")

    outcome: ErroredStateOutcome
    #: What happened, in words, for the deployment's message.
    message: str
    #: The state version it became (``stored``).
    version: int | None = None


def _segment(value: str) -> str:
    if not value:
        raise errors.InvalidInputError("a gateway path segment must not be empty")
    return quote(value, safe="")
