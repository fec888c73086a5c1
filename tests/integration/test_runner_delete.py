"""DELETE of a runner while deployments on it execute: refused (409) and nothing lost, until they finish."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI

from orchestrator.domain.deployments import Status
from orchestrator.store import deployments as deployment_store
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org

RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())


async def _env(org: Org, env_id: str) -> dict[str, Any]:
    created = await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": env_id, "env_type_id": "development"}
    )
    assert 201 == created.status_code, created.text
    env: dict[str, Any] = created.json()
    return env


async def _setup(org: Org) -> None:
    for path, body in [
        ("/runners", {"id": "vm1", **RUNNER}),
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
    ]:
        # A runner with a local connection is the platform admin's to create.
        client = org.platform if path == "/runners" else org.admin
        response = await client.post(f"/orgs/{org.id}{path}", json=body)
        assert 201 == response.status_code, (path, response.text)


async def _finish(app: FastAPI, deployment_id: str) -> None:
    async with app.state.services.engine.begin() as conn:
        assert await deployment_store.complete(
            conn, uuid.UUID(deployment_id), status=Status.SUCCEEDED, message="done", now=datetime.now(UTC)
        )


async def test_runner_delete__refused_while_a_deployment_on_it_executes(org: Org, app: FastAPI) -> None:
    await _setup(org)
    env = await _env(org, "dev")
    # The environment is not linked to the runner (never was, or was linked elsewhere since).
    executing = await insert_deployment(app, org.id, env, status="executing", runner_id="vm1")

    refused = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")
    kept_runner = await org.admin.get(f"/orgs/{org.id}/runners/vm1")
    kept_deployment = await org.admin.get(f"/orgs/{org.id}/deployments/{executing}")
    await _finish(app, executing)
    deleted = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")
    after = await org.admin.get(f"/orgs/{org.id}/deployments/{executing}")

    assert 409 == refused.status_code, refused.text
    assert "API-409" == refused.json()["error"]
    assert (
        f"runner vm1 has 1 executing deployment: '{executing}' (shop/dev); wait for it to finish"
        == refused.json()["message"]
    )
    assert 200 == kept_runner.status_code
    assert "executing" == kept_deployment.json()["status"]
    assert 204 == deleted.status_code, deleted.text
    assert 404 == (await org.admin.get(f"/orgs/{org.id}/runners/vm1")).status_code
    assert 200 == after.status_code
    assert "vm1" == after.json()["runner_id"]


async def test_runner_delete__names_every_executing_deployment_and_ignores_final_ones(
    org: Org, app: FastAPI
) -> None:
    await _setup(org)
    envs = [await _env(org, f"e{i}") for i in range(7)]
    await insert_deployment(app, org.id, envs[0], status="succeeded", runner_id="vm1")
    executing = [await insert_deployment(app, org.id, e, status="executing", runner_id="vm1") for e in envs]
    await insert_deployment(app, org.id, envs[0], status="failed", runner_id="vm1")

    refused = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")
    for deployment_id in executing:
        await _finish(app, deployment_id)
    deleted = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")

    message = refused.json()["message"]
    assert 409 == refused.status_code
    assert message.startswith("runner vm1 has 7 executing deployments: ")
    assert message.endswith(" and 2 more; wait for them to finish")
    assert [d for d in executing if d in message] == executing[:5]
    assert 204 == deleted.status_code


async def test_runner_delete__a_linked_environment_is_named_first(org: Org, app: FastAPI) -> None:
    await _setup(org)
    env = await _env(org, "dev")
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "vm1"})
    await org.admin.post(f"/orgs/{org.id}/projects/shop/envs/dev/actions/refresh_runner")
    await insert_deployment(app, org.id, env, status="executing", runner_id="vm1")

    refused = await org.admin.delete(f"/orgs/{org.id}/runners/vm1")

    assert 409 == refused.status_code
    assert "runner vm1 is in use by the environments: shop/dev" == refused.json()["message"]


async def test_runner_delete__missing_runner_404(org: Org) -> None:
    assert 404 == (await org.admin.delete(f"/orgs/{org.id}/runners/nope")).status_code
