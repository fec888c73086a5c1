"""The agent loop (``orchestrator.agent``) against the real gateway, in process: launch and ack, what the
launched runner receives, expired commands, permanent and transient launch errors, 401 and unreachable."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import time_machine
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from pydantic import SecretStr

from orchestrator import deployment_tokens
from orchestrator.agent.client import AgentClient
from orchestrator.agent.launchers import AgentLaunchers
from orchestrator.agent.loop import Agent, Outcome
from orchestrator.agent.settings import AgentSettings
from orchestrator.client.gateway import RunnerGateway
from orchestrator.launchers.base import launched
from orchestrator.launchers.run_user import RunUser, prepare_runs_dir
from orchestrator.protocol import commands as protocol
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from tests.support.agent_gateway import AgentHarness, gateway_settings
from tests.support.orgs import Org
from tests.support.run_user import nobody

GATEWAY = "http://po.test"


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(gateway_settings(settings))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def harness(app: FastAPI, org: Org) -> AsyncIterator[AgentHarness]:
    made = await AgentHarness.create(app, org)
    yield made
    await made.aclose()


def make_agent(
    harness: AgentHarness,
    tmp_path: Path,
    *,
    runner: str = AgentHarness.runner,
    key: Ed25519PrivateKey | None = None,
    gateway_url: str = GATEWAY,
    transport: httpx.AsyncBaseTransport | None = None,
    environ: dict[str, str] | None = None,
    runs_dir: Path | None = None,
    run_user: RunUser | None = None,
    **overrides: Any,
) -> Agent:
    runs_dir = runs_dir or tmp_path / "runs"
    settings = AgentSettings(
        org_id=harness.org.id,
        runner_id=runner,
        private_key=SecretStr(harness.private_pem),
        runner_gateway_url=gateway_url,
        agent_runs_dir=runs_dir,
        agent_max_backoff_seconds=0.2,
        **overrides,
    )
    client = AgentClient(
        gateway=RunnerGateway(url=gateway_url, org_id=harness.org.id, runner_id=runner),
        private_key=key or harness.key,
        transport=transport if transport is not None else httpx.ASGITransport(app=harness.app),
        poll_timeout_seconds=10,
    )
    launchers = AgentLaunchers(runs_dir=runs_dir, environ=environ or dict(os.environ), run_user=run_user)
    return Agent(settings=settings, client=client, launchers=launchers)


async def _delivered(agent: Agent) -> protocol.NextCommand:
    delivered = await agent.client.next_command()
    assert delivered is not None
    return delivered


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


async def test_agent__launches_the_run_reports_job_created_and_acks(
    harness: AgentHarness, app: FastAPI, tmp_path: Path
) -> None:
    deployment_id = await harness.deployment()
    agent = make_agent(
        harness, tmp_path, environ={**os.environ, "PRIVATE_KEY": harness.private_pem, "AGENT_SECRET": "x"}
    )

    outcome = await agent.handle(await _delivered(agent))
    handle = (tmp_path / "runs" / deployment_id / "runner.pid").read_text()
    pid = int(handle.split(":")[2])
    try:
        runner_env = _environ(pid)
    finally:
        await agent.launchers.local.cancel(handle, grace_seconds=2)
    [command] = await harness.commands(deployment_id)
    await agent.client.aclose()

    assert Outcome.ACKED == outcome
    assert ("acked", deployment_id) == (command.state, command.job_id)
    assert command.job_created_at is not None
    # The runner gets its deployment token and the agent's gateway URL; nothing of the agent's secrets.
    expected = deployment_tokens.deployment_token(app.state.services.token_key, "acme", deployment_id)
    assert (expected, GATEWAY, deployment_id) == (
        runner_env["TOKEN"],
        runner_env["RUNNER_GATEWAY_URL"],
        runner_env["DEPLOYMENT_ID"],
    )
    assert "PRIVATE_KEY" not in runner_env and "AGENT_SECRET" not in runner_env
    assert not any("PRIVATE KEY" in value for value in runner_env.values())


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {name: value.strip() for name, _, value in (line.partition(":") for line in lines)}


async def test_agent__as_root_runs_local_runs_as_its_run_user_apart_from_its_own_files(
    harness: AgentHarness, tmp_path: Path
) -> None:
    """AGENT_RUN_USER (nobody) runs the vm run: its uid and only group, no capabilities, a working
    directory of its own, and nothing of the agent's environment."""
    user = nobody()
    runs_dir = Path(tempfile.mkdtemp(prefix="po-agent-runs-"))
    prepare_runs_dir(runs_dir, user, setting="AGENT_RUNS_DIR")
    deployment_id = await harness.deployment()
    agent = make_agent(
        harness,
        tmp_path,
        environ={**os.environ, "PRIVATE_KEY": harness.private_pem, "AWS_SECRET_ACCESS_KEY": "canary"},
        runs_dir=runs_dir,
        run_user=user,
    )
    try:
        outcome = await agent.handle(await _delivered(agent))
        handle = (runs_dir / deployment_id / "runner.pid").read_text()
        pid = int(handle.split(":")[2])
        try:
            status, runner_env = _status(pid), _environ(pid)
        finally:
            await agent.launchers.local.cancel(handle, grace_seconds=2)
        work = runs_dir / deployment_id / "work"
        await agent.client.aclose()
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)

    assert Outcome.ACKED == outcome
    assert [str(user.uid)] * 4 == status["Uid"].split()
    assert [str(user.gid)] * 4 == status["Gid"].split()
    assert [] == status["Groups"].split()  # none of root's supplementary groups
    assert 0 == int(status["CapEff"], 16) == int(status["CapPrm"], 16)
    assert (str(work / "home"), str(work / "tmp")) == (runner_env["HOME"], runner_env["TMPDIR"])
    assert "PRIVATE_KEY" not in runner_env and "AWS_SECRET_ACCESS_KEY" not in runner_env


