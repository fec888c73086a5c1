"""Cancelling an agent runner's deployment, at the gateway: the ``cancel-job`` command, and what an agent
that does not know it (upstream's, which rejects any type but ``create-job``) makes of it. Our agent's
handling, end to end, is tests/acceptance/test_cancel.py::test_cancel__agent_runner_mid_apply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI

from orchestrator.protocol import commands as protocol
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.agent_gateway import AgentHarness, gateway_settings
from tests.support.orgs import Org


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(gateway_settings(settings))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def agent(app: FastAPI, org: Org) -> AsyncIterator[AgentHarness]:
    made = await AgentHarness.create(app, org)
    yield made
    await made.aclose()


async def cancel(agent: AgentHarness, deployment_id: str) -> Any:
    return await agent.org.clients["deployer"].post(
        f"/orgs/{agent.org.id}/deployments/{deployment_id}/actions/cancel"
    )


async def until_command(agent: AgentHarness, deployment_id: str, command_id: str) -> None:
    deadline = time.monotonic() + 10
    while command_id not in [c.id for c in await agent.commands(deployment_id)]:
        assert time.monotonic() < deadline, f"no command {command_id}"
        await asyncio.sleep(0.05)


async def test_cancel__before_the_agent_picked_up_create_job_ends_cancelled(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()

    answer = await cancel(agent, deployment_id)
    final = await agent.final(deployment_id)
    commands = {c.id: c.state for c in await agent.commands(deployment_id)}
    delivered = await agent.next()

    assert 202 == answer.status_code, answer.text
    assert "cancelled" == final["status"], final
    assert "before the runner agent picked up its command" in final["status_message"]
    assert {f"create-job:{deployment_id}:1": "cancelled"} == commands
    assert 204 == delivered.status_code


async def test_cancel__a_launched_run_gets_a_cancel_job_command_an_upstream_agent_may_reject(
    agent: AgentHarness,
) -> None:
    deployment_id = await agent.deployment()
    create = protocol.NextCommand.model_validate_json((await agent.next()).content)
    acked = await agent.answer("ack", create.command.command_id, {"receipt": create.receipt})
    assert 204 == acked.status_code, acked.text

    answer = await cancel(agent, deployment_id)
    await until_command(agent, deployment_id, protocol.cancel_command_id(deployment_id))
    response = await agent.next()
    delivered = protocol.NextCommand.model_validate_json(response.content)
    payload = protocol.check_cancel_envelope(
        delivered.command, org_id="acme", runner_id=agent.runner, now=datetime.now(UTC)
    )
    # What upstream's agent does with a type it does not know: reject it.
    rejected = await agent.answer(
        "reject",
        delivered.command.command_id,
        {"receipt": delivered.receipt, "reason": "UNSUPPORTED_COMMAND_TYPE: command type 'cancel-job'"},
    )
    after = await agent.get(deployment_id)

    assert 202 == answer.status_code, answer.text
    assert ("cancel-job", deployment_id) == (delivered.command.type, delivered.command.deployment_id)
    assert (deployment_id, "vm", 30.0) == (payload.job_id, payload.runner_type, payload.grace_seconds)
    assert "token" not in str(delivered.command.payload)
    assert 204 == rejected.status_code, rejected.text
    # Nothing failed: the run goes on and reports; the message says the agent cannot stop it.
    assert "executing" == after["status"]
    assert after["status_message"].startswith("Cancelling: the runner agent cannot stop the run")
    with pytest.raises(protocol.EnvelopeError, match="command type 'cancel-job' is not supported"):
        protocol.check_envelope(
            delivered.command, org_id="acme", runner_id=agent.runner, now=datetime.now(UTC)
        )
