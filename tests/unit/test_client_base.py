"""The HTTP client base (``client.http``, ``client.errors``, ``client.gateway``, ``client.tls``) that
``octl``'s, the runner's and the agent's clients are built on, against real local HTTP(S) servers: the
retry policy, the error tree and the server's error body, and TLS (extra CA, mTLS pair, plain http)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import errors
from orchestrator.client.api import ApiAuthError, ApiClient, ApiConnectionError, ApiError
from orchestrator.client.errors import AuthError, ClientError, UnavailableError, read_answer
from orchestrator.client.gateway import RunnerGateway, gateway_failure, gateway_unreachable
from orchestrator.client.http import Backoff, Connection, Retry
from orchestrator.client.tls import GatewayTls, client_verify
from orchestrator.protocol import results
from tests.support.kube_api import CertificateAuthority

Answer = tuple[int, str | dict[str, Any]]


@dataclass
class Script:
    """What the server answers, in order (the last one again once the list is used up), and what it saw."""

    answers: list[Answer]
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def next(self, path: str, headers: dict[str, str]) -> Answer:
        self.paths.append(path)
        self.headers.append(headers)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = script.next(self.path, {k.lower(): v for k, v in self.headers.items()})
            data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self._answer()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Server:
    url: str
    script: Script


def _serve(script: Script, context: ssl.SSLContext | None = None) -> Iterator[Server]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if context is not None else "http"
    try:
        yield Server(f"{scheme}://127.0.0.1:{server.server_address[1]}", script)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def script() -> Script:
    return Script([(200, {"ok": True})])


@pytest.fixture
def server(script: Script) -> Iterator[Server]:
    yield from _serve(script)


def closed_port_url() -> str:
    """A URL on 127.0.0.1 nothing listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def gateway_get(client: httpx.Client, path: str) -> httpx.Response:
    """One request as the gateway clients make it: an error answer or none becomes a ``ClientError``."""
    try:
        response = client.get(path)
    except httpx.TransportError as exc:
        raise gateway_unreachable("GET", path, str(exc)) from exc
    if not response.is_success:
        raise gateway_failure("GET", path, response, auth_hint=" (hint)")
    return response


# --- backoff ---------------------------------------------------------------------------------------------


def test_backoff__doubles_from_the_first_delay_up_to_its_cap() -> None:
    runner = Backoff(first_seconds=1.0, max_seconds=10.0)
    octl = Backoff(first_seconds=0.5)
    agent = Backoff(first_seconds=2.0, max_seconds=64.0, max_doublings=5, jitter=True)

    assert [1.0, 2.0, 4.0, 8.0, 10.0, 10.0] == [runner.delay(n) for n in range(1, 7)]
    assert [0.5, 1.0] == [octl.delay(n) for n in (1, 2)]
    assert Backoff(first_seconds=2.0, max_doublings=5).delay(9) == 64.0
    for n in range(1, 10):
        full = min(64.0, 2.0**n)
        assert full / 2 <= agent.delay(n) <= full


# --- retries against a real server -----------------------------------------------------------------------


def test_retry__transient_answers_are_tried_again_with_backoff(server: Server) -> None:
    server.script.answers = [(503, "busy"), (429, "slow down"), (502, "bad gateway"), (200, {"ok": True})]
    slept: list[float] = []
    retry = Retry(attempts=5, backoff=Backoff(first_seconds=1.0, max_seconds=3.0), sleep=slept.append)

    with Connection(base_url=server.url, user_agent="test", timeout_seconds=5).client() as client:
        response = retry.call(lambda: gateway_get(client, "/x"))

    assert {"ok": True} == response.json()
    assert 4 == len(server.script.paths)
    assert [1.0, 2.0, 3.0] == slept


def test_retry__a_final_answer_is_not_repeated_and_attempts_run_out(server: Server) -> None:
    slept: list[float] = []
    retry = Retry(attempts=3, backoff=Backoff(first_seconds=0.5), sleep=slept.append)

    with Connection(base_url=server.url, user_agent="test", timeout_seconds=5).client() as client:
        server.script.answers = [(404, {"error": "API-404", "message": "no such thing"})]
        with pytest.raises(ClientError, match="no such thing") as final:
            retry.call(lambda: gateway_get(client, "/missing"))
        assert (404, False, []) == (final.value.status_code, final.value.retryable, slept)

        server.script.answers = [(500, "boom")]
        with pytest.raises(ClientError, match="answered 500") as exhausted:
            retry.call(lambda: gateway_get(client, "/broken"))

    assert exhausted.value.retryable
    assert ["/missing", "/broken", "/broken", "/broken"] == server.script.paths
    assert [0.5, 1.0] == slept


