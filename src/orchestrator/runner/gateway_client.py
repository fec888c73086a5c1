"""The runner's client for the runner gateway: bundle download, results, logs and the state Terraform could
not save (``X-Deployment-Token``). Built on ``client.http`` (TLS, retries) and ``client.gateway``
(errors).

Transient failures (connection errors, 429, 500, 502, 503, 504) are retried with exponential backoff
(``attempts`` per request; an errored state for as long as its caller says); anything else is final. A
gateway certificate that does not verify or a host name that does not resolve is final at once (the
message names the host and the cause). Until the gateway has answered once, connection failures are tried
again for ``first_contact_seconds`` only (``RUNNER_GATEWAY_CONNECT_SECONDS``): a gateway never reached is
a setting to fix, not an outage to sit out; the runner then tries its logs and results once each (they
fail the same way) and exits naming the cause on stderr, which the launcher reports. Until that first answer
no attempt waits past the window's end (a black-holed gateway: a connection or an answer that never comes),
and those last tries wait :data:`LAST_TRY_SECONDS` each: a gateway never reached fails the deployment within
about ``first_contact_seconds`` + 6 s, whatever ``RUNNER_HTTP_TIMEOUT_SECONDS`` is.
Log chunks (:meth:`GatewayClient.put_log_chunk`) are tried once per call, under the same first contact
rules: their sender (``runner.log_stream``) retries them itself. The client is shared by the run's main
thread and that sender (httpx's client is thread-safe).
Failures raise ``client.errors.ClientError``: ``AuthError`` when the deployment token is rejected.
``transport`` is httpx's seam, so tests can point the client at any server.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from enum import StrEnum
from types import TracebackType
from typing import TypeVar

import httpx
from pydantic import SecretStr

from orchestrator.client.errors import ClientError, UnavailableError
from orchestrator.client.gateway import RunnerGateway, gateway_failure, gateway_transport_error
from orchestrator.client.http import Backoff, Retry
from orchestrator.protocol import log_stream, results

T = TypeVar("T")

#: Longest wait between two attempts: a runner goes on at most this long after the orchestrator is back.
MAX_BACKOFF_SECONDS = 10.0
#: How long connection failures are tried again before the gateway has answered once.
FIRST_CONTACT_SECONDS = 20.0
#: How long one attempt may wait once the gateway was not reached in the first contact window.
LAST_TRY_SECONDS = 3.0
#: The shortest wait of an attempt within the first contact window (its last attempt may start late).
MIN_TRY_SECONDS = 1.0
#: Appended to the message of a rejected deployment token.
TOKEN_HINT = " (the deployment token was rejected; check TOKEN)"


def runner_retry(*, attempts: int = 5, backoff_seconds: float = 1.0) -> Retry:
    """The runner's policy (``RUNNER_HTTP_ATTEMPTS``, ``RUNNER_HTTP_BACKOFF_SECONDS``): ``attempts`` tries
    of each request, ``backoff_seconds`` before the second, doubling up to :data:`MAX_BACKOFF_SECONDS`."""
    return Retry(
        attempts=attempts, backoff=Backoff(first_seconds=backoff_seconds, max_seconds=MAX_BACKOFF_SECONDS)
    )


class ResultsReceipt(StrEnum):
    """How the gateway took the results."""

    ACCEPTED = "accepted"
    #: 409: the gateway already has results for this deployment; nothing more to do.
    ALREADY_REPORTED = "already_reported"


#: The answers to a log chunk ``PUT`` that :meth:`GatewayClient.put_log_chunk` returns (see
#: ``protocol.log_stream``): stored (a retry of stored bytes too), other bytes stored for that ``seq``, over
#: the upload limit, no such route or not this token's deployment (404; 405 from a gateway without the
#: route), and the deployment ended.
CHUNK_ANSWERS = frozenset({202, 409, 413, 404, 405, 410})


class GatewayClient:
    """Talks to ``{RUNNER_GATEWAY_URL}/v1/orgs/{org}/runners/{runner}/...`` (``gateway``) for one
    deployment."""

    def __init__(
        self,
        *,
        gateway: RunnerGateway,
        token: SecretStr,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
        first_contact_seconds: float = FIRST_CONTACT_SECONDS,
    ) -> None:
        self._gateway = gateway
        self._token = token
        self._retry = retry or runner_retry()
        self._first_contact_seconds = first_contact_seconds
        self._timeout_seconds = gateway.timeout_seconds
        #: When the first contact window ends (set by the first request).
        self._window_end: float | None = None
        #: The gateway answered once (any status): later connection failures are an outage.
        self._reached = False
        #: The gateway was never reached within the first contact window: one attempt per request.
        self._unreachable = False
        connection = gateway.connection(user_agent="po-runner")
        self._http = connection.client(transport)

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def download_bundle(self, deployment_id: str, *, max_bytes: int = results.MAX_BUNDLE_BYTES) -> bytes:
        """The deployment's tar.gz bundle; ``ClientError`` if unavailable or over ``max_bytes``."""
        path = self._gateway.path(results.bundle_path, deployment_id)

        def download() -> bytes:
            try:
                with self._http.stream(
                    "GET", path, headers=self._headers(), timeout=self._attempt_timeout()
                ) as response:
                    self._reached = True
                    if response.status_code == 200:
                        return _read_capped(response, max_bytes)
                    response.read()
                    raise gateway_failure("GET", path, response, auth_hint=TOKEN_HINT)
            except httpx.TransportError as exc:
                raise gateway_transport_error("GET", path, exc) from exc

        return self._call(download)

    def post_results(self, deployment_id: str, body: results.DeploymentResults) -> ResultsReceipt:
        """Report the results; a 2xx means accepted, a 409 that the gateway already had them."""
        path = self._gateway.path(results.results_path, deployment_id)
        content = body.to_json_bytes()
        if len(content) > results.MAX_RESULTS_BYTES:
            raise ClientError(
                f"results body is {len(content)} bytes, over the gateway limit", retryable=False
            )
        response = self._send(
            "POST", path, content=content, content_type="application/json", ok_statuses=frozenset({409})
        )
        return ResultsReceipt.ALREADY_REPORTED if response.status_code == 409 else ResultsReceipt.ACCEPTED

    def put_logs(self, env_uuid: str, deployment_id: str, encrypted_b64: bytes) -> None:
        """Upload the encrypted logs (standard base64 text of the age ciphertext); a 409 means the gateway
        has them already (logs are written once: a retry whose answer was lost)."""
        path = self._gateway.path(results.logs_path, env_uuid, deployment_id)
        if len(encrypted_b64) > results.MAX_LOG_BYTES:
            raise ClientError(
                f"encrypted logs are {len(encrypted_b64)} bytes, over the gateway limit", retryable=False
            )
        self._send(
            "PUT",
            path,
            content=encrypted_b64,
            content_type="application/octet-stream",
            ok_statuses=frozenset({409}),
        )

    def put_log_chunk(
        self,
        env_uuid: str,
        deployment_id: str,
        seq: int,
        phase: log_stream.Phase,
        encrypted_b64: bytes,
        *,
        timeout_seconds: float,
    ) -> int:
        """One attempt to upload chunk ``seq`` of the live log (base64 age ciphertext), waiting at most
        ``timeout_seconds``: the gateway's status among :data:`CHUNK_ANSWERS`; ``ClientError`` for any other
        answer or none (``retryable`` when another attempt may help)."""
        path = self._gateway.path(log_stream.chunk_path, env_uuid, deployment_id, str(seq))
        headers = self._headers() | {"Content-Type": "text/plain", log_stream.PHASE_HEADER: phase.value}

        def put() -> int:
            timeout = httpx.Timeout(min(timeout_seconds, self._attempt_seconds()))
            try:
                response = self._http.put(path, content=encrypted_b64, headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                raise gateway_transport_error("PUT", path, exc) from exc
            self._reached = True
            if response.status_code in CHUNK_ANSWERS:
                return response.status_code
            raise gateway_failure("PUT", path, response, auth_hint=TOKEN_HINT)

        return self._call(put, retry=Retry(attempts=1, backoff=self._retry.backoff, clock=self._retry.clock))

    def get_state(self, address: str, deployment_id: str) -> bytes | None:
        """The environment's state from the orchestrator's state backend at ``address`` (the ``http``
        backend's, as Terraform reads it: basic auth with the deployment id and token); None when there is
        none yet (204)."""
        token = self._token.get_secret_value()
        auth = base64.b64encode(f"{deployment_id}:{token}".encode()).decode("ascii")
        headers = {"Authorization": f"Basic {auth}"}

        def get() -> bytes | None:
            try:
                response = self._http.get(address, headers=headers, timeout=self._attempt_timeout())
            except httpx.TransportError as exc:
                raise gateway_transport_error("GET", address, exc) from exc
            self._reached = True
            if response.status_code == 204:
                return None
            if response.status_code == 200:
                if len(response.content) > results.MAX_STATE_BYTES:
                    raise ClientError("the state is over the gateway's limit", retryable=False)
                return response.content
            raise gateway_failure("GET", address, response, auth_hint=TOKEN_HINT)

        return self._call(get)

    @property
    def unreachable(self) -> bool:
        """The gateway was never reached within the first contact window (each request is tried once)."""
        return self._unreachable

    def upload_errored_state(
        self, env_uuid: str, deployment_id: str, state: bytes, *, retry_seconds: float
    ) -> results.ErroredStateReceipt:
        """Hand over a state Terraform could not save; transient failures are retried for about
        ``retry_seconds`` (an outage of the orchestrator), at least ``attempts`` times."""
        path = self._gateway.path(results.errored_state_path, env_uuid, deployment_id)
        if len(state) > results.MAX_STATE_BYTES:
            raise ClientError(f"the state is {len(state)} bytes, over the gateway limit", retryable=False)
        response = self._send(
            "POST",
            path,
            content=state,
            content_type="application/json",
            deadline=self._retry.clock() + retry_seconds,
        )
        try:
            return results.ErroredStateReceipt.model_validate_json(response.content)
        except ValueError as exc:
            raise ClientError(f"POST {path}: the runner gateway's answer is not a receipt") from exc

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

        def send() -> httpx.Response:
            try:
                response = self._http.request(
                    method, path, content=content, headers=headers, timeout=self._attempt_timeout()
                )
            except httpx.TransportError as exc:
                raise gateway_transport_error(method, path, exc) from exc
            self._reached = True
            if response.is_success or response.status_code in ok_statuses:
                return response
            raise gateway_failure(method, path, response, auth_hint=TOKEN_HINT)

        return self._call(send, deadline=deadline)

    def _call(
        self, request: Callable[[], T], *, deadline: float | None = None, retry: Retry | None = None
    ) -> T:
        """``request`` under the retry policy (``retry``, else the client's); before the gateway answered
        once, connection failures for ``first_contact_seconds`` at most; after that window passed without
        an answer, once."""
        policy = retry or self._retry
        if self._unreachable:
            return policy.call(_final(request))
        if self._window_end is None:
            self._window_end = self._retry.clock() + self._first_contact_seconds
        window_end = self._window_end
        attempt = 0

        def first_contact() -> T:
            nonlocal attempt
            attempt += 1
            try:
                return request()
            except UnavailableError as exc:
                next_try = self._retry.clock() + self._retry.backoff.delay(attempt)
                if not self._reached and exc.retryable and next_try > window_end:
                    self._unreachable = True
                    final = UnavailableError(
                        f"{exc.message} (no answer from the runner gateway for "
                        f"{self._first_contact_seconds:g} s)",
                        retryable=False,
                    )
                    raise final from exc
                elif not self._reached and not exc.retryable:
                    self._unreachable = True
                raise

        return policy.call(first_contact, deadline=deadline)

    def _attempt_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self._attempt_seconds())

    def _attempt_seconds(self) -> float:
        """How long the next attempt may wait (connecting, for an answer, between two chunks): the client's
        timeout once the gateway answered; until then no longer than the first contact window lasts; after
        the window passed without an answer, :data:`LAST_TRY_SECONDS`."""
        if self._reached:
            return self._timeout_seconds
        if self._unreachable:
            return min(self._timeout_seconds, LAST_TRY_SECONDS)
        window_end = self._window_end if self._window_end is not None else self._retry.clock()
        remaining = window_end - self._retry.clock()
        return min(self._timeout_seconds, max(MIN_TRY_SECONDS, remaining))

    def _headers(self) -> dict[str, str]:
        return {results.DEPLOYMENT_TOKEN_HEADER: self._token.get_secret_value()}


def _final(request: Callable[[], T]) -> Callable[[], T]:
    """``request`` whose failures are not tried again."""

    def once() -> T:
        try:
            return request()
        except ClientError as exc:
            exc.retryable = False
            raise

    return once


def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise ClientError(
                f"the deployment bundle exceeds the client limit of {max_bytes} bytes", retryable=False
            )
        chunks.append(chunk)
    return b"".join(chunks)
