"""``POST /orgs/{org}/deployments/{id}/actions/cancel``: who may, what it answers, how the deployment ends.

The runs themselves are stopped in tests/acceptance/test_cancel.py (local, ssh, Kubernetes, agent); here
the deployments are written to the store (tests/support/deployments.py) so that each state is reached
without a runner: queued (no runner has it), launched (the dispatcher's checks stop and end it), final.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI
from pydantic import SecretStr

from orchestrator.settings import ServerSettings
from orchestrator.store.schema import deployments
from tests.support.deployments import insert_deployment
from tests.support.managed import MANAGED_SECRET, bearer, claim, deploy, managed_env, registered
from tests.support.orgs import Org, api_client, make_org

LOCAL_RUNNER = yaml.safe_load(
    (Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text()
)


@pytest.fixture
async def env(org: Org) -> dict[str, object]:
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
    ]:
        created = await org.admin.post(base + path, json=body)
        assert 201 == created.status_code, created.text
    runner = await org.platform.post(f"{base}/runners", json={"id": "vm1", **LOCAL_RUNNER})
    assert 201 == runner.status_code, runner.text
    found: dict[str, object] = (await org.admin.get(f"{base}/projects/shop/envs/dev")).json()
    return found


def cancel_path(org: Org, deployment_id: str) -> str:
    return f"/orgs/{org.id}/deployments/{deployment_id}/actions/cancel"


async def set_dispatch_state(app: FastAPI, deployment_id: str, state: str) -> None:
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            deployments.update()
            .where(deployments.c.id == uuid.UUID(deployment_id))
            .values(dispatch_state=state, handle=None)
        )


async def test_cancel__a_queued_deployment_ends_cancelled_at_once(
    app: FastAPI, org: Org, env: dict[str, object]
) -> None:
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    await set_dispatch_state(app, deployment_id, "queued")

    answer = await org.clients["deployer"].post(cancel_path(org, deployment_id))

    assert 200 == answer.status_code, answer.text
    body = answer.json()
    assert "cancelled" == body["status"]
    assert "before a runner started it" in body["status_message"]
    assert body["completed_at"] is not None
    listed = await org.admin.get(f"/orgs/{org.id}/deployments", params={"by_status[]": "cancelled"})
    assert [deployment_id] == [d["id"] for d in listed.json()["items"]]


async def test_cancel__a_launched_deployment_is_stopped_then_ends_cancelled(
    app: FastAPI, org: Org, env: dict[str, object]
) -> None:
    """202 while the run is stopped (here: a run no launcher knows; the dispatcher's next check ends it)."""
    deployment_id = await insert_deployment(app, org.id, env, status="executing")

    answer = await org.clients["deployer"].post(cancel_path(org, deployment_id))
    again = await org.clients["deployer"].post(cancel_path(org, deployment_id))
    waited = await org.admin.get(
        f"/orgs/{org.id}/deployments/{deployment_id}/actions/wait-for-complete",
        params={"timeout_in_seconds": 30},
    )

    assert 202 == answer.status_code, answer.text
    assert ("executing", "Cancelling") == (answer.json()["status"], answer.json()["status_message"][:10])
    assert again.status_code in (202, 409), again.text
    assert 200 == waited.status_code, waited.text
    assert "cancelled" == waited.json()["status"]
    assert waited.json()["status_message"].startswith("deployment cancelled: ")


async def test_cancel__a_final_deployment_is_409_saying_how_it_ended(
    app: FastAPI, org: Org, env: dict[str, object]
) -> None:
    deployment_id = await insert_deployment(app, org.id, env, status="succeeded")

    answer = await org.clients["deployer"].post(cancel_path(org, deployment_id))

    assert 409 == answer.status_code, answer.text
    assert (
        f"deployment '{deployment_id}' already ended (succeeded: deployment succeeded); only an executing "
        "deployment can be cancelled"
    ) == answer.json()["message"]


async def test_cancel__viewers_may_not_other_orgs_get_404(
    app: FastAPI, org: Org, admin: httpx.AsyncClient, env: dict[str, object]
) -> None:
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    await set_dispatch_state(app, deployment_id, "queued")
    other = await make_org(app, admin, "other")

    viewer = await org.clients["viewer"].post(cancel_path(org, deployment_id))
    stranger = await other.admin.post(cancel_path(org, deployment_id))
    unknown = await org.admin.post(cancel_path(org, str(uuid.uuid4())))
    still = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert 403 == viewer.status_code, viewer.text
    assert 404 == stranger.status_code, stranger.text
    assert 404 == unknown.status_code, unknown.text
    assert "not found" in unknown.json()["message"]
    assert "executing" == still["status"]


@pytest.fixture
def settings(settings: ServerSettings) -> ServerSettings:
    """Managed runners enabled (the heartbeat test); nothing else here depends on them."""
    return settings.model_copy(update={"managed_runner_secret": SecretStr(MANAGED_SECRET)})


async def test_cancel__a_managed_runner_is_told_by_its_heartbeat(app: FastAPI, org: Org) -> None:
    """Claimed by a managed runner: the cancel is recorded (202) and the runner's next heartbeat answers
    ``cancel: true`` with the grace; before the cancel, the heartbeat's answer is as it always was."""
    await managed_env(org, "dev")
    async with api_client(app, None) as runner_client:
        token = await registered(runner_client, "managed-0")
        deployment_id = await deploy(org, "dev")
        claimed = await claim(runner_client, token)
        assert 200 == claimed.status_code, claimed.text
        before = await runner_client.post(
            "/runner/heartbeat", json={"deploymentId": deployment_id}, headers=bearer(token)
        )

        answer = await org.clients["deployer"].post(cancel_path(org, deployment_id))
        told = await runner_client.post(
            "/runner/heartbeat", json={"deploymentId": deployment_id}, headers=bearer(token)
        )

    assert {"leaseSeconds": 60, "heartbeatSeconds": 15} == before.json()
    assert 202 == answer.status_code, answer.text
    assert 200 == told.status_code, told.text
    assert {"cancel": True, "cancelGraceSeconds": 30.0}.items() <= told.json().items()
