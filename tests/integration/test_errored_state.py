"""State Terraform could not save (errored.tfstate), handed to the gateway: it becomes the environment's
state when it continues it (state storage ``orchestrator``), else the orchestrator keeps it sealed with the
deployment for an admin to download; and a LOCK retried after its answer was lost is not refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.protocol import results as protocol
from orchestrator.store.schema import tf_state_locks, tf_states
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org
from tests.support.runners import RUNNER

HTTP_BACKEND = 'terraform {\n  backend "http" {\n    address = "http://po.test/state"\n  }\n}\n'
S3_BACKEND = 'terraform {\n  backend "s3" {\n    bucket = "b"\n  }\n}\n'


class Env:
    def __init__(self, app: FastAPI, org: Org, env: dict[str, Any]) -> None:
        self.app = app
        self.org = org
        self.env = env
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")

    async def deployment(self, *, status: str = "executing", tf: str = HTTP_BACKEND) -> str:
        return await insert_deployment(self.app, self.org.id, self.env, status=status, tf=tf)

    def token(self, deployment_id: str) -> str:
        return deployment_tokens.deployment_token(
            self.app.state.services.token_key, self.org.id, deployment_id
        )

    async def upload(self, deployment_id: str, state: Any, *, token: str | None = None) -> httpx.Response:
        path = protocol.errored_state_path(self.org.id, "vm1", self.env["uuid"], deployment_id)
        body = state if isinstance(state, bytes) else json.dumps(state).encode()
        return await self.client.post(
            path, content=body, headers={protocol.DEPLOYMENT_TOKEN_HEADER: token or self.token(deployment_id)}
        )

    def state_url(self, suffix: str = "") -> str:
        return f"/runner-gateway/v1/orgs/{self.org.id}/environments/{self.env['uuid']}/state{suffix}"

    def auth(self, deployment_id: str) -> httpx.BasicAuth:
        return httpx.BasicAuth(deployment_id, self.token(deployment_id))

    async def write(self, deployment_id: str, state: dict[str, Any]) -> None:
        written = await self.client.post(self.state_url(), json=state, auth=self.auth(deployment_id))
        assert 200 == written.status_code, written.text

    async def stored(self) -> list[dict[str, Any]]:
        services = self.app.state.services
        async with services.engine.connect() as conn:
            rows = (await conn.execute(sa.select(tf_states.c.data).order_by(tf_states.c.version))).scalars()
            return [json.loads(services.box.open(r, context=f"tfstate:{self.env['uuid']}")) for r in rows]

    async def locks(self) -> int:
        async with self.app.state.services.engine.connect() as conn:
            return int(
                (await conn.execute(sa.select(sa.func.count()).select_from(tf_state_locks))).scalar_one()
            )


@pytest.fixture
async def env(app: FastAPI, org: Org) -> Env:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    created = await org.admin.post(
        f"{base}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"}
    )
    await org.admin.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    return Env(app, org, created.json())


def tfstate(lineage: str, serial: int, *names: str) -> dict[str, Any]:
    return {
        "version": 4,
        "terraform_version": "1.15.5",
        "serial": serial,
        "lineage": lineage,
        "outputs": {},
        "resources": [
            {"mode": "managed", "type": "terraform_data", "name": n, "instances": []} for n in names
        ],
    }


async def test_errored_state__continuing_the_environments_state_becomes_its_newest_version(env: Env) -> None:
    current = await env.deployment()
    await env.write(current, tfstate("l1", 3, "a"))
    locked = await env.client.request(
        "LOCK", env.state_url("/lock"), json={"ID": "lock-1"}, auth=env.auth(current)
    )

    first = await env.upload(current, tfstate("l1", 4, "a", "b"))
    again = await env.upload(current, tfstate("l1", 4, "a", "b"))

    assert 200 == locked.status_code
    assert (200, 200) == (first.status_code, again.status_code), first.text
    assert "stored" == first.json()["outcome"] == again.json()["outcome"]
    assert 2 == first.json()["version"] == again.json()["version"]
    assert "the state lock the deployment held is released" in first.json()["message"]
    assert [["a"], ["a", "b"]] == [[r["name"] for r in s["resources"]] for s in await env.stored()]
    assert 0 == await env.locks()


async def test_errored_state__first_state_of_the_environment_is_stored(env: Env) -> None:
    deployment = await env.deployment()

    stored = await env.upload(deployment, tfstate("", 0, "a"))

    assert "stored" == stored.json()["outcome"]
    assert 1 == len(await env.stored())


@pytest.mark.parametrize(
    ("uploaded", "reason"),
    [
        (tfstate("other", 9, "a"), "its lineage 'other' is not the lineage 'l1'"),
        (tfstate("l1", 2, "a"), "its serial 2 is older than the environment's state serial 3"),
    ],
    ids=["lineage", "serial"],
)
async def test_errored_state__not_continuing_the_state_is_kept_for_an_admin(
    env: Env, uploaded: dict[str, Any], reason: str
) -> None:
    deployment = await env.deployment()
    await env.write(deployment, tfstate("l1", 3, "a"))

    answer = await env.upload(deployment, uploaded)
    admin = await env.org.admin.get(f"/orgs/{env.org.id}/deployments/{deployment}/errored-state")
    deployer = await env.org.clients["deployer"].get(
        f"/orgs/{env.org.id}/deployments/{deployment}/errored-state"
    )

    assert "kept" == answer.json()["outcome"]
    assert reason in answer.json()["message"]
    assert f"GET /orgs/{env.org.id}/deployments/{deployment}/errored-state" in answer.json()["message"]
    assert 1 == len(await env.stored())
    assert (200, uploaded) == (admin.status_code, admin.json())
    assert 403 == deployer.status_code


async def test_errored_state__other_backends_and_ended_deployments_are_kept_never_stored(env: Env) -> None:
    s3 = await env.deployment(tf=S3_BACKEND)
    s3_answer = await env.upload(s3, tfstate("l1", 1, "a"))
    ended = await env.deployment(status="failed")
    ended_answer = await env.upload(ended, tfstate("l1", 1, "a"))

    assert "the environment's state is kept by its own backend" in s3_answer.json()["message"]
    assert "the deployment was failed already" in ended_answer.json()["message"]
    assert ("kept", "kept") == (s3_answer.json()["outcome"], ended_answer.json()["outcome"])
    assert [] == await env.stored()
    for deployment in (s3, ended):
        kept = await env.org.admin.get(f"/orgs/{env.org.id}/deployments/{deployment}/errored-state")
        assert tfstate("l1", 1, "a") == kept.json()


async def test_errored_state__bad_uploads_are_refused_with_the_reason(env: Env) -> None:
    deployment = await env.deployment()

    not_json = await env.upload(deployment, b"{not json")
    not_state = await env.upload(deployment, {"hello": "world"})
    bad_serial = await env.upload(deployment, {**tfstate("l1", 0), "serial": "7"})
    wrong_token = await env.upload(deployment, tfstate("l1", 1), token="nope")
    none_kept = await env.org.admin.get(f"/orgs/{env.org.id}/deployments/{deployment}/errored-state")

    assert (400, "the errored state is not JSON") == (not_json.status_code, not_json.json()["message"])
    assert 400 == not_state.status_code
    assert "not a Terraform state file" in not_state.json()["message"]
    assert (400, "serial: must be a non-negative integer") == (
        bad_serial.status_code,
        bad_serial.json()["message"],
    )
    assert (400, "the runner token is not valid") == (wrong_token.status_code, wrong_token.json()["message"])
    assert 404 == none_kept.status_code
    assert [] == await env.stored()


async def test_state_lock__retried_lock_of_the_same_id_by_the_same_deployment_is_granted(env: Env) -> None:
    holder = await env.deployment()
    lock = {"ID": "lock-1", "Who": "root@runner"}

    first = await env.client.request("LOCK", env.state_url("/lock"), json=lock, auth=env.auth(holder))
    retried = await env.client.request("LOCK", env.state_url("/lock"), json=lock, auth=env.auth(holder))
    another_id = await env.client.request(
        "LOCK", env.state_url("/lock"), json={"ID": "lock-2"}, auth=env.auth(holder)
    )

    assert (200, 200) == (first.status_code, retried.status_code)
    assert (423, "lock-1") == (another_id.status_code, another_id.json()["ID"])


async def test_errored_state__kept_states_outlive_object_retention(env: Env) -> None:
    """Retention deletes a finished deployment's bundle and logs, never the state kept with it."""
    ended = await env.deployment(status="failed")
    await env.upload(ended, tfstate("l1", 1, "a"))

    deleted = await env.app.state.retention.run_once(now=datetime.now(UTC) + timedelta(days=365))
    kept = await env.org.admin.get(f"/orgs/{env.org.id}/deployments/{ended}/errored-state")

    assert [ended] == [str(d.deployment_id) for d in deleted]
    assert (200, tfstate("l1", 1, "a")) == (kept.status_code, kept.json())
