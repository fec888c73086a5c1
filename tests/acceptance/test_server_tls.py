"""``orchestrator serve`` terminating TLS itself (PO_TLS_CERT_FILE, PO_TLS_KEY_FILE), as a real process with
certificates of a throwaway CA: a local runner and a ``kubernetes-agent`` agent (``po-runner remote``, the
stand-in Kubernetes API, its runner Job) verify it with RUNNER_GATEWAY_CA; the certificate is rotated
(new certificate, same CA, files replaced as cert-manager does) while the agent polls, new connections
get the new one and the agent carries on; SIGHUP reloads at once; a pair that does not load changes
nothing; and the runner gateway's client certificate requirement (PO_TLS_CLIENT_CA_FILE)."""

from __future__ import annotations

import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol
from tests.support.kube_agent import NAMESPACE, agent_runner, start_agent
from tests.support.kube_api import CertificateAuthority, KubeApiServer, runner_image
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.served_tls import install, served_serial
from tests.support.stack import build_stack, runner_body

pytestmark = [pytest.mark.slow, pytest.mark.spread]


def eventually(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def tls_server(
    database_url: str, tmp_path: Path, ca: CertificateAuthority, **environment: str
) -> ServerProcess:
    tls_dir = tmp_path / "tls"
    return ServerProcess(
        database_url,
        tmp_path / "data",
        https_ca=ca.pem.decode(),
        PO_TLS_CERT_FILE=str(tls_dir / "tls.crt"),
        PO_TLS_KEY_FILE=str(tls_dir / "tls.key"),
        PO_LOG_LEVEL="info",
        **environment,
    )


def test_builtin_tls__runner_and_agent_verify_it__rotated_while_the_agent_polls(
    database_url: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority("po-ca")
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    first = install(ca.issue("127.0.0.1", server=True), tmp_path / "tls")
    server = tls_server(
        database_url,
        tmp_path,
        ca,
        PO_TLS_RELOAD_INTERVAL_SECONDS="0.2",
        PO_AGENT_FETCH_WAIT_SECONDS="5",
        PO_AGENT_PRESENCE_INTERVAL_SECONDS="0",
    )
    server.start()
    tf_config = tmp_path / "terraformrc"
    private_pem, public_pem = agent_auth.generate_key_pair()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    try:
        served_first = served_serial(server.port, ca)
        # The local runner trusts the CA by RUNNER_GATEWAY_CA in its job environment.
        stack = build_stack(
            server.url,
            tmp_path,
            runner=runner_body(tf_config, RUNNER_GATEWAY_CA=ca.pem.decode()),
            verify=server.verify,
        )
        by_local = stack.deploy()
        # Project cart deploys through the agent runner "cluster".
        for path, body in [
            ("/runners", {"id": "cluster", **agent_runner(public_pem, tf_config)}),
            ("/projects", {"id": "cart"}),
            ("/runner-rules", {"runner_id": "cluster", "project_id": "cart"}),
            ("/projects/cart/envs", {"id": "dev", "env_type_id": "development"}),
        ]:
            created = stack.client.post(f"/orgs/{stack.org}{path}", json=body)
            assert 201 == created.status_code, (path, created.text)
        with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), images=images) as api:
            # The agent trusts the CA by its file; the Jobs it launches get it as RUNNER_GATEWAY_CA.
            agent = start_agent(
                server.url,
                private_pem,
                api,
                tmp_path,
                RUNNER_ID="cluster",
                RUNNER_GATEWAY_CA_FILE=str(tmp_path / "ca.pem"),
            )
            try:
                before = stack.deploy(project_id="cart")
                polled = stack.client.get(f"/orgs/{stack.org}/runners/cluster").json()["status"]
                second = install(ca.issue("127.0.0.1", server=True), tmp_path / "tls")
                eventually(
                    lambda: served_serial(server.port, ca) == second, "the new certificate was never served"
                )
                after = stack.deploy(project_id="cart")
                jobs = sorted(job["metadata"]["name"] for job in api.objects("jobs", NAMESPACE))
                still_running = agent.process is not None and agent.process.poll() is None
            finally:
                code = agent.stop()
        stack.client.close()
    finally:
        server.stop()

    output = agent.output()
    assert served_first == first
    assert "succeeded" == by_local["status"], by_local.get("status_message")
    assert "succeeded" == before["status"], (before.get("status_message"), output[-3000:])
    assert polled["last_seen_at"] is not None
    # The agent carried on through the rotation: the same process, polling and launching.
    assert "succeeded" == after["status"], (after.get("status_message"), output[-3000:])
    assert sorted([before["id"], after["id"]]) == jobs
    assert still_running and 0 == code, output[-2000:]
    assert "CERTIFICATE_VERIFY_FAILED" not in output
    assert "TLS certificate reloaded" in server.log.read_text()


