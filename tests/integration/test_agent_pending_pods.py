"""The agent with ``kubernetes-agent`` runs against the real gateway (in process) and the stand-in Kubernetes
API: the gateway CA reaches the Job's runner container as PEM text, and watches of pending pods survive an
agent restart (a new agent finds the Jobs launched before and reports a stuck one with the same event id)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from pydantic import SecretStr

from orchestrator.agent.client import AgentClient
from orchestrator.agent.kubernetes import COMMAND_ANNOTATION, kubernetes_launchers
from orchestrator.agent.launchers import AgentLaunchers
from orchestrator.agent.loop import Agent, Outcome
from orchestrator.agent.settings import AgentSettings
from orchestrator.client.gateway import RunnerGateway
from orchestrator.launchers.kubernetes_job import (
    DEFAULT_RUNNER_IMAGE,
)
from orchestrator.protocol import commands as protocol
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.agent_gateway import AgentHarness, gateway_settings
from tests.support.kube_api import CertificateAuthority, KubeApiServer, LocalImage
from tests.support.orgs import Org

GATEWAY = "http://po.test"
NAMESPACE = "runners"
RUNNER = "k8s"


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(gateway_settings(settings, lease_seconds=30.0))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def harness(app: FastAPI, org: Org) -> AsyncIterator[AgentHarness]:
    made = await AgentHarness.create(app, org)
    job = {"namespace": NAMESPACE, "service_account": "runner"}
    await made.add_runner(RUNNER, {"type": "kubernetes-agent", "key": made.public_pem, "job": job})
    yield made
    await made.aclose()


@pytest.fixture
def gateway_ca(tmp_path: Path) -> tuple[CertificateAuthority, Path]:
    ca = CertificateAuthority("gateway-ca")
    path = tmp_path / "gateway-ca.pem"
    path.write_bytes(ca.pem)
    return ca, path


def write_kubeconfig(api: KubeApiServer, path: Path) -> Path:
    cluster = {"server": api.url, "certificate-authority-data": api.ca_data}
    user = {"client-certificate-data": api.client_certificate_data, "client-key-data": api.client_key_data}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stand-in", "cluster": cluster}],
                "users": [{"name": "agent", "user": user}],
                "contexts": [{"name": "agent", "context": {"cluster": "stand-in", "user": "agent"}}],
                "current-context": "agent",
            }
        )
    )
    return path


class RecordingClient(AgentClient):
    """The agent's client, keeping every event it sent."""

    sent: list[protocol.EventEnvelope]

    async def send_event(self, event: protocol.EventEnvelope) -> None:
        await super().send_event(event)
        self.sent.append(event)


def make_agent(
    harness: AgentHarness,
    api: KubeApiServer,
    tmp_path: Path,
    *,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    **overrides: Any,
) -> Agent:
    """An agent of runner ``k8s`` whose cluster is the stand-in (a fresh process's view: new objects)."""
    settings = AgentSettings(
        org_id=harness.org.id,
        runner_id=RUNNER,
        private_key=SecretStr(harness.private_pem),
        runner_gateway_url=GATEWAY,
        agent_runs_dir=tmp_path / "runs",
        agent_max_backoff_seconds=0.2,
        agent_pod_watch_interval_seconds=0.1,
        **overrides,
    )
    client = RecordingClient(
        gateway=RunnerGateway(url=GATEWAY, org_id=harness.org.id, runner_id=RUNNER),
        private_key=harness.key,
        transport=httpx.ASGITransport(app=harness.app),
        poll_timeout_seconds=10,
    )
    client.sent = []
    cluster = kubernetes_launchers(
        {"KUBECONFIG": str(write_kubeconfig(api, tmp_path / "kubeconfig"))},
        scheduling_delay_seconds=settings.k8s_runner_pod_scheduling_delay,
        namespaces=settings.job_namespaces(),
    )
    launchers = AgentLaunchers(runs_dir=tmp_path / "runs", environ={}, kubernetes=cluster, cluster=cluster)
    return Agent(settings=settings, client=client, launchers=launchers, sleep=sleep)


async def never(seconds: float) -> None:
    """A sleep that does not end: the agent's watch never gets to look (it is stopped first)."""
    await asyncio.Event().wait()


async def launch(agent: Agent) -> protocol.NextCommand:
    delivered = await agent.client.next_command()
    assert delivered is not None
    assert Outcome.ACKED == await agent.handle(delivered)
    return delivered


def sent(agent: Agent) -> list[protocol.EventEnvelope]:
    assert isinstance(agent.client, RecordingClient)
    return agent.client.sent


@pytest.fixture
def stuck_api(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), schedulable=False) as api:
        yield api