def _refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_agent__redelivered_command_adopts_the_run_already_launched(
    harness: AgentHarness, tmp_path: Path
) -> None:
    """An agent that launched and died before answering: the next delivery launches nothing new."""
    deployment_id = await harness.deployment()
    # A gateway refusing connections: the run keeps trying (first contact, 20 s) and so stays alive; a host
    # name that does not resolve would end it at once.
    refusing = _refused_url()
    first_agent = make_agent(harness, tmp_path, gateway_url=refusing)
    delivered = await _delivered(first_agent)
    payload = protocol.check_envelope(
        delivered.command, org_id="acme", runner_id="agent1", now=datetime.now(UTC)
    )
    spec = payload.spec.to_run_spec("acme", "agent1", gateway_url=refusing)
    first_handle = launched(await first_agent.launchers.for_command(payload).launch(spec)).handle
    # ... and "dies": no event, no ack. A second agent process (new launchers, same runs dir) takes over:
    # nothing for it while the lease runs, the command once it ran out (simulated clock).
    second_agent = make_agent(harness, tmp_path, gateway_url=refusing)
    try:
        with time_machine.travel(delivered.lease_expires_at - timedelta(seconds=0.5), tick=False):
            during_lease = await second_agent.client.next_command()
        with time_machine.travel(delivered.lease_expires_at + timedelta(seconds=0.1), tick=True):
            redelivered = await _delivered(second_agent)
            outcome = await second_agent.handle(redelivered)
        second_handle = (tmp_path / "runs" / deployment_id / "runner.pid").read_text()
    finally:
        await first_agent.launchers.local.cancel(first_handle, grace_seconds=2)
    [command] = await harness.commands(deployment_id)

    assert during_lease is None
    assert (1, 2) == (delivered.attempt, redelivered.attempt)
    assert Outcome.ACKED == outcome
    assert first_handle == second_handle
    assert "acked" == command.state


async def test_agent__expired_command_reported_as_command_expired_and_rejected(
    harness: AgentHarness, tmp_path: Path
) -> None:
    deployment_id = await harness.deployment()
    agent = make_agent(harness, tmp_path)
    delivered = await _delivered(agent)
    stale = delivered.model_copy(
        update={
            "command": delivered.command.model_copy(
                update={"expires_at": datetime.now(UTC) - timedelta(seconds=1)}
            )
        }
    )

    outcome = await agent.handle(stale)
    deployment = await harness.final(deployment_id)
    [command] = await harness.commands(deployment_id)

    assert Outcome.REJECTED == outcome
    assert ("failed", "COMMAND_EXPIRED") == (deployment["status"], deployment["error"]["error"])
    assert "rejected" == command.state
    assert not (tmp_path / "runs" / deployment_id).exists()