def test_retry__a_deadline_allows_attempts_beyond_the_count(server: Server) -> None:
    server.script.answers = [(503, "busy")] * 5 + [(200, {"ok": True})]
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    retry = Retry(attempts=1, backoff=Backoff(first_seconds=1.0), sleep=sleep, clock=lambda: now[0])

    with Connection(base_url=server.url, user_agent="test", timeout_seconds=5).client() as client:
        with pytest.raises(ClientError, match="503"):
            retry.call(lambda: gateway_get(client, "/a"))
        assert 1 == len(server.script.paths)
        # 1 + 2 + 4 + 8 s of waits end before the deadline of 20 s; the fifth attempt answers.
        response = retry.call(lambda: gateway_get(client, "/b"), deadline=now[0] + 20.0)

    assert 200 == response.status_code
    assert 15.0 == now[0]


def test_retry__only_the_errors_it_is_for_and_on_retry_hears_each() -> None:
    """octl's policy: a connection that failed is tried again, an answered 503 is not."""
    retried: list[ClientError] = []
    retry = Retry(attempts=3, backoff=Backoff(first_seconds=0.1), on=UnavailableError, sleep=lambda _: None)

    with Connection(base_url=closed_port_url(), user_agent="test", timeout_seconds=5).client() as client:
        with pytest.raises(UnavailableError, match="GET /x failed: ") as caught:
            retry.call(lambda: gateway_get(client, "/x"), on_retry=retried.append)

    assert caught.value.retryable and caught.value.status_code is None
    assert 2 == len(retried) and all(isinstance(e, UnavailableError) for e in retried)
    answered_503 = ClientError("busy", status_code=503)
    assert answered_503.retryable and retry.delay_after(answered_503, 1, None) is None


# --- the error tree --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "kind", "retryable"),
    [
        ((401, {"error": "API-401", "message": "who are you"}), AuthError, False),
        ((403, "forbidden"), AuthError, False),
        ((400, {"error": "API-400", "message": results.RUNNER_TOKEN_INVALID}), AuthError, False),
        ((400, {"error": "API-400", "message": "bad field"}), ClientError, False),
        ((503, {"error": "API-503", "message": "database unavailable"}), ClientError, True),
    ],
)
def test_gateway_failure__auth_and_retryable(
    server: Server, answer: Answer, kind: type[ClientError], retryable: bool
) -> None:
    server.script.answers = [answer]

    with Connection(base_url=server.url, user_agent="test", timeout_seconds=5).client() as client:
        with pytest.raises(ClientError) as caught:
            gateway_get(client, "/p")

    assert type(caught.value) is kind
    assert (answer[0], retryable) == (caught.value.status_code, caught.value.retryable)
    assert caught.value.message.startswith(f"GET /p: the runner gateway answered {answer[0]} ")
    assert caught.value.message.endswith(" (hint)") == (kind is AuthError)


def test_read_answer__the_servers_error_object_or_its_text() -> None:
    request = httpx.Request("GET", "http://x/")
    body = {"error": "API-409", "message": "taken", "details": {"field": "id"}}
    answer = read_answer(httpx.Response(409, json=body, request=request))
    assert ("API-409", "taken", {"field": "id"}) == (answer.error, answer.message, answer.details)

    text = read_answer(httpx.Response(502, text="  <html>bad gateway</html>\n", request=request))
    assert ("<html>bad gateway</html>", None, None) == (text.text, text.message, text.error)
    assert None is read_answer(httpx.Response(400, json=["no"], request=request)).message
    assert 500 == len(read_answer(httpx.Response(500, text="x" * 900, request=request)).text)


def test_errors__one_tree_for_the_three_clients(server: Server) -> None:
    """octl's errors are in the same tree: a 401 is an ``ApiError`` and an ``AuthError``, an unreachable
    API an ``ApiConnectionError`` and an ``UnavailableError``; the body is the server's error object."""
    server.script.answers = [(401, {"error": "API-401", "message": "token not known", "details": {"a": 1}})]
    with ApiClient(server.url, "t0ken") as api, pytest.raises(ApiError) as refused:
        api.get_org("acme")

    assert isinstance(refused.value, ApiAuthError) and isinstance(refused.value, AuthError)
    assert (401, "API-401", {"a": 1}) == (refused.value.status, refused.value.error, refused.value.details)
    assert "unauthenticated: token not known" == str(refused.value)
    assert "Bearer t0ken" == server.script.headers[0]["authorization"]
    assert "octl" == server.script.headers[0]["user-agent"]

    url = closed_port_url()
    with ApiClient(url, None) as api, pytest.raises(ApiConnectionError) as unreachable:
        api.get_org("acme")
    assert isinstance(unreachable.value, UnavailableError) and unreachable.value.retryable
    assert unreachable.value.message.startswith(f"cannot reach the API at {url}: ")
    assert not isinstance(unreachable.value, ApiError)
    assert issubclass(ClientError, errors.OrchestratorError)


