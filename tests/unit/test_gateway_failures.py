"""How the runner's gateway client tells a permanent failure from an outage (issue 26), against real
sockets: a certificate that does not verify and a host name that does not resolve fail at once, naming the
host; a gateway never reached is tried for the first contact window only, then each later request once; a
gateway that answered once and then went away is an outage, tried for all attempts."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from orchestrator.client.errors import UnavailableError
from orchestrator.client.gateway import RunnerGateway
from orchestrator.client.http import Backoff, Retry
from orchestrator.protocol import results
from orchestrator.runner.gateway_client import GatewayClient
from orchestrator.runner.settings import RunnerSettings
from tests.support.kube_api import CertificateAuthority

BUNDLE = b"tar.gz bytes"


class Clock:
    """A clock that moves only when the retry policy sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def retry(clock: Clock, attempts: int = 40) -> Retry:
    return Retry(
        attempts=attempts,
        backoff=Backoff(first_seconds=1.0, max_seconds=10.0),
        sleep=clock.sleep,
        clock=clock,
    )


def client(url: str, clock: Clock, *, attempts: int = 40, ca: str | None = None) -> GatewayClient:
    tls = None
    if ca is not None:
        tls = RunnerSettings.model_validate(
            {
                "org_id": "acme",
                "runner_id": "r",
                "deployment_id": "d1",
                "mode": "deploy",
                "token": "t",
                "runner_gateway_url": url,
                "runner_gateway_ca": ca,
            }
        ).gateway_tls()
    return GatewayClient(
        gateway=RunnerGateway(url=url, org_id="acme", runner_id="r", tls=tls),
        token=SecretStr("t"),
        retry=retry(clock, attempts),
        first_contact_seconds=20,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def failure_body() -> results.DeploymentResults:
    return results.DeploymentResults(
        status=results.ResultStatus.FAILURE,
        error=results.ResultError(error=results.RUNNER_ERROR_CODE, message="x"),
    )


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BUNDLE)))
        self.end_headers()
        self.wfile.write(BUNDLE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def plain_gateway() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_certificate_that_does_not_verify_fails_at_once_naming_the_host(tmp_path: Any) -> None:
    ca = CertificateAuthority("gateway-ca")
    serving = ca.issue("localhost", server=True)
    (tmp_path / "server.crt").write_bytes(serving.cert_pem)
    (tmp_path / "server.key").write_bytes(serving.key_pem)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clock = Clock()
    wrong = CertificateAuthority("another-ca").pem.decode()
    try:
        with (
            client(f"https://127.0.0.1:{server.server_port}", clock, ca=wrong) as gateway,
            pytest.raises(UnavailableError) as failed,
        ):
            gateway.download_bundle("d1")
    finally:
        server.shutdown()
        server.server_close()
    assert "certificate verify failed for 127.0.0.1" in failed.value.message
    assert "RUNNER_GATEWAY_CA" in failed.value.message
    assert not failed.value.retryable
    assert clock.sleeps == []


def test_a_host_name_that_does_not_resolve_fails_at_once_naming_it() -> None:
    clock = Clock()
    with (
        client("http://gateway.invalid:8080", clock) as gateway,
        pytest.raises(UnavailableError, match=r"cannot resolve the host name gateway\.invalid") as failed,
    ):
        gateway.download_bundle("d1")
    assert not failed.value.retryable
    assert clock.sleeps == []


def test_a_gateway_never_reached_is_tried_for_the_first_contact_window_then_once_per_request() -> None:
    port = closed_port()
    clock = Clock()
    with client(f"http://127.0.0.1:{port}", clock) as gateway:
        with pytest.raises(UnavailableError) as failed:
            gateway.download_bundle("d1")
        assert f"connection refused by 127.0.0.1:{port}" in failed.value.message
        assert "no answer from the runner gateway for 20 s" in failed.value.message
        # Tried until the next attempt would start past 20 s: at 0, 1, 3, 7 and 15 s.
        assert clock.sleeps == [1, 2, 4, 8]
        with pytest.raises(UnavailableError, match="connection refused"):
            gateway.post_results("d1", failure_body())
        assert clock.sleeps == [1, 2, 4, 8]


def test_a_gateway_that_answered_once_and_went_away_is_an_outage_tried_for_all_attempts(
    plain_gateway: ThreadingHTTPServer,
) -> None:
    clock = Clock()
    with client(f"http://127.0.0.1:{plain_gateway.server_port}", clock, attempts=8) as gateway:
        assert gateway.download_bundle("d1") == BUNDLE
        plain_gateway.shutdown()
        plain_gateway.server_close()
        with pytest.raises(UnavailableError, match="connection refused"):
            gateway.post_results("d1", failure_body())
    assert clock.sleeps == [1, 2, 4, 8, 10, 10, 10]


class BlackHole(httpx.BaseTransport):
    """A gateway whose packets vanish: each attempt waits its whole timeout (on the test's clock), then times
    out, as a connection to a dropped address or a server that never answers does."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]
        waited = max(value for value in timeout.values() if value is not None)
        self.waits.append(waited)
        self.clock.now += waited
        raise httpx.ConnectTimeout("timed out", request=request)


def test_a_black_holed_gateway_fails_the_run_within_30_s_whatever_the_request_timeout() -> None:
    """Bundle, then logs and results once each (what the runner does): the first contact window (20 s)
    bounds every attempt before the gateway answered, and the last tries wait 3 s each; the request
    timeout (RUNNER_HTTP_TIMEOUT_SECONDS, 40 s by default) would make it two minutes."""
    clock = Clock()
    hole = BlackHole(clock)
    gateway = GatewayClient(
        gateway=RunnerGateway(url="http://192.0.2.1:8080", org_id="acme", runner_id="r", timeout_seconds=40),
        token=SecretStr("t"),
        retry=retry(clock),
        first_contact_seconds=20,
        transport=hole,
    )
    with gateway:
        with pytest.raises(UnavailableError) as bundle:
            gateway.download_bundle("d1")
        with pytest.raises(UnavailableError):
            gateway.put_logs("env", "d1", b"bG9ncw==")
        with pytest.raises(UnavailableError):
            gateway.post_results("d1", failure_body())

    assert clock.now < 30, (clock.now, hole.waits, clock.sleeps)
    assert [20.0, 3.0, 3.0] == hole.waits
    assert "no answer from the runner gateway for 20 s" in bundle.value.message
    assert "timed out" in bundle.value.message


def test_a_gateway_that_answered_keeps_the_request_timeout(plain_gateway: ThreadingHTTPServer) -> None:
    clock = Clock()
    seen: list[float | None] = []
    inner = httpx.HTTPTransport()

    class Recording(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request.extensions["timeout"]["read"])
            return inner.handle_request(request)

    url = f"http://127.0.0.1:{plain_gateway.server_port}"
    with GatewayClient(
        gateway=RunnerGateway(url=url, org_id="acme", runner_id="r", timeout_seconds=40),
        token=SecretStr("t"),
        retry=retry(clock),
        first_contact_seconds=20,
        transport=Recording(),
    ) as gateway:
        assert BUNDLE == gateway.download_bundle("d1")
        assert BUNDLE == gateway.download_bundle("d1")

    assert [20.0, 40.0] == seen
