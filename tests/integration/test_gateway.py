"""The runner gateway: per-deployment tokens, size limits, idempotent results, the Terraform state backend."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.protocol import results as protocol
from orchestrator.store.schema import deployments, tf_states
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org
from tests.support.runners import RUNNER


class Gateway:
    def __init__(self, app: FastAPI, org: Org, env: dict[str, Any], deployment_id: str) -> None:
        self.app = app
        self.org = org.id
        self.env = env
        self.deployment_id = deployment_id
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")

    def token(self, deployment_id: str | None = None) -> str:
        key = self.app.state.services.token_key
        return deployment_tokens.deployment_token(key, self.org, deployment_id or self.deployment_id)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {protocol.DEPLOYMENT_TOKEN_HEADER: token if token is not None else self.token()}

    def path(self, what: str, *, runner: str = "vm1") -> str:
        if what == "bundle":
            return protocol.bundle_path(self.org, runner, self.deployment_id)
        if what == "results":
            return protocol.results_path(self.org, runner, self.deployment_id)
        return protocol.logs_path(self.org, runner, self.env["uuid"], self.deployment_id)

    def state_url(self, suffix: str = "") -> str:
        return f"/runner-gateway/v1/orgs/{self.org}/environments/{self.env['uuid']}/state{suffix}"

    def basic(self, deployment_id: str | None = None, token: str | None = None) -> httpx.BasicAuth:
        dep = deployment_id or self.deployment_id
        return httpx.BasicAuth(dep, token if token is not None else self.token(dep))


@pytest.fixture
async def gateway(app: FastAPI, org: Org) -> Gateway:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    env = (
        await org.admin.post(f"{base}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"})
    ).json()
    await org.admin.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    return Gateway(app, org, env, deployment_id)


async def test_bundle__token_opens_only_its_own_deployment(gateway: Gateway, app: FastAPI, org: Org) -> None:
    other = await insert_deployment(app, org.id, {**gateway.env}, status="succeeded")

    ok = await gateway.client.get(gateway.path("bundle"), headers=gateway.headers())
    none = await gateway.client.get(gateway.path("bundle"))
    wrong = await gateway.client.get(gateway.path("bundle"), headers=gateway.headers("x" * 43))
    others_token = await gateway.client.get(
        gateway.path("bundle"), headers=gateway.headers(gateway.token(other))
    )
    other_runner = await gateway.client.get(gateway.path("bundle", runner="vm2"), headers=gateway.headers())

    assert (200, b"bundle bytes", "no-store") == (ok.status_code, ok.content, ok.headers["cache-control"])
    # Upstream's data plane answers (its integration tests pin them): 400 naming the header, 400 for a
    # token that is not this deployment's.
    assert (400, 400, 400) == (none.status_code, wrong.status_code, others_token.status_code)
    assert none.json()["message"].startswith("X-Deployment-Token: the header is required")
    assert "the runner token is not valid" == wrong.json()["message"] == others_token.json()["message"]
    assert 404 == other_runner.status_code


async def test_results__applied_once_repeats_change_nothing(gateway: Gateway, org: Org) -> None:
    body = {
        "status": "success",
        "tf_resource_counts": {
            "num_resources": 2,
            "num_resources_added": 2,
            "num_resources_removed": 0,
            "num_resources_changed": 0,
        },
    }
    first = await gateway.client.post(gateway.path("results"), json=body, headers=gateway.headers())
    after_first = (await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}")).json()
    # The same results again, as a runner retrying after a lost answer sends them (keys in another order).
    repeat = await gateway.client.post(
        gateway.path("results"), json=dict(reversed(body.items())), headers=gateway.headers()
    )
    different = await gateway.client.post(
        gateway.path("results"), json={"status": "failure"}, headers=gateway.headers()
    )
    after_repeats = (await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}")).json()

    assert (202, 202, 409) == (first.status_code, repeat.status_code, different.status_code)
    assert "already has other results (succeeded); results are written once" in different.json()["message"]
    assert "succeeded" == after_first["status"]
    assert 2 == after_first["metrics"]["num_tf_resources_added"]
    assert after_first == after_repeats


async def test_results__refused_once_the_deployment_ended_without_them(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    """A deployment the orchestrator failed (timeout, runner gone) takes no late results."""
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            sa.update(deployments)
            .where(deployments.c.id == uuid.UUID(gateway.deployment_id))
            .values(status="failed", status_message="deployment timeout", completed_at=datetime.now(UTC))
        )

    late = await gateway.client.post(
        gateway.path("results"), json={"status": "success"}, headers=gateway.headers()
    )
    deployment = (await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}")).json()

    assert 409 == late.status_code
    assert "already ended without results (failed: deployment timeout)" in late.json()["message"]
    assert ("failed", "deployment timeout") == (deployment["status"], deployment["status_message"])


async def test_results__failure_message_from_runner_error(gateway: Gateway, org: Org) -> None:
    body = {"status": "failure", "error": {"error": "IAC_COMMAND_ERROR", "message": "plan failed"}}
    await gateway.client.post(gateway.path("results"), json=body, headers=gateway.headers())
    deployment = (await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}")).json()

    assert ("failed", "runner failed with code IAC_COMMAND_ERROR: plan failed") == (
        deployment["status"],
        deployment["status_message"],
    )


async def test_results__bad_body_400_oversized_413_wrong_token_400(gateway: Gateway) -> None:
    bad = await gateway.client.post(
        gateway.path("results"), json={"status": "maybe"}, headers=gateway.headers()
    )
    unknown = await gateway.client.post(
        gateway.path("results"), json={"status": "success", "colour": 1}, headers=gateway.headers()
    )
    huge = await gateway.client.post(
        gateway.path("results"),
        content=b'{"status":"success","outputs":"' + b"A" * protocol.MAX_RESULTS_BYTES + b'"}',
        headers={**gateway.headers(), "content-type": "application/json"},
    )
    wrong = await gateway.client.post(
        gateway.path("results"), json={"status": "success"}, headers=gateway.headers("x")
    )

    assert 400 == bad.status_code
    assert "status" in json.dumps(bad.json()["details"])
    assert 400 == unknown.status_code
    assert "colour" in json.dumps(unknown.json()["details"])
    assert 413 == huge.status_code
    assert (400, "the runner token is not valid") == (wrong.status_code, wrong.json()["message"])


async def test_logs__stored_and_limited(gateway: Gateway, org: Org) -> None:
    stored = await gateway.client.put(gateway.path("logs"), content=b"Y2lwaGVy", headers=gateway.headers())
    deployment = (await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}")).json()
    served = await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}/actions/get-logs")
    huge = await gateway.client.put(
        gateway.path("logs"), content=b"A" * (protocol.MAX_LOG_BYTES + 1), headers=gateway.headers()
    )

    assert 202 == stored.status_code
    assert deployment["has_logs"] is True
    assert "Y2lwaGVy" == served.text
    assert 413 == huge.status_code


async def test_logs__chunked_upload_over_the_limit_413(gateway: Gateway) -> None:
    """Without Content-Length the gateway finds the limit while reading: 413 all the same."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(protocol.MAX_LOG_BYTES // (1024 * 1024) + 1):
            yield b"A" * (1024 * 1024)

    response = await gateway.client.put(gateway.path("logs"), content=chunks(), headers=gateway.headers())

    assert "chunked" == response.request.headers["transfer-encoding"]
    assert (413, "API-413") == (response.status_code, response.json()["error"])


