"""The runner's client for the runner gateway: bundle download, results, logs and the state Terraform could
not save (``X-Deployment-Token``).

Transient failures (connection errors, 429, 500, 502, 503, 504) are retried with exponential backoff
(``attempts`` per request; an errored state for as long as its caller says); anything else is final.
``transport`` is httpx's seam, so tests can point the client at any server.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from enum import StrEnum
from types import TracebackType

import httpx
from pydantic import SecretStr

from orchestrator import errors
from orchestrator.protocol import results
from orchestrator.protocol.tls import GatewayTls, gateway_verify, plain_http_verify

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Longest wait between two attempts: a runner goes on at most this long after the orchestrator is back.
MAX_BACKOFF_SECONDS = 10.0


class GatewayError(errors.OrchestratorError):
    """The runner gateway did not accept the request."""

    def __init__(
        self, message: str | None = None, *, status_code: int | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        #: Worth another attempt: no answer at all (transport error) or a transient status.
        self.retryable = (
            (status_code is None or status_code in RETRY_STATUSES) if retryable is None else retryable
        )


class GatewayAuthError(GatewayError):
    """The runner gateway rejected the deployment token."""


class ResultsReceipt(StrEnum):
    """How the gateway took the results."""

    ACCEPTED = "accepted"
    #: 409: the gateway already has results for this deployment; nothing more to do.
    ALREADY_REPORTED = "already_reported"


class GatewayClient:
    """Talks to ``{RUNNER_GATEWAY_URL}/v1/orgs/{org}/runners/{runner}/...`` for one deployment.

    A ``gateway_url`` without a path gets the default base path ``/runner-gateway``; one with a path
    (upstream style, e.g. ``https://gw.example.com/runner-gateway``) uses that path as the base. ``tls``
    (extra CA, mTLS pair; ``protocol.tls``) wins over ``verify``.
    """

    def __init__(
        self,
        *,
        gateway_url: str,
        org_id: str,
        runner_id: str,
        token: SecretStr,
        verify: ssl.SSLContext | bool = True,
        tls: GatewayTls | None = None,
        timeout_seconds: float = 40.0,
        attempts: int = 5,
        backoff_seconds: float = 1.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        scheme, origin, self._base_path = results.split_gateway_url(gateway_url)
        self._org_id = org_id
        self._runner_id = runner_id
        self._token = token
        self._attempts = attempts
        self._backoff_seconds = backoff_seconds
        self._sleep = sleep
        self._clock = clock
        verify = gateway_verify(tls) if tls is not None else verify
        self._http = httpx.Client(
            base_url=origin,
            verify=plain_http_verify(scheme) if verify is True else verify,
            timeout=timeout_seconds,
            transport=transport,
            headers={"User-Agent": "po-runner"},
            follow_redirects=False,
        )

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def download_bundle(self, deployment_id: str, *, max_bytes: int = results.MAX_BUNDLE_BYTES) -> bytes:
        """The deployment's tar.gz bundle; ``GatewayError`` if unavailable or over ``max_bytes``."""
        path = results.bundle_path(self._org_id, self._runner_id, deployment_id, base_path=self._base_path)
        for attempt in range(1, self._attempts + 1):
            try:
                with self._http.stream("GET", path, headers=self._headers()) as response:
                    if response.status_code == 200:
                        return _read_capped(response, max_bytes)
                    response.read()
                    failure = self._failure("GET", path, response)
            except httpx.TransportError as exc:
                failure = GatewayError(f"GET {path} failed: {exc}")
            if not self._retry(failure, attempt):
                raise failure
        raise AssertionError("unreachable")  # pragma: no cover

    def post_results(self, deployment_id: str, body: results.DeploymentResults) -> ResultsReceipt:
        """Report the results; a 2xx means accepted, a 409 that the gateway already had them."""
        path = results.results_path(self._org_id, self._runner_id, deployment_id, base_path=self._base_path)
        content = body.to_json_bytes()
        if len(content) > results.MAX_RESULTS_BYTES:
            raise GatewayError(
                f"results body is {len(content)} bytes, over the gateway limit", retryable=False
            )
        response = self._send(
            "POST", path, content=content, content_type="application/json", ok_statuses=frozenset({409})
        )
        return ResultsReceipt.ALREADY_REPORTED if response.status_code == 409 else ResultsReceipt.ACCEPTED

    def put_logs(self, env_uuid: str, deployment_id: str, encrypted_b64: bytes) -> None:
        """Upload the encrypted logs (standard base64 text of the age ciphertext); a 409 means the gateway
        has them already (logs are written once: a retry whose answer was lost)."""
        path = results.logs_path(
            self._org_id, self._runner_id, env_uuid, deployment_id, base_path=self._base_path
        )
        if len(encrypted_b64) > results.MAX_LOG_BYTES:
            raise GatewayError(
                f"encrypted logs are {len(encrypted_b64)} bytes, over the gateway limit", retryable=False
            )
        self._send(
            "PUT",
            path,
            content=encrypted_b64,
            content_type="application/octet-stream",
            ok_statuses=frozenset({409}),
        )

    def upload_errored_state(
        self, env_uuid: str, deployment_id: str, state: bytes, *, retry_seconds: float
    ) -> results.ErroredStateReceipt:
        """Hand over a state Terraform could not save; transient failures are retried for about
        ``retry_seconds`` (an outage of the orchestrator), at least ``attempts`` times."""
        path = results.errored_state_path(
            self._org_id, self._runner_id, env_uuid, deployment_id, base_path=self._base_path
        )
        if len(state) > results.MAX_STATE_BYTES:
            raise GatewayError(f"the state is {len(state)} bytes, over the gateway limit", retryable=False)
        response = self._send(
            "POST",
            path,
            content=state,
            content_type="application/json",
            deadline=self._clock() + retry_seconds,
        )
        try:
            return results.ErroredStateReceipt.model_validate_json(response.content)
        except ValueError as exc:
            raise GatewayError(f"POST {path}: the runner gateway's answer is not a receipt") from exc

    def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes,
        content_type: str,
        ok_statuses: frozenset[int] = frozenset(),
        deadline: float | None = None,
    ) -> httpx.Response:
        headers = self._headers() | {"Content-Type": content_type}
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, path, content=content, headers=headers)
                if response.is_success or response.status_code in ok_statuses:
                    return response
                failure = self._failure(method, path, response)
            except httpx.TransportError as exc:
                failure = GatewayError(f"{method} {path} failed: {exc}")
            if not self._retry(failure, attempt, deadline=deadline):
                raise failure

    def _retry(self, failure: GatewayError, attempt: int, *, deadline: float | None = None) -> bool:
        """Sleep before the next attempt, if there is one: within ``attempts``, or until ``deadline``."""
        if not failure.retryable:
            return False
        delay = min(self._backoff_seconds * 2 ** min(attempt - 1, 16), MAX_BACKOFF_SECONDS)
        within_deadline = deadline is not None and self._clock() + delay < deadline
        if attempt >= self._attempts and not within_deadline:
            return False
        self._sleep(delay)
        return True

    def _headers(self) -> dict[str, str]:
        return {results.DEPLOYMENT_TOKEN_HEADER: self._token.get_secret_value()}

    @staticmethod
    def _failure(method: str, path: str, response: httpx.Response) -> GatewayError:
        body = response.text[:500].strip()
        message = (
            f"{method} {path}: the runner gateway answered {response.status_code} {response.reason_phrase}"
        )
        if body:
            message += f": {body}"
        # Our gateway answers a wrong token 400 (as upstream's data plane), upstream's gateway 401.
        if response.status_code in (401, 403) or results.RUNNER_TOKEN_INVALID in body:
            return GatewayAuthError(
                f"{message} (the deployment token was rejected; check TOKEN)",
                status_code=response.status_code,
            )
        return GatewayError(message, status_code=response.status_code)


def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise GatewayError(
                f"the deployment bundle exceeds the client limit of {max_bytes} bytes", retryable=False
            )
        chunks.append(chunk)
    return b"".join(chunks)
