"""The agent's Kubernetes wiring: cluster access from a kubeconfig or the in-cluster service account, the
scheduling delay setting, the stuck-pod check and the background watch after launch."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from pydantic import SecretStr

from orchestrator.agent.client import AgentClient
from orchestrator.agent.kubernetes import STUCK_PREFIX, cluster_access, kubernetes_launchers, stuck_detail
from orchestrator.agent.launchers import AgentLaunchers, PermanentLaunchError
from orchestrator.agent.loop import Agent
from orchestrator.agent.settings import AgentSettings, parse_duration
from orchestrator.launchers.base import RunState, RunStatus
from orchestrator.launchers.kubernetes import KubernetesLauncher
from orchestrator.protocol import commands as protocol

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n").decode()


def kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": cluster
                        or {"server": "https://k8s:6443", "certificate-authority-data": CA},
                    },
                    {"name": "other", "cluster": {"server": "https://other:6443"}},
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
                    {"name": "x", "context": {"cluster": "other", "user": "u"}},
                ],
                "current-context": "ctx",
            }
        )
    )
    return path


# --- cluster access ------------------------------------------------------------------------------------


def test_cluster_access__kubeconfig_current_context_with_client_certificate_data(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"})

    access = cluster_access({"KUBECONFIG": str(path)})

    assert (access.server, access.certificate_authority_data) == ("https://k8s:6443", CA)
    assert (access.client_certificate_data, access.client_key_data, access.token) == (
        "Y2VydA==",
        "a2V5",
        None,
    )


def test_cluster_access__kubeconfig_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"ca")
    (tmp_path / "client.crt").write_bytes(b"cert")
    (tmp_path / "client.key").write_bytes(b"key")
    path = kubeconfig(
        tmp_path / "config",
        {"client-certificate": "client.crt", "client-key": str(tmp_path / "client.key")},
        cluster={"server": "https://k8s:6443", "certificate-authority": "ca.crt"},
    )

    access = cluster_access({"KUBECONFIG": f"{path}:/nowhere/else"})

    assert access.certificate_authority_data == base64.b64encode(b"ca").decode()
    assert access.client_certificate_data == base64.b64encode(b"cert").decode()
    assert access.client_key_data == base64.b64encode(b"key").decode()


def test_cluster_access__kubeconfig_token_and_token_file(tmp_path: Path) -> None:
    assert cluster_access({"KUBECONFIG": str(kubeconfig(tmp_path / "a", {"token": "t0k"}))}).token == "t0k"
    (tmp_path / "token").write_text("from-file\n")
    path = kubeconfig(tmp_path / "b", {"tokenFile": str(tmp_path / "token")})
    assert cluster_access({"KUBECONFIG": str(path)}).token == "from-file"


def test_cluster_access__exec_users_are_refused(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config", {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}
    )
    with pytest.raises(PermanentLaunchError, match="exec and auth-provider"):
        cluster_access({"KUBECONFIG": str(path)})


def test_cluster_access__in_cluster_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_bytes(b"cluster-ca")
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    access = cluster_access(environ, service_account=tmp_path)
    ipv6 = cluster_access({**environ, "KUBERNETES_SERVICE_HOST": "fd00::1"}, service_account=tmp_path)

    assert (access.server, access.token) == ("https://10.0.0.1:443", "sa-token")
    assert access.certificate_authority_data == base64.b64encode(b"cluster-ca").decode()
    assert ipv6.server == "https://[fd00::1]:443"


def test_cluster_access__kubeconfig_wins_over_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(b"cluster-ca")
    path = kubeconfig(tmp_path / "config", {"token": "kc"})
    environ = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": str(path),
    }

    assert cluster_access(environ, service_account=tmp_path).token == "kc"


def test_cluster_access__nothing_usable_is_a_permanent_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(PermanentLaunchError, match="no usable configuration"):
        cluster_access({}, service_account=tmp_path / "none")
    with pytest.raises(PermanentLaunchError):
        cluster_access({"KUBECONFIG": str(tmp_path / "missing")})


def test_kubernetes_launchers__one_launcher_per_command_with_the_delay(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"token": "kc"})
    factory = kubernetes_launchers({"KUBECONFIG": str(path)}, scheduling_delay_seconds=7)
    launchers = AgentLaunchers(runs_dir=tmp_path, environ={}, kubernetes=factory)

    launcher = launchers.for_command(payload("kubernetes-agent"))

    assert isinstance(launcher, KubernetesLauncher)
    assert (launcher.scheduling_delay_seconds, launcher.api.token) == (7, "kc")
    assert launchers.watches_start(payload("kubernetes-agent")) and not launchers.watches_start(payload("vm"))
    assert launchers.local_environment(payload("vm")) and not launchers.local_environment(
        payload("kubernetes-agent")
    )


# --- settings ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("1m30s", 90), ("250ms", 0.25), ("1h", 3600), ("42", 42), ("1.5s", 1.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "m", "5m junk", "-"])
def test_parse_duration__refuses_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_settings__scheduling_delay_from_the_upstream_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "ORG_ID": "acme",
        "RUNNER_ID": "r",
        "PRIVATE_KEY": "k",
        "RUNNER_GATEWAY_URL": "https://po.test",
    }.items():
        monkeypatch.setenv(name, value)
    assert AgentSettings().k8s_runner_pod_scheduling_delay == 300
    monkeypatch.setenv("K8S_RUNNER_POD_SCHEDULING_DELAY", "2m")
    assert AgentSettings().k8s_runner_pod_scheduling_delay == 120


# --- the stuck-pod check and the watch -----------------------------------------------------------------


def test_stuck_detail__only_a_pod_that_did_not_start() -> None:
    stuck = f"{STUCK_PREFIX} within 300 s: FailedScheduling: 0/1 nodes are available"
    assert stuck_detail(RunStatus(state=RunState.EXITED, detail=stuck)) == stuck
    assert stuck_detail(RunStatus(state=RunState.EXITED, exit_code=1, detail="Error")) is None
    assert (
        stuck_detail(RunStatus(state=RunState.RUNNING, detail="waiting for the runner pod to start")) is None
    )
    assert stuck_detail(RunStatus(state=RunState.UNKNOWN, detail="unreachable")) is None


def payload(runner_type: str) -> protocol.CreateJobPayload:
    spec = {
        "deployment_id": "d1",
        "env_uuid": "e",
        "mode": "deploy",
        "gateway_url": "https://po.test",
        "runner_type": runner_type,
        "token": "t",
        "job": {"namespace": "ns", "service_account": "sa"},
    }
    return protocol.CreateJobPayload.model_validate({"job_id": "d1", "namespace": "ns", "spec": spec})


class FakeLauncher:
    def __init__(self, statuses: list[RunStatus]) -> None:
        self.statuses = statuses
        self.checked = 0
        self.cancelled: list[str] = []

    async def launch(self, spec: Any) -> str:
        return "k8s:ns:d1"

    async def status(self, handle: str) -> RunStatus:
        self.checked += 1
        return self.statuses.pop(0)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        self.cancelled.append(handle)


class FakeClient:
    def __init__(self) -> None:
        self.events: list[protocol.EventEnvelope] = []

    async def send_event(self, event: protocol.EventEnvelope) -> None:
        self.events.append(event)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, FakeClient, list[float]]]:
    settings = AgentSettings(
        org_id="acme",
        runner_id="r",
        private_key=SecretStr("k"),
        runner_gateway_url="https://po.test",
        k8s_runner_pod_scheduling_delay=60,
        agent_pod_watch_interval_seconds=5,
    )
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    client = FakeClient()
    made = Agent(
        settings=settings,
        client=cast(AgentClient, client),
        launchers=AgentLaunchers(runs_dir=tmp_path, environ={}),
        sleep=sleep,
    )
    yield made, client, slept


def envelope() -> protocol.CommandEnvelope:
    now = datetime.now(UTC)
    return protocol.CommandEnvelope(
        protocol_version="v1",
        command_id="create-job:d1:1",
        organization_id="acme",
        runner_id="r",
        deployment_id="d1",
        type="create-job",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        payload={},
    )


async def test_watch__a_pod_stuck_pending_becomes_a_terminal_runner_error_and_its_job_goes(
    agent: tuple[Agent, FakeClient, list[float]],
) -> None:
    made, client, slept = agent
    detail = f"{STUCK_PREFIX} within 60 s: FailedScheduling: 0/1 nodes are available: 1 Insufficient memory."
    launcher = FakeLauncher(
        [
            RunStatus(state=RunState.UNKNOWN, detail="unreachable"),
            RunStatus(state=RunState.RUNNING, detail="the runner pod has not started after 61 s"),
            RunStatus(state=RunState.EXITED, detail=detail),
        ]
    )

    await made._watch_start(launcher, "k8s:ns:d1", envelope(), "d1")

    [event] = client.events
    assert (event.type, event.event_id) == (
        protocol.EventType.RUNNER_ERROR,
        "create-job:d1:1:runner-error-terminal",
    )
    assert event.payload == {"job_id": "d1", "code": "REMOTE_RUNNER", "message": detail, "retryable": False}
    assert launcher.cancelled == ["k8s:ns:d1"]
    assert slept == [60, 5, 5]


async def test_watch__a_started_pod_ends_the_watch_quietly(
    agent: tuple[Agent, FakeClient, list[float]],
) -> None:
    made, client, _ = agent
    launcher = FakeLauncher(
        [
            RunStatus(state=RunState.RUNNING, detail="waiting for the runner pod to start"),
            RunStatus(state=RunState.RUNNING),
        ]
    )

    await made._watch_start(launcher, "k8s:ns:d1", envelope(), "d1")

    assert (client.events, launcher.cancelled, launcher.checked) == ([], [], 2)


async def test_watch__one_per_command_and_cancelled_when_the_agent_stops(
    agent: tuple[Agent, FakeClient, list[float]],
) -> None:
    made, _, _ = agent
    never = FakeLauncher([])

    async def forever(seconds: float) -> None:
        await asyncio.Event().wait()

    made.sleep = forever
    made._watch(never, "k8s:ns:d1", envelope(), "d1")
    first = made.watches["create-job:d1:1"]
    made._watch(never, "k8s:ns:d1", envelope(), "d1")

    assert made.watches == {"create-job:d1:1": first}
    await made.stop_watching()
    assert first.cancelled() and made.watches == {}