async def test_logs__written_once_even_within_the_grace(gateway: Gateway, org: Org) -> None:
    """Logs uploaded, then the results: a second upload is refused (409), before and after the results."""
    first = await gateway.client.put(gateway.path("logs"), content=b"Zmlyc3Q=", headers=gateway.headers())
    again = await gateway.client.put(gateway.path("logs"), content=b"c2Vjb25k", headers=gateway.headers())
    await gateway.client.post(gateway.path("results"), json={"status": "success"}, headers=gateway.headers())
    after_results = await gateway.client.put(
        gateway.path("logs"), content=b"dGhpcmQ=", headers=gateway.headers()
    )
    served = await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}/actions/get-logs")

    assert (202, 409, 409) == (first.status_code, again.status_code, after_results.status_code)
    assert "logs are written once" in again.json()["message"]
    assert "Zmlyc3Q=" == served.text


async def test_logs__final_upload_within_the_grace_then_never(gateway: Gateway, org: Org) -> None:
    """The runner may report first and upload its logs a moment later: accepted once, within the grace."""
    await gateway.client.post(gateway.path("results"), json={"status": "success"}, headers=gateway.headers())
    late = await gateway.client.put(gateway.path("logs"), content=b"bG9ncw==", headers=gateway.headers())
    served = await org.admin.get(f"/orgs/{org.id}/deployments/{gateway.deployment_id}/actions/get-logs")

    assert 202 == late.status_code
    assert "bG9ncw==" == served.text


