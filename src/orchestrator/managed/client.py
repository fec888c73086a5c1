"""The managed runner's client of the orchestrator's ``/runner/*`` routes (MANAGED.md's wire contract),
built on ``client.http`` (TLS with ``RUNNER_GATEWAY_CA``, timeouts, no redirects) and ``client.errors``.

Each answer becomes a value or one of the errors below; the loop (``managed.loop``) decides what to do:

    ClientError               anything else; ``retryable`` for no answer, 429 and 5xx
    ├── SecretRefusedError    401 to ``register``: the managed runner secret is not valid (stop)
    ├── TokenRefusedError     401 to any later call: the token is not accepted (register again)
    ├── NotEnabledError       404 "not enabled": this server has no managed runners (stop)
    └── ClaimConflictError    409 to ``heartbeat``: the deployment is no longer this runner's claim

Messages name the method, the path and the server's own message; never the secret or the token.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.client.errors import AuthError, ClientError, UnavailableError, read_answer
from orchestrator.client.http import Connection
from orchestrator.client.tls import GatewayTls

__all__ = [
    "MAX_WAIT_SECONDS",
    "Claim",
    "ClaimConflictError",
    "ManagedClient",
    "NotEnabledError",
    "Registration",
    "SecretRefusedError",
    "Timing",
    "TokenRefusedError",
]

M = TypeVar("M", bound=BaseModel)

REGISTER_PATH: Final = "/runner/register"
HEARTBEAT_PATH: Final = "/runner/heartbeat"
CLAIM_PATH: Final = "/runner/claim"
#: The longest long poll the server accepts (``waitSeconds``).
MAX_WAIT_SECONDS: Final = 25
#: How much longer than its wait a claim request may take.
CLAIM_TIMEOUT_MARGIN_SECONDS: Final = 15.0


def finished_path(deployment_id: str) -> str:
    return f"/runner/deployments/{deployment_id}/finished"


class SecretRefusedError(AuthError):
    """The server refused the managed runner secret."""


class TokenRefusedError(AuthError):
    """The server no longer accepts this runner's token."""


class NotEnabledError(ClientError):
    """Managed runners are not enabled on this server."""


class ClaimConflictError(ClientError):
    """The deployment is not (or no longer) this runner's claim."""


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class Timing(_Wire):
    """How long a claim lasts without a heartbeat, and how often to send one."""

    lease_seconds: int = Field(alias="leaseSeconds", gt=0)
    heartbeat_seconds: int = Field(alias="heartbeatSeconds", gt=0)
    #: A heartbeat's answer: the deployment it carried was cancelled, stop its run (SIGTERM, then SIGKILL
    #: after ``cancel_grace_seconds``). Absent from older servers' answers: false.
    cancel: bool = False
    cancel_grace_seconds: float = Field(default=30.0, alias="cancelGraceSeconds", ge=0)


class Registration(Timing):
    """The answer to ``register``: this runner's record and its token (never logged)."""

    runner_id: str = Field(alias="runnerId")
    name: str
    token: str = Field(min_length=1, repr=False)
    pool: str
    tags: list[str]


class ClaimedDeployment(_Wire):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    org_id: str = Field(alias="orgId")
    project_id: str = Field(alias="projectId")
    env_id: str = Field(alias="envId")


class Claim(_Wire):
    """A claimed deployment and the environment its ``po-runner standard`` needs (holds its token)."""

    deployment: ClaimedDeployment
    lease_seconds: int = Field(alias="leaseSeconds", gt=0)
    environment: dict[str, str] = Field(repr=False)


class ManagedClient:
    """Talks to ``{RUNNER_URL}/runner/...``; ``transport`` is httpx's seam for tests. Building it raises
    ``ConfigurationError`` when the CA cannot be loaded."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float = 30.0,
        tls: GatewayTls | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.timeout_seconds = timeout_seconds
        connection = Connection(
            base_url=base_url, user_agent="po-runner-managed", timeout_seconds=timeout_seconds, tls=tls
        )
        self.http = connection.async_client(transport)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def register(self, *, secret: str, name: str, tags: list[str]) -> Registration:
        body = {"managedSecret": secret, "name": name, "tags": tags}
        response = await self._post(REGISTER_PATH, body, token=None)
        return self._read(Registration, REGISTER_PATH, response)

    async def heartbeat(self, token: str, deployment_id: str | None) -> Timing:
        response = await self._post(HEARTBEAT_PATH, {"deploymentId": deployment_id}, token=token)
        return self._read(Timing, HEARTBEAT_PATH, response)

    async def claim(self, token: str, *, wait_seconds: int = MAX_WAIT_SECONDS) -> Claim | None:
        """Long poll: a claimed deployment, or None when none was claimable within ``wait_seconds``."""
        wait = max(0, min(MAX_WAIT_SECONDS, wait_seconds))
        timeout = self.timeout_seconds + wait + CLAIM_TIMEOUT_MARGIN_SECONDS
        response = await self._post(CLAIM_PATH, {"waitSeconds": wait}, token=token, read_timeout=timeout)
        if response.status_code == 204:
            return None
        return self._read(Claim, CLAIM_PATH, response)

    async def finished(self, token: str, deployment_id: str, exit_code: int) -> None:
        await self._post(finished_path(deployment_id), {"exitCode": exit_code}, token=token)

    async def _post(
        self, path: str, body: dict[str, Any], *, token: str | None, read_timeout: float | None = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        try:
            response = await self.http.post(
                path,
                json=body,
                headers=headers,
                timeout=read_timeout if read_timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            # httpx's words name the URL and the reason, never a header or the body.
            raise UnavailableError(f"POST {path} failed: {exc!r}") from exc
        if response.is_success:
            return response
        raise self._failure(path, response)

    @staticmethod
    def _failure(path: str, response: httpx.Response) -> ClientError:
        answer = read_answer(response)
        status = response.status_code
        said = answer.message if answer.message is not None else answer.text
        message = f"POST {path}: the orchestrator answered {status} {response.reason_phrase}"
        if said:
            message += f": {said}"
        fields: dict[str, Any] = {"status_code": status, "error": answer.error, "details": answer.details}
        if status == 401:
            kind: type[ClientError] = SecretRefusedError if path == REGISTER_PATH else TokenRefusedError
            return kind(message, **fields)
        if status == 404 and (path in (REGISTER_PATH, HEARTBEAT_PATH, CLAIM_PATH) or "not enabled" in said):
            return NotEnabledError(message, **fields)
        if status == 409 and path == HEARTBEAT_PATH:
            return ClaimConflictError(message, **fields)
        return ClientError(message, **fields)

    @staticmethod
    def _read(model: type[M], path: str, response: httpx.Response) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            # Not the contract's answer (a proxy's page, a different server): worth asking again later.
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
            raise ClientError(
                f"POST {path}: the orchestrator's answer is not the expected one: {problems}", retryable=True
            ) from exc
