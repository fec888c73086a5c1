"""The gateway CA as the agent hands it on: checked when the agent starts, given to Kubernetes Jobs as PEM
text (``RUNNER_GATEWAY_CA``) in their pod template, and trusted by the runner from that text alone (a real
TLS server whose certificate that CA signed). The one TLS builder both clients use is ``client.tls``."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube.resources.batch_v1 import Job
from pydantic import SecretStr, ValidationError

from orchestrator import errors
from orchestrator.agent.client import AgentClient
from orchestrator.agent.kubernetes import COMMAND_ANNOTATION, _unstarted_run, job_with_agent_additions
from orchestrator.agent.settings import AgentSettings
from orchestrator.client.errors import UnavailableError
from orchestrator.client.gateway import RunnerGateway
from orchestrator.client.tls import GatewayTls, gateway_verify
from orchestrator.protocol import agent_auth
from orchestrator.runner.gateway_client import GatewayClient, runner_retry
from orchestrator.runner.settings import RunnerSettings
from tests.support.kube_api import CertificateAuthority

BUNDLE = b"tar.gz bytes"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BUNDLE)))
        self.end_headers()
        self.wfile.write(BUNDLE)

    def do_POST(self) -> None:  # commands/next: nothing for the agent
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority("gateway-ca")


@pytest.fixture
def gateway(ca: CertificateAuthority, tmp_path: Path) -> Iterator[str]:
    """A real HTTPS server on 127.0.0.1 whose certificate ``ca`` signed."""
    serving = ca.issue("localhost", server=True)
    (tmp_path / "server.crt").write_bytes(serving.cert_pem)
    (tmp_path / "server.key").write_bytes(serving.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def runner_settings(gateway_url: str, **values: Any) -> RunnerSettings:
    return RunnerSettings(
        org_id="acme",
        runner_id="r",
        deployment_id="d1",
        mode="deploy",
        token=SecretStr("t"),
        runner_gateway_url=gateway_url,
        **values,
    )


def agent_settings(**values: Any) -> AgentSettings:
    return AgentSettings(
        org_id="acme",
        runner_id="r",
        private_key=SecretStr("k"),
        runner_gateway_url="https://po.test",
        **values,
    )


# --- the runner trusts the CA given as PEM text ---------------------------------------------------------


def test_runner__trusts_a_gateway_signed_by_the_ca_given_only_as_pem_text(
    gateway: str, ca: CertificateAuthority
) -> None:
    settings = runner_settings(gateway, runner_gateway_ca=ca.pem.decode())

    with GatewayClient(
        gateway=RunnerGateway(url=gateway, org_id="acme", runner_id="r", tls=settings.gateway_tls()),
        token=settings.token,
    ) as client:
        assert client.download_bundle("d1") == BUNDLE


def test_runner__without_the_ca_the_gateway_is_not_trusted(gateway: str) -> None:
    settings = runner_settings(gateway)

    with (
        GatewayClient(
            gateway=RunnerGateway(url=gateway, org_id="acme", runner_id="r", tls=settings.gateway_tls()),
            token=settings.token,
            retry=runner_retry(attempts=1),
        ) as client,
        pytest.raises(UnavailableError, match=r"certificate verify failed for 127\.0\.0\.1"),
    ):
        client.download_bundle("d1")


def test_runner__the_ca_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, ca: CertificateAuthority
) -> None:
    monkeypatch.setenv("RUNNER_GATEWAY_CA", ca.pem.decode())
    settings = runner_settings("https://po.test")

    assert settings.gateway_tls().ca_pem == ca.pem.decode()


def test_runner__a_ca_that_is_not_a_pem_certificate_is_refused() -> None:
    with pytest.raises(ValidationError, match="runner_gateway_ca"):
        runner_settings("https://po.test", runner_gateway_ca="not a certificate")


async def test_agent_client__trusts_the_gateway_through_its_ca_file(
    gateway: str, ca: CertificateAuthority, tmp_path: Path
) -> None:
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    settings = agent_settings(runner_gateway_ca_file=tmp_path / "ca.pem")
    private_pem, _ = agent_auth.generate_key_pair()
    client = AgentClient(
        gateway=RunnerGateway(url=gateway, org_id="acme", runner_id="r", tls=settings.gateway_tls()),
        private_key=agent_auth.load_private_key(private_pem),
    )
    try:
        assert await client.next_command() is None
    finally:
        await client.aclose()


# --- the shared TLS builder ------------------------------------------------------------------------------


def test_gateway_verify__defaults_and_errors(tmp_path: Path, ca: CertificateAuthority) -> None:
    (tmp_path / "ca.pem").write_bytes(ca.pem)

    assert gateway_verify(None) is True
    assert gateway_verify(GatewayTls()) is True
    assert isinstance(gateway_verify(GatewayTls(ca_file=tmp_path / "ca.pem")), ssl.SSLContext)
    assert isinstance(gateway_verify(GatewayTls(ca_pem=ca.pem.decode())), ssl.SSLContext)
    with pytest.raises(errors.ConfigurationError, match="both RUNNER_GATEWAY_CLIENT_CERT_FILE"):
        gateway_verify(GatewayTls(client_cert_file=tmp_path / "c.crt"))
    with pytest.raises(errors.ConfigurationError, match="RUNNER_GATEWAY_CA_FILE"):
        gateway_verify(GatewayTls(ca_file=tmp_path / "missing.pem"))


# --- the agent's settings --------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [None, b"not a certificate", b"-----BEGIN CERTIFICATE-----\nxx\n"])
def test_agent_settings__the_ca_file_must_be_a_readable_pem_certificate(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)

    with pytest.raises(ValidationError, match="RUNNER_GATEWAY_CA_FILE must be a readable PEM certificate"):
        agent_settings(runner_gateway_ca_file=path)


def test_agent_settings__runners_get_the_ca_never_a_key(tmp_path: Path, ca: CertificateAuthority) -> None:
    client = ca.issue("agent", server=False)
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    (tmp_path / "client.crt").write_bytes(client.cert_pem)
    (tmp_path / "client.key").write_bytes(client.key_pem)
    private_pem, _ = agent_auth.generate_key_pair()
    settings = AgentSettings(
        org_id="acme",
        runner_id="r",
        private_key=SecretStr(private_pem),
        runner_gateway_url="https://po.test",
        runner_gateway_ca_file=tmp_path / "ca.pem",
        runner_gateway_client_cert_file=tmp_path / "client.crt",
        runner_gateway_client_key_file=tmp_path / "client.key",
    )

    local, kubernetes = settings.runner_environment(), settings.kubernetes_runner_environment()
    # A local run as another user (AGENT_RUN_USER) may not read the agent's files: the PEM text.
    other_user = settings.runner_environment(other_user=True)

    assert local == {"RUNNER_GATEWAY_CA_FILE": str(tmp_path / "ca.pem")}
    assert kubernetes == other_user == {"RUNNER_GATEWAY_CA": ca.pem.decode()}
    for value in [*local.values(), *kubernetes.values()]:
        assert "PRIVATE KEY" not in value and private_pem not in value
        assert client.cert_pem.decode() not in value and str(tmp_path / "client.key") not in value
    assert agent_settings().kubernetes_runner_environment() == {}


# --- the agent's additions to the Job's pod template ----------------------------------------------------


def test_job_additions__annotation_and_environment_on_main() -> None:
    job = {"namespace": "ns", "service_account": "sa"}

    added = job_with_agent_additions(
        job, command_id="create-job:d1:1", environment={"RUNNER_GATEWAY_CA": "pem"}
    )

    assert added["pod_template"] == {
        "metadata": {"annotations": {COMMAND_ANNOTATION: "create-job:d1:1"}},
        "spec": {"containers": [{"name": "main", "env": [{"name": "RUNNER_GATEWAY_CA", "value": "pem"}]}]},
    }
    assert job == {"namespace": "ns", "service_account": "sa"}


def test_job_additions__merge_into_the_template_json_and_legacy_container_name() -> None:
    template = (
        '{"metadata": {"annotations": {"a": "b"}}, "spec": {"containers": [{"name": '
        '"platform-orchestrator-runner", "env": [{"name": "RUNNER_GATEWAY_CA", "value": "old"}, '
        '{"name": "X", "value": "1"}]}]}}'
    )

    added = job_with_agent_additions(
        {"pod_template": template}, command_id="c", environment={"RUNNER_GATEWAY_CA": "new"}
    )

    assert added["pod_template"]["metadata"]["annotations"] == {"a": "b", COMMAND_ANNOTATION: "c"}
    [container] = added["pod_template"]["spec"]["containers"]
    assert container["name"] == "platform-orchestrator-runner"
    assert container["env"] == [{"name": "X", "value": "1"}, {"name": "RUNNER_GATEWAY_CA", "value": "new"}]


# --- which Jobs a restarted agent watches again -----------------------------------------------------------


def job(*, org: str = "acme", runner: str = "r", status: dict[str, Any] | None = None, **extra: Any) -> Job:
    created = datetime.now(UTC) - timedelta(seconds=100)
    template: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": "i"}]}}
    if extra.get("command_id"):
        template["metadata"] = {"annotations": {COMMAND_ANNOTATION: extra["command_id"]}}
    # lightkube types from_dict as returning DictMixin, not the class it is called on.
    return cast(
        Job,
        Job.from_dict(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "d1",
                    "namespace": "ns",
                    "creationTimestamp": created.isoformat(),
                    "labels": {"platform-orchestrator.io/deployment-id": "d1"},
                    "annotations": {
                        "platform-orchestrator.io/org-id": org,
                        "platform-orchestrator.io/runner-id": runner,
                    },
                },
                "spec": {"template": template},
                "status": status or {"active": 1},
            }
        ),
    )


def test_unstarted_run__only_this_runners_jobs_that_have_not_started() -> None:
    now = datetime.now(UTC)

    run = _unstarted_run(job(command_id="create-job:d1:3"), "acme", "r", now=now)

    assert run is not None
    assert (run.handle, run.command_id, run.deployment_id, run.job_id) == (
        "k8s:ns:d1",
        "create-job:d1:3",
        "d1",
        "d1",
    )
    assert 99 <= run.age_seconds <= 200
    assert _unstarted_run(job(org="globex"), "acme", "r", now=now) is None
    assert _unstarted_run(job(runner="other"), "acme", "r", now=now) is None
    assert _unstarted_run(job(status={"active": 1, "ready": 1}), "acme", "r", now=now) is None
    finished = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    assert _unstarted_run(job(status=finished), "acme", "r", now=now) is None
    # A Job from before the command annotation: its command was the first one.
    legacy = _unstarted_run(job(), "acme", "r", now=now)
    assert legacy is not None and legacy.command_id == "create-job:d1:1"