async def test_agent__a_runner_type_it_cannot_launch_is_a_terminal_error(
    harness: AgentHarness, tmp_path: Path
) -> None:
    job = {"namespace": "default", "service_account": "runner"}
    await harness.add_runner("k8s", {"type": "kubernetes-agent", "key": harness.public_pem, "job": job})
    deployment_id = await harness.deployment(runner="k8s")
    agent = make_agent(harness, tmp_path, runner="k8s")

    outcome = await agent.handle(await _delivered(agent))
    deployment = await harness.final(deployment_id)

    assert Outcome.REJECTED == outcome
    assert ("failed", "REMOTE_RUNNER") == (deployment["status"], deployment["error"]["error"])
    assert "cannot launch runs of runner type 'kubernetes-agent'" in deployment["status_message"]


async def test_agent__transient_launch_error_is_retried_then_terminal_at_the_last_attempt(
    harness: AgentHarness, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    configuration = {
        "type": "vm",
        "connection": {"type": "agent", "key": harness.public_pem},
        "job": {"work_dir": str(not_a_dir / "runs")},
    }
    await harness.add_runner("flaky", configuration)
    deployment_id = await harness.deployment(runner="flaky")
    agent = make_agent(harness, tmp_path, runner="flaky", agent_max_attempts=2)

    first = await agent.handle(await _delivered(agent))
    [after_first] = await harness.commands(deployment_id)
    still = await harness.get(deployment_id)
    # The retry delay is 2^1 s (simulated clock): nothing half a second before it ends, the command after.
    with time_machine.travel(after_first.available_at - timedelta(seconds=0.5), tick=False):
        during_delay = await agent.client.next_command()
    with time_machine.travel(after_first.available_at + timedelta(seconds=0.1), tick=True):
        second = await agent.handle(await _delivered(agent))
    deployment = await harness.final(deployment_id)
    async with harness.app.state.services.engine.connect() as conn:
        events = await command_store.count_events(conn, "acme", "flaky")

    assert (Outcome.RETRIED, Outcome.REJECTED) == (first, second)
    assert ("pending", 1) == (after_first.state, after_first.attempt)
    assert timedelta(seconds=2) == after_first.available_at - after_first.updated_at
    assert during_delay is None
    assert "executing" == still["status"]
    assert ("failed", "REMOTE_RUNNER") == (deployment["status"], deployment["error"]["error"])
    # One retryable and one terminal runner-error.
    assert 2 == events


async def _run_for(agent: Agent, seconds: float) -> list[MutableMapping[str, Any]]:
    stop = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(agent.run(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait_for(task, 5)
    return logs


async def test_agent_run__a_401_is_logged_loudly_and_polling_goes_on(
    harness: AgentHarness, tmp_path: Path
) -> None:
    agent = make_agent(harness, tmp_path, key=Ed25519PrivateKey.generate())

    logs = await _run_for(agent, 1.0)
    loud = [e for e in logs if e["log_level"] == "error" and "REJECTS THIS AGENT'S CREDENTIALS" in e["event"]]

    assert len(loud) >= 2
    assert {401} == {e["status"] for e in loud}


async def test_agent_run__unreachable_gateway_backs_off_and_keeps_trying(
    harness: AgentHarness, tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway = f"http://127.0.0.1:{port}"
    agent = make_agent(harness, tmp_path, gateway_url=gateway, transport=httpx.AsyncHTTPTransport())

    logs = await _run_for(agent, 1.5)
    failures = [e["failures"] for e in logs if e["event"] == "runner gateway unreachable"]

    assert len(failures) >= 3
    assert failures == sorted(failures) and failures[0] == 1
    assert any(e["event"] == "agent stopped" for e in logs)


async def test_agent_run__picks_up_and_acks_until_stopped(harness: AgentHarness, tmp_path: Path) -> None:
    deployment_id = await harness.deployment()
    agent = make_agent(harness, tmp_path)

    logs = await _run_for(agent, 1.5)
    handle = (tmp_path / "runs" / deployment_id / "runner.pid").read_text()
    await agent.launchers.local.cancel(handle, grace_seconds=2)
    [command] = await harness.commands(deployment_id)

    assert "acked" == command.state
    assert any(e["event"] == "command acked" for e in logs)
    assert uuid.UUID(deployment_id)
