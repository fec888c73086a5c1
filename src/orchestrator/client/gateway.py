"""What the runner gateway's two clients share: the runner's (``runner.gateway_client``, a deployment token)
and the agent's (``agent.client``, an agent JWT). Both speak to ``{RUNNER_GATEWAY_URL}/v1/orgs/...``.
"""

from __future__ import annotations

import ssl

import httpx

from orchestrator.client.errors import AuthError, ClientError, UnavailableError, read_answer
from orchestrator.client.http import Connection
from orchestrator.client.tls import GatewayTls
from orchestrator.protocol import results


def gateway_connection(
    gateway_url: str,
    *,
    user_agent: str,
    timeout_seconds: float,
    tls: GatewayTls | None,
    verify: ssl.SSLContext | bool,
) -> tuple[Connection, str]:
    """How to reach ``RUNNER_GATEWAY_URL``, and the base path of its routes: the URL's path, or
    ``/runner-gateway`` when it has none."""
    _scheme, origin, base_path = results.split_gateway_url(gateway_url)
    connection = Connection(
        base_url=origin, user_agent=user_agent, timeout_seconds=timeout_seconds, tls=tls, verify=verify
    )
    return connection, base_path


def gateway_unreachable(method: str, path: str, reason: str) -> UnavailableError:
    """The error of a request to the gateway that got no answer."""
    return UnavailableError(f"{method} {path} failed: {reason}")


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
