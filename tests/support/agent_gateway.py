"""An agent's side of the gateway, in process: a runner with an agent key, deployments dispatched to it, and
requests signed like an agent signs them. Used by the gateway and agent-loop integration tests."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI

from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from orchestrator.store.schema import deployments
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org

LOCAL_RUNNER = yaml.safe_load(
    (Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text()
)


def gateway_settings(settings: ServerSettings, **overrides: Any) -> ServerSettings:
    """``settings`` with short agent waits and leases for tests; ``overrides`` name the ``agent_*``
    settings without their prefix (``lease_seconds=30``)."""
    values: dict[str, Any] = {
        "fetch_wait_seconds": 1.0,
        "lease_seconds": 2.0,
        "poll_fallback_seconds": 0.1,
        "public_key_cache_seconds": 0,
        "presence_interval_seconds": 0,
        **overrides,
    }
    return ServerSettings.model_validate(
        {**settings.model_dump(), **{f"agent_{name}": value for name, value in values.items()}}
    )


class AgentHarness:
    """Speaks the protocol like an agent of runner ``acme/agent1`` would; builds deployments for it."""

    runner = "agent1"

    def __init__(self, app: FastAPI, org: Org, private_pem: str, public_pem: str) -> None:
        self.app = app
        self.org = org
        self.private_pem = private_pem
        self.key = agent_auth.load_private_key(private_pem)
        self.public_pem = public_pem
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")
        self._envs = 0

    @classmethod
    async def create(cls, app: FastAPI, org: Org) -> AgentHarness:
        """Env type ``development``, project ``shop``, the vm agent runner ``agent1`` and a local runner
        ``local1``."""
        private_pem, public_pem = agent_auth.generate_key_pair()
        made = cls(app, org, private_pem, public_pem)
        base = f"/orgs/{org.id}"
        for path, body in [
            ("/env-types", {"id": "development"}),
            ("/projects", {"id": "shop"}),
            ("/runners", {"id": "local1", **LOCAL_RUNNER}),
        ]:
            # A runner with a local connection is the platform admin's to create.
            client = org.platform if path == "/runners" else org.admin
            response = await client.post(base + path, json=body)
            assert 201 == response.status_code, response.text
        await made.add_runner(cls.runner, {"type": "vm", "connection": {"type": "agent", "key": public_pem}})
        return made

    async def add_runner(
        self, runner_id: str, configuration: dict[str, Any], state: dict[str, Any] | None = None
    ) -> None:
        body = {
            "id": runner_id,
            "runner_configuration": configuration,
            "state_storage_configuration": state or {"type": "orchestrator"},
        }
        response = await self.org.admin.post(f"/orgs/{self.org.id}/runners", json=body)
        assert 201 == response.status_code, response.text

    async def aclose(self) -> None:
        await self.client.aclose()

    def headers(
        self,
        *,
        key: Ed25519PrivateKey | None = None,
        org: str | None = None,
        runner: str | None = None,
        now: float | None = None,
    ) -> dict[str, str]:
        token = agent_auth.sign(key or self.key, org or self.org.id, runner or self.runner, now=now)
        return {"Authorization": f"Bearer {token}"}

    async def next(self, *, runner: str | None = None, **auth: Any) -> httpx.Response:
        path = protocol.next_command_path(self.org.id, runner or self.runner)
        return await self.client.post(path, headers=self.headers(runner=runner, **auth), timeout=30)

    async def answer(self, action: str, command_id: str, body: dict[str, Any]) -> httpx.Response:
        path = protocol.command_action_path(self.org.id, self.runner, command_id, action)
        return await self.client.post(path, json=body, headers=self.headers())

    async def event(
        self, event_type: str, deployment_id: str, payload: dict[str, Any], **fields: Any
    ) -> httpx.Response:
        command = protocol.command_id(deployment_id)
        body = {
            "event_id": fields.pop("event_id", f"{command}:{event_type}"),
            "type": event_type,
            "organization_id": self.org.id,
            "runner_id": self.runner,
            "deployment_id": deployment_id,
            "payload": payload,
            **fields,
        }
        path = protocol.events_path(self.org.id, self.runner)
        return await self.client.post(path, json=body, headers=self.headers())

    async def deployment(self, *, runner: str | None = None, wait: bool = True) -> str:
        """A deployment on an agent runner in a fresh environment, dispatched (its command enqueued)."""
        self._envs += 1
        env = (
            await self.org.admin.post(
                f"/orgs/{self.org.id}/projects/shop/envs",
                json={"id": f"e{self._envs}", "env_type_id": "development"},
            )
        ).json()
        deployment_id = await insert_deployment(
            self.app, self.org.id, env, status="executing", runner_id=runner or self.runner
        )
        async with self.app.state.services.engine.begin() as conn:
            await conn.execute(
                deployments.update()
                .where(deployments.c.id == uuid.UUID(deployment_id))
                .values(dispatch_state="pending", next_check_at=None, launched_at=None)
            )
        self.app.state.dispatcher.wake()
        if wait:
            await self.commands(deployment_id, wait=True)
        return deployment_id

    async def commands(self, deployment_id: str, *, wait: bool = False) -> list[command_store.AgentCommand]:
        deadline = time.monotonic() + 10
        while True:
            async with self.app.state.services.engine.connect() as conn:
                found = await command_store.for_deployment(conn, uuid.UUID(deployment_id))
            if found or not wait or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.05)

    async def get(self, deployment_id: str) -> dict[str, Any]:
        response = await self.org.admin.get(f"/orgs/{self.org.id}/deployments/{deployment_id}")
        assert 200 == response.status_code, response.text
        result: dict[str, Any] = response.json()
        return result

    async def final(self, deployment_id: str) -> dict[str, Any]:
        """The deployment once it is final (``wait-for-complete``)."""
        response = await self.org.admin.get(
            f"/orgs/{self.org.id}/deployments/{deployment_id}/actions/wait-for-complete",
            params={"timeout_in_seconds": 10},
        )
        assert 200 == response.status_code, response.text
        result: dict[str, Any] = response.json()
        return result

    async def row(self, deployment_id: str) -> Any:
        async with self.app.state.services.engine.connect() as conn:
            return (
                await conn.execute(deployments.select().where(deployments.c.id == uuid.UUID(deployment_id)))
            ).one()