def test_builtin_tls__sighup_reloads_and_a_broken_pair_changes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority("po-ca")
    first = install(ca.issue("127.0.0.1", server=True), tmp_path / "tls")
    # Checked only on SIGHUP within the test.
    server = tls_server(database_url, tmp_path, ca, PO_TLS_RELOAD_INTERVAL_SECONDS="3600")
    server.start()
    assert server.process is not None
    try:
        second = install(ca.issue("127.0.0.1", server=True), tmp_path / "tls")
        not_yet = served_serial(server.port, ca)
        server.process.send_signal(signal.SIGHUP)
        eventually(lambda: served_serial(server.port, ca) == second, "SIGHUP did not reload the certificate")
        # A certificate with another certificate's key (a rotation half done): the served pair stays.
        third = ca.issue("127.0.0.1", server=True)
        (tmp_path / "tls" / "tls.crt").write_bytes(third.cert_pem)
        server.process.send_signal(signal.SIGHUP)
        eventually(
            lambda: "TLS files not reloaded" in server.log.read_text(), "the broken pair was not noticed"
        )
        kept = served_serial(server.port, ca)
        health = httpx.get(f"{server.url}/healthz", verify=server.verify)
        alive = server.running
    finally:
        server.stop()

    assert first == not_yet
    assert second == kept
    assert 200 == health.status_code
    assert alive
    log = server.log.read_text()
    assert "does not match" in log or "KEY_VALUES_MISMATCH" in log or "key values mismatch" in log, log[
        -2000:
    ]


def test_builtin_tls__client_certificate_required_on_the_gateway_only(
    database_url: str, tmp_path: Path
) -> None:
    ca, clients = CertificateAuthority("po-ca"), CertificateAuthority("po-clients")
    install(ca.issue("127.0.0.1", server=True), tmp_path / "tls")
    (tmp_path / "clients.pem").write_bytes(clients.pem)
    client_pair = clients.issue("runner", server=False)
    (tmp_path / "client.crt").write_bytes(client_pair.cert_pem)
    (tmp_path / "client.key").write_bytes(client_pair.key_pem)
    stranger = CertificateAuthority("stranger").issue("runner", server=False)
    (tmp_path / "stranger.crt").write_bytes(stranger.cert_pem)
    (tmp_path / "stranger.key").write_bytes(stranger.key_pem)
    server = tls_server(database_url, tmp_path, ca, PO_TLS_CLIENT_CA_FILE=str(tmp_path / "clients.pem"))
    server.start()

    def with_client(cert: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=ca.pem.decode())
        context.load_cert_chain(tmp_path / f"{cert}.crt", tmp_path / f"{cert}.key")
        return context

    poll = server.url + protocol.next_command_path("acme", "local")
    try:
        without = httpx.post(poll, verify=server.verify)
        with_cert = httpx.post(poll, verify=with_client("client"))
        probes = [
            httpx.get(f"{server.url}{p}", verify=server.verify).status_code for p in ("/healthz", "/readyz")
        ]
        api = httpx.get(
            f"{server.url}/orgs", headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, verify=server.verify
        )
        with pytest.raises(httpx.TransportError):
            httpx.post(poll, verify=with_client("stranger"))
        # A runner with the client pair (RUNNER_GATEWAY_CLIENT_CERT_FILE/KEY_FILE) runs a deployment.
        runner = runner_body(
            tmp_path / "terraformrc",
            RUNNER_GATEWAY_CA=ca.pem.decode(),
            RUNNER_GATEWAY_CLIENT_CERT_FILE=str(tmp_path / "client.crt"),
            RUNNER_GATEWAY_CLIENT_KEY_FILE=str(tmp_path / "client.key"),
        )
        stack = build_stack(server.url, tmp_path, runner=runner, verify=server.verify)
        deployed = stack.deploy()
        stack.client.close()
    finally:
        server.stop()

    assert 401 == without.status_code, without.text
    assert "requires a client certificate" in without.json()["message"]
    # Past the certificate check: the agent's JWT is what is missing now.
    assert 401 == with_cert.status_code
    assert "client certificate" not in with_cert.json()["message"]
    assert [200, 200] == probes
    assert 200 == api.status_code, api.text
    assert "succeeded" == deployed["status"], deployed.get("status_message")
