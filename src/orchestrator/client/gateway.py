"""What the runner gateway's two clients share: the runner's (``runner.gateway_client``, a deployment token)
and the agent's (``agent.client``, an agent JWT). Both speak to ``{RUNNER_GATEWAY_URL}/v1/orgs/...``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import httpx

from orchestrator.client.errors import (
    AuthError,
    ClientError,
    UnavailableError,
    read_answer,
    transport_failure,
)
from orchestrator.client.http import Connection
from orchestrator.client.tls import GatewayTls
from orchestrator.protocol import results


class GatewaySettings(Protocol):
    """What the runner's and the agent's settings both say about the gateway."""

    def gateway_tls(self) -> GatewayTls: ...

    @property
    def runner_gateway_url(self) -> str: ...

    @property
    def org_id(self) -> str: ...

    @property
    def runner_id(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class RunnerGateway:
    """Where one runner reaches the runner gateway, and how: ``RUNNER_GATEWAY_URL``, ``ORG_ID``,
    ``RUNNER_ID``, the TLS towards it (``tls``: extra CA, mTLS pair), and how long a request may take (a
    long poll says its own).

    A URL without a path gets the default base path ``/runner-gateway``; one with a path (upstream style,
    e.g. ``https://gw.example.com/runner-gateway``) uses that path as the base of the routes.
    """

    url: str
    org_id: str
    runner_id: str
    timeout_seconds: float = 30.0
    tls: GatewayTls | None = None

    @classmethod
    def of(cls, settings: GatewaySettings, *, timeout_seconds: float) -> RunnerGateway:
        """The gateway ``settings`` name, reached within ``timeout_seconds`` a request."""
        return cls(
            url=settings.runner_gateway_url,
            org_id=settings.org_id,
            runner_id=settings.runner_id,
            timeout_seconds=timeout_seconds,
            tls=settings.gateway_tls(),
        )

    @cached_property
    def base_path(self) -> str:
        return results.split_gateway_url(self.url)[2]

    def path(self, route: Callable[..., str], *ids: str) -> str:
        """The path of one of this runner's routes: ``route(org_id, runner_id, *ids, base_path=...)``, one
        of the path functions of ``protocol.results`` or ``protocol.commands``."""
        return route(self.org_id, self.runner_id, *ids, base_path=self.base_path)

    def connection(self, *, user_agent: str) -> Connection:
        """How a client reaches it; ``ConfigurationError`` when the CA or the mTLS pair cannot be loaded."""
        _scheme, origin, _base_path = results.split_gateway_url(self.url)
        return Connection(
            base_url=origin,
            user_agent=user_agent,
            timeout_seconds=self.timeout_seconds,
            tls=self.tls,
        )


def gateway_unreachable(method: str, path: str, reason: str) -> UnavailableError:
    """The error of a request to the gateway that got no answer."""
    return UnavailableError(f"{method} {path} failed: {reason}")


#: Appended to a certificate failure's message: how a runner or agent trusts the gateway's CA.
CA_HINT = " (give the runner the gateway's CA with RUNNER_GATEWAY_CA or RUNNER_GATEWAY_CA_FILE)"


def gateway_transport_error(method: str, path: str, exc: httpx.TransportError) -> UnavailableError:
    """The error of a request that got no answer, naming the cause (``client.errors.transport_failure``):
    a certificate that does not verify or a host name that does not resolve is final (not retryable),
    anything else (connection refused, reset, a timeout) may clear up."""
    failure = transport_failure(exc)
    hint = CA_HINT if failure.kind == "certificate" else ""
    error = UnavailableError(f"{method} {path} failed: {failure.reason}{hint}")
    error.retryable = not failure.permanent
    return error


def gateway_failure(method: str, path: str, response: httpx.Response, *, auth_hint: str = "") -> ClientError:
    """The error of the gateway's non-2xx answer (its body already read): an :class:`AuthError` for 401,
    403 or our gateway's 400 "the runner token is not valid" (upstream's gateway answers 401), with
    ``auth_hint`` appended."""
    answer = read_answer(response)
    message = f"{method} {path}: the runner gateway answered {response.status_code} {response.reason_phrase}"
    if answer.text:
        message += f": {answer.text}"
    status = response.status_code
    if status in (401, 403) or results.RUNNER_TOKEN_INVALID in (answer.message or answer.text):
        return AuthError(message + auth_hint, status_code=status, error=answer.error, details=answer.details)
    return ClientError(message, status_code=status, error=answer.error, details=answer.details)