def main_container(job: dict[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = next(c for c in containers if c["name"] == "main")
    return found


async def test_agent_kubernetes__the_gateway_ca_reaches_the_job_as_pem_text_and_no_key_does(
    harness: AgentHarness,
    stuck_api: KubeApiServer,
    tmp_path: Path,
    gateway_ca: tuple[CertificateAuthority, Path],
) -> None:
    ca, ca_file = gateway_ca
    client_pair = ca.issue("agent", server=False)
    (tmp_path / "client.crt").write_bytes(client_pair.cert_pem)
    (tmp_path / "client.key").write_bytes(client_pair.key_pem)
    deployment_id = await harness.deployment(runner=RUNNER)
    agent = make_agent(
        harness,
        stuck_api,
        tmp_path,
        sleep=never,
        runner_gateway_ca_file=ca_file,
        runner_gateway_client_cert_file=tmp_path / "client.crt",
        runner_gateway_client_key_file=tmp_path / "client.key",
    )
    try:
        delivered = await launch(agent)
    finally:
        await agent.stop_watching()
        await agent.client.aclose()
    [job] = stuck_api.objects("jobs", NAMESPACE)

    env = {var["name"]: var for var in main_container(job)["env"]}
    assert env["RUNNER_GATEWAY_CA"] == {"name": "RUNNER_GATEWAY_CA", "value": ca.pem.decode()}
    assert "RUNNER_GATEWAY_CA_FILE" not in env  # a path in the agent's file system means nothing there
    assert job["metadata"]["name"] == deployment_id
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations[COMMAND_ANNOTATION] == delivered.command.command_id
    # Never the agent's private key, nor its mTLS identity.
    text = json.dumps(job)
    assert "PRIVATE KEY" not in text and "PRIVATE_KEY" not in text
    assert client_pair.cert_pem.decode() not in text
    assert not {"RUNNER_GATEWAY_CLIENT_CERT_FILE", "RUNNER_GATEWAY_CLIENT_KEY_FILE"} & set(env)
    # What the agent sent (the dry-run Secret, the Job, its token Secret) passes Kubernetes' strict schemas
    # (newest and 1.30), the Job as it was sent holding the CA.
    kinds = [(s.kind, s.dry_run) for s in stuck_api.sent]
    assert kinds == [("Secret", True), ("Job", False), ("Secret", False)]
    stuck_api.assert_sent_valid()
    (sent_job,) = [s.manifest() for s in stuck_api.sent if s.kind == "Job"]
    assert {"name": "RUNNER_GATEWAY_CA", "value": ca.pem.decode()} in main_container(sent_job)["env"]
    assert main_container(sent_job)["image"] == DEFAULT_RUNNER_IMAGE
    assert sent_job["spec"]["template"]["spec"]["serviceAccountName"] == "runner"


async def test_agent_kubernetes__a_pending_pod_is_reported_by_the_agent_started_after_a_restart(
    harness: AgentHarness, stuck_api: KubeApiServer, tmp_path: Path
) -> None:
    deployment_id = await harness.deployment(runner=RUNNER)
    first = make_agent(harness, stuck_api, tmp_path, sleep=never, k8s_runner_pod_scheduling_delay=1)
    delivered = await launch(first)
    # Stopped before its watch looked at the pod (its sleep never ends).
    await first.stop_watching()
    await first.client.aclose()
    assert (await harness.get(deployment_id))["status"] == "executing"
    assert [e.type for e in sent(first)] == [protocol.EventType.JOB_CREATED]

    second = make_agent(harness, stuck_api, tmp_path, k8s_runner_pod_scheduling_delay=1)
    stop = asyncio.Event()
    running = asyncio.create_task(second.run(stop))
    try:
        deployment = await harness.final(deployment_id)
        await_gone = asyncio.get_running_loop().run_in_executor(
            None, lambda: stuck_api.wait_for(lambda: not stuck_api.objects("jobs", NAMESPACE), 20)
        )
        await await_gone
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await second.client.aclose()

    assert ("failed", "REMOTE_RUNNER") == (deployment["status"], deployment["error"]["error"])
    message = deployment["status_message"]
    assert "did not start" in message and "FailedScheduling" in message, message
    assert "Insufficient memory" in message
    [error] = [e for e in sent(second) if e.type is protocol.EventType.RUNNER_ERROR]
    # The id a watch before the restart would have used: the gateway applies it once.
    assert error.event_id == protocol.event_id(
        delivered.command.command_id, protocol.EventType.RUNNER_ERROR, retryable=False
    )
    assert error.event_id == f"create-job:{deployment_id}:1:runner-error-terminal"
    assert error.payload["retryable"] is False


async def test_agent_kubernetes__a_job_whose_pod_runs_is_not_reported_after_a_restart(
    harness: AgentHarness, tmp_path: Path
) -> None:
    sleeper = LocalImage(argv=[sys.executable, "-c", "import time; time.sleep(120)"])
    with KubeApiServer(
        tmp_path / "kube", namespaces=("default", NAMESPACE), images={DEFAULT_RUNNER_IMAGE: sleeper}
    ) as api:
        deployment_id = await harness.deployment(runner=RUNNER)
        first = make_agent(harness, api, tmp_path, sleep=never, k8s_runner_pod_scheduling_delay=0.2)
        await launch(first)
        await first.stop_watching()
        await first.client.aclose()
        await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: api.wait_for(
                lambda: any(p["status"].get("phase") == "Running" for p in api.objects("pods", NAMESPACE))
            ),
        )

        second = make_agent(harness, api, tmp_path, k8s_runner_pod_scheduling_delay=0.2)
        stop = asyncio.Event()
        running = asyncio.create_task(second.run(stop))
        try:
            for _ in range(200):
                await asyncio.sleep(0.05)
                if second.resuming is not None and second.resuming.done() and not second.watches:
                    break
            resumed = second.resuming
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
            await second.client.aclose()
        jobs = api.objects("jobs", NAMESPACE)

    assert resumed is not None and resumed.done() and resumed.exception() is None
    assert not second.watches
    assert sent(second) == []
    assert (await harness.get(deployment_id))["status"] == "executing"
    assert [job["metadata"]["name"] for job in jobs] == [deployment_id]
