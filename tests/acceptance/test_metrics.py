"""``GET /metrics`` scraped before, during and after real deployments on the embedded default (a server on
SQLite or PostgreSQL, a local `vm` runner, the embedded engine; an agent `vm` runner with a real
``po-runner remote``): each family moves as the work done says, and no label holds an id."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.protocol import age, agent_auth
from orchestrator.protocol import commands as protocol
from orchestrator.settings import ServerSettings
from tests.support.agent_process import AgentProcess
from tests.support.metrics import ID_LIKE, Scrape, scrape
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest, runner_body, running_server

pytestmark = pytest.mark.slow

DEPLOYMENTS = "/orgs/{org_id}/deployments"


def gated_module(gate: Path) -> str:
    """The demo module, whose first resource waits (at most a minute) for the file ``gate/go``, having
    made ``gate/started``: the deployment executes until the test lets it go on."""
    code: str = yaml.safe_load((EXAMPLES / "module.yaml").read_text())["module_source_code"]
    wait = f"touch {gate}/started; for i in $(seq 600); do [ -f {gate}/go ] && break; sleep 0.1; done"
    return code.replace(
        'input = "bucket-${var.name}"',
        f'input = "bucket-${{var.name}}"\n  provisioner "local-exec" {{\n    command = "{wait}"\n  }}',
    )


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def create(stack: Stack) -> str:
    """Start a deployment of the demo manifest (its outputs encrypted to a fresh key); its id."""
    _identity, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
        },
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


@pytest.fixture
def server_url(settings: ServerSettings) -> Iterator[str]:
    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
                # Retention rounds every second, deleting outputs and objects a second after their
                # deployment finished.
                "cleanup_interval_seconds": 1.0,
                "outputs_retention_seconds": 1.0,
                "object_retention_days": 1 / 86400,
            }
        )

    with running_server(make) as url:
        yield url


def ssh_runner_to_loopback() -> dict[str, Any]:
    """A vm runner over SSH to ``localhost``, which resolves into the denied networks: its launch fails."""
    body: dict[str, Any] = yaml.safe_load(
        (EXAMPLES.parent.parent / "tests/data/runners/vm-ssh.yaml").read_text()
    )
    body["runner_configuration"]["connection"]["host"] = "localhost"
    body["state_storage_configuration"] = {"type": "orchestrator"}
    return body


def test_metrics__each_family_moves_with_a_real_deployment(server_url: str, tmp_path: Path) -> None:
    metrics_url = f"{server_url}/metrics"
    for org in ("acme", "beta"):
        (tmp_path / org).mkdir()
    stack = build_stack(server_url, tmp_path / "acme")
    gate = tmp_path / "gate"
    gate.mkdir()
    patched = stack.client.patch(
        f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": gated_module(gate)}
    )
    assert 200 == patched.status_code, patched.text
    failing = build_stack(server_url, tmp_path / "beta", org="beta", runner=ssh_runner_to_loopback())
    before = scrape(metrics_url)

    deployment_id = create(stack)
    wait_for(lambda: (gate / "started").exists(), "the runner's Terraform to start")
    during = scrape(metrics_url)
    (gate / "go").touch()
    finished = stack.wait(deployment_id)
    assert "succeeded" == finished["status"], finished["status_message"]
    failed = failing.wait(create(failing))
    assert "failed" == failed["status"]
    # Retention: the failed deployment's bundle (no successful change keeps it), and the outputs.
    after: Scrape = wait_for(
        lambda: (
            (s := scrape(metrics_url)).value("po_retention_deleted_total", kind="outputs")
            > before.value("po_retention_deleted_total", kind="outputs")
            and s.value("po_retention_deleted_total", kind="object")
            > before.value("po_retention_deleted_total", kind="object")
            and s
        ),
        "the retention worker",
    )
    stack.client.close()
    failing.client.close()

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    # Deployments: created, running (a gauge: 1 while the runner waits at the gate, back to 0), finished.
    assert 2 == delta("po_deployments_created_total", runner_type="vm")
    assert (1.0, 0.0) == (
        during.value("po_deployments_running", runner_type="vm"),
        after.value("po_deployments_running", runner_type="vm"),
    )
    assert (1, 1) == (
        delta("po_deployments_finished_total", runner_type="vm", status="succeeded"),
        delta("po_deployments_finished_total", runner_type="vm", status="failed"),
    )
    # Dispatch: the launched deployment's latency observed once; the SSH launch refused by the egress
    # policy counted as a launch failure.
    assert 1 == delta("po_dispatch_latency_seconds_count", runner_type="vm")
    assert delta("po_dispatch_latency_seconds_sum", runner_type="vm") > 0
    assert 1 == delta("po_dispatch_launch_failures_total", reason="launch_error"), {
        reason: delta("po_dispatch_launch_failures_total", reason=reason)
        for reason in ("runner_unavailable", "launch_error_retried", "internal_error")
    }
    # Requests: by route template, method and status; never by path.
    assert 2 == delta("po_http_requests_total", route=DEPLOYMENTS, method="POST", status="201")
    assert 2 == delta(
        "po_http_request_duration_seconds_count", route=DEPLOYMENTS, method="POST", status="201"
    )
    bundle_route = "/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}/deployments/{deployment_id}/bundle"
    assert delta("po_http_requests_total", route=bundle_route, method="GET", status="200") >= 1
    assert delta("po_http_requests_total", route="/metrics", method="GET", status="200") >= 2
    # The database pools: connections were taken (and timed), and none is counted as held for ever.
    assert delta("po_db_pool_wait_seconds_count", pool="main") > 0
    assert after.value("po_db_pool_size", pool="main") >= 1
    assert (
        0
        <= after.value("po_db_pool_connections_in_use", pool="main")
        <= 2 * after.value("po_db_pool_size", pool="main")
    )
    # Retention work done.
    assert delta("po_retention_deleted_total", kind="outputs") >= 1
    assert delta("po_retention_deleted_total", kind="object") >= 1
    assert_bounded_labels(after)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape_agent(url: str) -> Scrape | None:
    """The agent's metrics; None while it does not answer yet."""
    try:
        return scrape(url)
    except httpx.TransportError:
        return None


