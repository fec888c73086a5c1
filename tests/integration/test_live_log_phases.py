"""A deployment's phases (issue 22), on both databases: ``queued`` when created, ``launching`` when the
dispatcher launches its runner (direct runners), when its agent command is created (agent runners) or a
managed runner claims it; the runner's own from its log chunks. A deployment that fails before its runner
starts keeps ``queued``/``launching`` and says so; a destroy records its phases like any deployment.

Direct runs go through the dispatcher round by round with a launcher that starts nothing (the test plays
the runner through the gateway); the agent run through the app's own dispatcher and the agent protocol.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.dispatch.dispatcher import Dispatcher, DispatchSettings
from orchestrator.domain.deployments import BEFORE_START_NOTE
from orchestrator.launchers.availability import LauncherUnavailableError
from orchestrator.launchers.base import Launcher, LaunchError, LaunchTarget, RunState, RunStatus
from orchestrator.protocol import age, log_stream
from orchestrator.protocol import commands as command_protocol
from orchestrator.protocol import results as protocol
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.log_stream import Phase
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.agent_gateway import AgentHarness, gateway_settings
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, api_client, make_org

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "demo"
MANIFEST = {"workloads": {"shop": {"resources": {"app": {"type": "demo-app", "params": {"name": "shop"}}}}}}
_, RECIPIENT = age.generate_identity()
RUNNER_PHASES = [Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING]


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    """The app without its own dispatcher: each test drives one (the agent test has its own app)."""
    application = create_app(settings, run_dispatcher=False)
    async with application.router.lifespan_context(application):
        yield application


class StartsNothing:
    """A launcher that starts nothing (the test plays the runner); ``refuse``: raise that at launch."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse

    async def launch(self, spec: RunSpec) -> str:
        if self.refuse is not None:
            raise self.refuse
        return f"fake:{spec.deployment_id}"

    async def status(self, handle: str) -> RunStatus:
        return RunStatus(state=RunState.RUNNING)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        pass


def dispatcher(app: FastAPI, launcher: Launcher | Exception) -> Dispatcher:
    services = app.state.services

    def launcher_for(_target: LaunchTarget) -> Launcher:
        if isinstance(launcher, Exception):
            raise launcher
        return launcher

    return Dispatcher(
        engine=services.engine,
        box=services.box,
        blobs=services.blobs,
        token_key=services.token_key,
        gateway_url="http://po.test",
        launcher_for=launcher_for,
        on_final=lambda _id: None,
        settings=DispatchSettings(check_interval_seconds=5.0),
    )


async def catalogue(org: Org, runner_id: str) -> None:
    """Environment ``shop/dev`` whose deployments run the demo module on ``runner_id`` (created before)."""
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/runner-rules", {"runner_id": runner_id}),
        (
            "/resource-types",
            {"id": "demo-app", **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
        ),
        ("/modules", {"id": "demo-app", **yaml.safe_load((EXAMPLES / "module.yaml").read_text())}),
        ("/module-rules", {"module_id": "demo-app"}),
    ]:
        if path == "/env-types" and (await org.admin.get(base + "/env-types/development")).status_code == 200:
            continue
        if path == "/projects" and (await org.admin.get(base + "/projects/shop")).status_code == 200:
            continue
        response = await org.admin.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)


@pytest.fixture
async def ready(org: Org) -> Org:
    runner = {"id": "local", **yaml.safe_load((EXAMPLES / "runner.yaml").read_text())}
    response = await org.platform.post(f"/orgs/{org.id}/runners", json=runner)
    assert 201 == response.status_code, response.text
    await catalogue(org, "local")
    return org


async def deploy(org: Org) -> dict[str, Any]:
    body = {
        "project_id": "shop",
        "env_id": "dev",
        "manifest": MANIFEST,
        "encrypted_logs_recipient": RECIPIENT,
    }
    response = await org.admin.post(f"/orgs/{org.id}/deployments", json=body)
    assert 201 == response.status_code, response.text
    created: dict[str, Any] = response.json()
    return created


async def get(org: Org, deployment_id: str) -> dict[str, Any]:
    response = await org.clients["viewer"].get(f"/orgs/{org.id}/deployments/{deployment_id}")
    assert 200 == response.status_code, response.text
    found: dict[str, Any] = response.json()
    return found


def names(deployment: dict[str, Any]) -> list[str]:
    return [p["phase"] for p in deployment["phases"]]


async def play_runner(
    app: FastAPI, org: Org, deployment: dict[str, Any], runner_id: str, phases: list[Phase], status: str
) -> None:
    """What a streaming runner sends: a chunk per phase, then its results."""
    key = app.state.services.token_key
    token = deployment_tokens.deployment_token(key, org.id, deployment["id"])
    env_uuid = (await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/{deployment['env_id']}")).json()[
        "uuid"
    ]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://po.test"
    ) as gateway:
        for seq, phase in enumerate(phases, start=1):
            sent = await gateway.put(
                log_stream.chunk_path(org.id, runner_id, env_uuid, deployment["id"], seq),
                content=log_stream.encrypt_chunk(deployment["id"], seq, phase, f"{phase} line\n", RECIPIENT),
                headers={protocol.DEPLOYMENT_TOKEN_HEADER: token, log_stream.PHASE_HEADER: phase.value},
            )
            assert 202 == sent.status_code, sent.text
        reported = await gateway.post(
            protocol.results_path(org.id, runner_id, deployment["id"]),
            json={"status": status},
            headers={protocol.DEPLOYMENT_TOKEN_HEADER: token},
        )
        assert 202 == reported.status_code, reported.text