async def test_logs__a_succeeded_deployments_logs_are_never_replaced(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    """The issue's case: a succeeded deployment's logs, replaced with its token. Refused."""
    finished = await insert_deployment(app, org.id, gateway.env, status="succeeded")

    replaced = await gateway.client.put(
        protocol.logs_path(org.id, "vm1", gateway.env["uuid"], finished),
        content=b"Zm9yZ2Vk",
        headers=gateway.headers(gateway.token(finished)),
    )
    served = await org.admin.get(f"/orgs/{org.id}/deployments/{finished}/actions/get-logs")

    assert 409 == replaced.status_code
    assert base64.b64encode(b"ciphertext").decode() == served.text


async def test_tokens__expire_after_the_grace_on_every_route(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    """A deployment that finished longer ago than PO_DEPLOYMENT_TOKEN_GRACE_SECONDS (300 s): its token
    opens nothing any more, with a message saying why."""
    finished = await insert_deployment(app, org.id, gateway.env, status="succeeded")
    grace = app.state.services.settings.deployment_token_grace_seconds
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            sa.update(deployments)
            .where(deployments.c.id == uuid.UUID(finished))
            .values(completed_at=datetime.now(UTC) - timedelta(seconds=grace + 60), logs_key=None)
        )
    headers = gateway.headers(gateway.token(finished))
    client = gateway.client

    bundle = await client.get(protocol.bundle_path(org.id, "vm1", finished), headers=headers)
    results = await client.post(
        protocol.results_path(org.id, "vm1", finished), json={"status": "failure"}, headers=headers
    )
    logs = await client.put(
        protocol.logs_path(org.id, "vm1", gateway.env["uuid"], finished), content=b"eA==", headers=headers
    )
    state = await client.get(gateway.state_url(), auth=gateway.basic(finished))
    lock = await client.request(
        "LOCK", gateway.state_url("/lock"), json={"ID": "l"}, auth=gateway.basic(finished)
    )
    deployment = (await org.admin.get(f"/orgs/{org.id}/deployments/{finished}")).json()

    answers = [bundle, results, logs, state, lock]
    assert [401] * 5 == [a.status_code for a in answers]
    for answer in answers:
        assert "the deployment token has expired" in answer.json()["message"], answer.text
        assert "PO_DEPLOYMENT_TOKEN_GRACE_SECONDS" in answer.json()["message"]
    assert ("succeeded", False) == (deployment["status"], deployment["has_logs"])


async def test_tokens__a_finished_deployment_within_the_grace_keeps_its_token(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    """Within the grace the token still authenticates: the bundle of a finished deployment is simply not
    served any more (404), the state backend needs an executing one (401, as before)."""
    finished = await insert_deployment(app, org.id, gateway.env, status="succeeded")
    headers = gateway.headers(gateway.token(finished))

    bundle = await gateway.client.get(protocol.bundle_path(org.id, "vm1", finished), headers=headers)
    state = await gateway.client.get(gateway.state_url(), auth=gateway.basic(finished))

    assert 404 == bundle.status_code
    assert "its bundle is not available" in bundle.json()["message"]
    assert 401 == state.status_code
    assert "may not use this environment's state" in state.json()["message"]


async def test_state__versions_kept_lock_refuses_a_second_holder(gateway: Gateway, app: FastAPI) -> None:
    client, auth = gateway.client, gateway.basic()
    state = {"version": 4, "serial": 1, "lineage": "x", "resources": []}

    empty = await client.get(gateway.state_url(), auth=auth)
    locked = await client.request(
        "LOCK", gateway.state_url("/lock"), json={"ID": "lock-1", "Who": "a"}, auth=auth
    )
    second = await client.request(
        "LOCK", gateway.state_url("/lock"), json={"ID": "lock-2", "Who": "b"}, auth=auth
    )
    write_without_lock = await client.post(
        gateway.state_url(), params={"ID": "lock-2"}, json=state, auth=auth
    )
    written = await client.post(gateway.state_url(), params={"ID": "lock-1"}, json=state, auth=auth)
    rewritten = await client.post(
        gateway.state_url(), params={"ID": "lock-1"}, json={**state, "serial": 2}, auth=auth
    )
    read = await client.get(gateway.state_url(), auth=auth)
    unlocked = await client.request("UNLOCK", gateway.state_url("/lock"), json={"ID": "lock-1"}, auth=auth)
    relocked = await client.request("LOCK", gateway.state_url("/lock"), json={"ID": "lock-2"}, auth=auth)
    async with app.state.services.engine.connect() as conn:
        versions = (await conn.execute(sa.select(sa.func.count()).select_from(tf_states))).scalar_one()
        sealed = (await conn.execute(sa.select(tf_states.c.data))).scalars().all()

    assert 204 == empty.status_code
    assert 200 == locked.status_code
    assert (423, "lock-1", "a") == (second.status_code, second.json()["ID"], second.json()["Who"])
    assert 409 == write_without_lock.status_code
    assert (200, 200) == (written.status_code, rewritten.status_code)
    assert 2 == read.json()["serial"]
    assert (200, 200) == (unlocked.status_code, relocked.status_code)
    assert 2 == versions
    assert all("lineage" not in data for data in sealed)


async def test_state__credentials_must_match_an_executing_deployment_of_the_env(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    finished = await insert_deployment(app, org.id, gateway.env, status="succeeded")
    url = gateway.state_url()

    none = await gateway.client.get(url)
    wrong = await gateway.client.get(url, auth=gateway.basic(token="nope"))
    done = await gateway.client.get(url, auth=gateway.basic(finished))
    garbage = await gateway.client.get(url, headers={"Authorization": "Basic !!!"})

    assert (401, 401, 401, 401) == (
        none.status_code,
        wrong.status_code,
        done.status_code,
        garbage.status_code,
    )


def test_tokens__derived_per_deployment_and_compared_safely() -> None:
    key = deployment_tokens.token_key(b"k" * 32)

    assert deployment_tokens.verify(key, "o", "d1", deployment_tokens.deployment_token(key, "o", "d1"))
    assert not deployment_tokens.verify(key, "o", "d2", deployment_tokens.deployment_token(key, "o", "d1"))
    assert not deployment_tokens.verify(key, "p", "d1", deployment_tokens.deployment_token(key, "o", "d1"))
    assert not deployment_tokens.verify(
        deployment_tokens.token_key(b"j" * 32), "o", "d1", deployment_tokens.deployment_token(key, "o", "d1")
    )
    assert not deployment_tokens.verify(key, "o", "d1", None)
    assert base64.urlsafe_b64decode(deployment_tokens.deployment_token(key, "o", "d1") + "=")


async def test_state__kept_when_its_environment_is_force_deleted(
    gateway: Gateway, app: FastAPI, org: Org
) -> None:
    """A forced delete leaves the resources behind, so it leaves the state describing them too (under the
    environment's UUID); only a destroy that emptied it lets the state go."""
    client, auth = gateway.client, gateway.basic()
    state = {
        "version": 4,
        "serial": 1,
        "lineage": "x",
        "resources": [{"type": "terraform_data", "name": "a"}],
    }
    await client.request("LOCK", gateway.state_url("/lock"), json={"ID": "lock-1", "Who": "a"}, auth=auth)
    written = await client.post(gateway.state_url(), params={"ID": "lock-1"}, json=state, auth=auth)
    await client.request("UNLOCK", gateway.state_url("/lock"), json={"ID": "lock-1"}, auth=auth)
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            deployments.update()
            .where(deployments.c.id == uuid.UUID(gateway.deployment_id))
            .values(status="failed", status_message="failed part-way")
        )

    deleted = await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev", params={"force": "true"})
    async with app.state.services.engine.connect() as conn:
        kept = (
            await conn.execute(
                sa.select(sa.func.count())
                .select_from(tf_states)
                .where(tf_states.c.env_uuid == uuid.UUID(gateway.env["uuid"]))
            )
        ).scalar_one()

    assert 200 == written.status_code, written.text
    assert 204 == deleted.status_code, deleted.text
    assert 404 == (await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/dev")).status_code
    assert 1 == kept