def assert_bounded_labels(found: Scrape, *, requests: bool = True) -> None:
    """No label value looks like an id, nor names an organization, and routes are templates."""
    suspicious = sorted(
        (name, label, value)
        for name, label, value in found.label_values()
        if ID_LIKE.search(value) or value in ("acme", "beta") or "/orgs/acme" in value
    )
    assert [] == suspicious
    if not requests:
        return
    routes = {value for _name, label, value in found.label_values() if label == "route"}
    assert routes, "no request was counted"
    assert all(route == "unmatched" or route.startswith("/") for route in routes), routes


@pytest.fixture
def agent_server(settings: ServerSettings) -> Iterator[str]:
    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "agent_fetch_wait_seconds": 2.0,
                "agent_lease_seconds": 1.0,
                "agent_poll_fallback_seconds": 0.1,
                "agent_public_key_cache_seconds": 0,
                # The command of runner "orphan", which no agent runs, expires.
                "agent_command_ttl_seconds": 6.0,
            }
        )

    with running_server(make) as url:
        yield url


def test_metrics__agent_commands_and_long_polls(agent_server: str, tmp_path: Path) -> None:
    metrics_url = f"{agent_server}/metrics"
    private_pem, public_pem = agent_auth.generate_key_pair()
    for org in ("acme", "orphan"):
        (tmp_path / org).mkdir()
    (tmp_path / "terraformrc").touch()
    body = runner_body(tmp_path / "terraformrc")
    body["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    stack = build_stack(agent_server, tmp_path / "acme", runner=body)
    orphan = build_stack(agent_server, tmp_path / "orphan", org="orphan", runner=body)
    before = scrape(metrics_url)
    agent = AgentProcess(agent_server, private_pem, tmp_path)
    agent_metrics = f"http://127.0.0.1:{free_port()}/metrics"
    agent.env["AGENT_METRICS_ADDR"] = agent_metrics.removeprefix("http://").removesuffix("/metrics")
    agent.start()
    try:
        held: Scrape = wait_for(
            lambda: (s := scrape(metrics_url)).value("po_agent_long_polls") >= 1 and s,
            "the agent's long poll",
        )
        deployment = stack.wait(create(stack))
        # The agent's own view: its runner process exited (counted once it was reaped).
        seen: Scrape = wait_for(
            lambda: (
                (s := scrape_agent(agent_metrics)) is not None
                and s.value("po_agent_runs_finished_total", outcome="succeeded")
                and s
            ),
            "the agent to see its run end",
        )
    finally:
        agent.stop()
    assert "succeeded" == deployment["status"], deployment["status_message"]
    assert 1 == seen.value("po_agent_runs_launched_total", kind="local")
    assert 1 == seen.value("po_agent_commands_received_total")
    assert seen.value("po_agent_polls_total", result="command") >= 1
    assert seen.value("po_agent_command_answers_total", answer="ack") >= 1
    assert (0, 0, 0) == (
        seen.value("po_agent_runs_finished_total", outcome="failed"),
        seen.value("po_agent_launch_failures_total", terminal="true"),
        seen.value("po_agent_commands_refused_total"),
    )
    assert_bounded_labels(seen, requests=False)

    # Runner "orphan" of organization "orphan": a command delivered to a poll that never answers comes
    # again after its lease; past its TTL it expires and its deployment fails.
    orphan_id = create(orphan)
    key = agent_auth.load_private_key(private_pem)
    path = f"{agent_server}{protocol.next_command_path('orphan', 'local')}"

    def poll() -> httpx.Response:
        token = agent_auth.sign(key, "orphan", "local")
        return httpx.post(path, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    first = wait_for(lambda: (r := poll()).status_code == 200 and r, "the orphan's command")
    again = wait_for(lambda: (r := poll()).status_code == 200 and r, "the orphan's command again")
    expired = orphan.wait(orphan_id)
    after: Scrape = wait_for(
        lambda: (s := scrape(metrics_url)).value("po_agent_long_polls") == 0 and s, "the long polls to end"
    )
    stack.client.close()
    orphan.client.close()

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert (1, 2) == (first.json()["attempt"], again.json()["attempt"])
    assert "COMMAND_EXPIRED" == expired["error"]["error"], expired
    assert held.value("po_agent_long_polls") >= 1
    assert 2 == delta("po_agent_commands_queued_total")
    # The agent's command (once, or again if its ack came after the lease) and the orphan's twice.
    assert delta("po_agent_commands_delivered_total") >= 3
    assert delta("po_agent_command_redeliveries_total") >= 1
    assert 1 == delta("po_agent_commands_expired_total")
    assert 0 == after.value("po_agent_commands_pending")
    assert (1, 1) == (
        delta("po_deployments_finished_total", runner_type="vm", status="succeeded"),
        delta("po_deployments_finished_total", runner_type="vm", status="failed"),
    )
    long_poll = "/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}/commands/next"
    assert delta("po_http_requests_total", route=long_poll, method="POST", status="200") >= 3
    assert_bounded_labels(after)