# --- TLS -------------------------------------------------------------------------------------------------


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority("client-base-ca")


def _server_context(ca: CertificateAuthority, tmp_path: Path, *, require_client_cert: bool) -> ssl.SSLContext:
    serving = ca.issue("localhost", server=True)
    (tmp_path / "server.crt").write_bytes(serving.cert_pem)
    (tmp_path / "server.key").write_bytes(serving.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=ca.pem.decode())
    return context


@pytest.fixture
def tls_server(ca: CertificateAuthority, tmp_path: Path, script: Script) -> Iterator[Server]:
    yield from _serve(script, _server_context(ca, tmp_path, require_client_cert=False))


@pytest.fixture
def mtls_server(ca: CertificateAuthority, tmp_path: Path, script: Script) -> Iterator[Server]:
    yield from _serve(script, _server_context(ca, tmp_path, require_client_cert=True))


def _get(connection: Connection) -> int:
    with connection.client() as client:
        return gateway_get(client, "/").status_code


def test_tls__the_extra_ca_as_a_file_or_as_pem_text(
    tls_server: Server, ca: CertificateAuthority, tmp_path: Path
) -> None:
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    gateway = RunnerGateway(url=tls_server.url, org_id="o", runner_id="r")

    with pytest.raises(UnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(gateway.connection(user_agent="test"))
    by_file = RunnerGateway(
        url=tls_server.url, org_id="o", runner_id="r", tls=GatewayTls(ca_file=tmp_path / "ca.pem")
    )
    by_text = RunnerGateway(
        url=tls_server.url, org_id="o", runner_id="r", tls=GatewayTls(ca_pem=ca.pem.decode())
    )

    assert 200 == _get(by_file.connection(user_agent="test"))
    assert 200 == _get(by_text.connection(user_agent="test"))
    assert ["test"] * 2 == [h["user-agent"] for h in tls_server.script.headers]


def test_tls__mtls_presents_the_client_pair(
    mtls_server: Server, ca: CertificateAuthority, tmp_path: Path
) -> None:
    client = ca.issue("agent", server=False)
    (tmp_path / "client.crt").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    ca_only = GatewayTls(ca_pem=ca.pem.decode())
    pair = GatewayTls(
        ca_pem=ca.pem.decode(),
        client_cert_file=tmp_path / "client.crt",
        client_key_file=tmp_path / "client.key",
    )

    with pytest.raises(UnavailableError):
        _get(Connection(base_url=mtls_server.url, user_agent="test", timeout_seconds=5, tls=ca_only))
    assert 200 == _get(Connection(base_url=mtls_server.url, user_agent="test", timeout_seconds=5, tls=pair))
    with pytest.raises(errors.ConfigurationError, match="mTLS client pair"):
        Connection(
            base_url=mtls_server.url,
            user_agent="test",
            timeout_seconds=5,
            tls=GatewayTls(client_cert_file=tmp_path / "client.key", client_key_file=tmp_path / "client.key"),
        ).client()


def test_tls__plain_http_loads_no_ca_bundle(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    verify = client_verify("http")
    assert isinstance(verify, ssl.SSLContext) and [] == verify.get_ca_certs()
    assert client_verify("https") is True
    assert client_verify("http", GatewayTls()) is not True
    assert 200 == _get(Connection(base_url=server.url, user_agent="test", timeout_seconds=5))


def test_runner_gateway__routes_below_the_url_path() -> None:
    default = RunnerGateway(url="https://po.example", org_id="acme", runner_id="r1")
    upstream = RunnerGateway(url="https://gw.example/runner-gateway/", org_id="acme", runner_id="r1")

    assert "/runner-gateway/v1/orgs/acme/runners/r1/deployments/d1/bundle" == default.path(
        results.bundle_path, "d1"
    )
    assert default.path(results.bundle_path, "d1") == upstream.path(results.bundle_path, "d1")
    assert "https://gw.example" == upstream.connection(user_agent="x").base_url