async def test_phases__a_direct_run_that_succeeds(app: FastAPI, ready: Org) -> None:
    created = await deploy(ready)
    await dispatcher(app, StartsNothing()).run_once()
    launched = await get(ready, created["id"])
    await play_runner(app, ready, created, "local", RUNNER_PHASES, "success")
    final = await get(ready, created["id"])
    listed = (await ready.admin.get(f"/orgs/{ready.id}/deployments")).json()["items"]

    assert (["queued"], "queued") == (names(created), created["phase"])
    assert ["queued", "launching"] == names(launched)
    assert ["queued", "launching", "init", "plan", "apply", "reporting"] == names(final)
    assert ("succeeded", "reporting") == (final["status"], final["phase"])
    [item] = [item for item in listed if item["id"] == created["id"]]
    assert final["phases"] == item["phases"]
    assert BEFORE_START_NOTE not in final["status_message"]


async def test_phases__a_failed_run_keeps_its_phases(app: FastAPI, ready: Org) -> None:
    created = await deploy(ready)
    await dispatcher(app, StartsNothing()).run_once()
    await play_runner(app, ready, created, "local", [Phase.INIT, Phase.PLAN], "failure")
    final = await get(ready, created["id"])
    page = (await ready.admin.get(f"/orgs/{ready.id}/deployments/{created['id']}/logs")).json()

    assert ("failed", ["queued", "launching", "init", "plan"]) == (final["status"], names(final))
    assert [1, 2] == [item["seq"] for item in page["items"]]


async def test_phases__a_run_that_fails_at_launch_says_it_failed_before_its_runner_started(
    app: FastAPI, ready: Org
) -> None:
    refused = LaunchError("the machine refused the connection")
    refused.retryable = False
    created = await deploy(ready)

    await dispatcher(app, StartsNothing(refuse=refused)).run_once()
    final = await get(ready, created["id"])

    assert ("failed", ["queued", "launching"]) == (final["status"], names(final))
    assert final["status_message"].startswith("the runner could not be launched: the machine refused")
    assert f"({BEFORE_START_NOTE}, while launching)" in final["status_message"]
    assert "launching" == final["phase"]


async def test_phases__a_runner_this_server_cannot_launch_fails_while_queued(
    app: FastAPI, ready: Org
) -> None:
    created = await deploy(ready)

    await dispatcher(app, LauncherUnavailableError("local runners are off")).run_once()
    final = await get(ready, created["id"])

    assert ("failed", ["queued"]) == (final["status"], names(final))
    assert final["status_message"].endswith(f"({BEFORE_START_NOTE}, while queued)")


async def test_phases__a_destroy_records_its_phases_and_keeps_its_chunks(app: FastAPI, ready: Org) -> None:
    applied = await deploy(ready)
    run = dispatcher(app, StartsNothing())
    await run.run_once()
    await play_runner(app, ready, applied, "local", RUNNER_PHASES, "success")

    deleting = await ready.admin.delete(
        f"/orgs/{ready.id}/projects/shop/envs/dev", params={"encrypted_logs_recipient": RECIPIENT}
    )
    assert 202 == deleting.status_code, deleting.text
    [destroy] = [
        d
        for d in (await ready.admin.get(f"/orgs/{ready.id}/deployments")).json()["items"]
        if d["mode"] == "destroy"
    ]
    queued = names(destroy)
    await run.run_once()
    await play_runner(app, ready, destroy, "local", [Phase.INIT, Phase.DESTROY, Phase.REPORTING], "success")
    final = await get(ready, destroy["id"])
    page = (await ready.admin.get(f"/orgs/{ready.id}/deployments/{destroy['id']}/logs")).json()

    assert ["queued"] == queued
    assert ["queued", "launching", "init", "destroy", "reporting"] == names(final)
    assert [1, 2, 3] == [item["seq"] for item in page["items"]]


# --- an agent runner -------------------------------------------------------------------------------------


@pytest.fixture
async def agent_app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(gateway_settings(settings))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def agent_org(agent_app: FastAPI) -> AsyncIterator[Org]:
    async with api_client(agent_app, BOOTSTRAP_TOKEN) as platform:
        made = await make_org(agent_app, platform, "acme")
        yield made
        for client in made.clients.values():
            await client.aclose()


async def test_phases__an_agent_run(agent_app: FastAPI, agent_org: Org) -> None:
    agent = await AgentHarness.create(agent_app, agent_org)
    await catalogue(agent_org, AgentHarness.runner)
    try:
        created = await deploy(agent_org)
        await agent.commands(created["id"], wait=True)
        enqueued = await get(agent_org, created["id"])
        delivered = await agent.next()
        assert 200 == delivered.status_code, delivered.text
        command = command_protocol.NextCommand.model_validate_json(delivered.content).command
        await play_runner(agent_app, agent_org, created, AgentHarness.runner, RUNNER_PHASES, "success")
        final = await get(agent_org, created["id"])
    finally:
        await agent.aclose()

    assert created["id"] == command.deployment_id
    assert ["queued", "launching"] == names(enqueued)
    assert ["queued", "launching", "init", "plan", "apply", "reporting"] == names(final)
    assert "succeeded" == final["status"]
