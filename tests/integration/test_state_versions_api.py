"""``/orgs/{org}/projects/{project}/envs/{env}/state-versions``: every state the orchestrator keeps is a
version; list, describe, download (admins, audited) and roll back (under the state lock, refused while a
deployment holds it), and the retention of the newest ``PO_STATE_VERSIONS_KEPT``.

States are written through the gateway's state backend by deployments written to the store
(tests/support/deployments.py), as a runner's Terraform writes them. The end-to-end rollback, through
``octl`` and a real runner, is tests/acceptance/test_state_versions.py.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI
from structlog.testing import capture_logs

from orchestrator import deployment_tokens
from orchestrator.store import states as state_store
from orchestrator.store.schema import deployments, tf_state_locks, tf_states
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org, walk_pages
from tests.support.runners import RUNNER

#: A vm runner whose state storage is ``s3``.
S3_RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-agent.yaml").read_text())


def tfstate(serial: int, *names: str, lineage: str = "lineage-1", instances: int = 1) -> dict[str, Any]:
    """A Terraform state document: managed resources ``names`` of ``instances`` each, and a data source."""
    return {
        "version": 4,
        "terraform_version": "1.15.5",
        "serial": serial,
        "lineage": lineage,
        "outputs": {},
        "resources": [
            {
                "mode": "managed",
                "type": "terraform_data",
                "name": name,
                "provider": 'provider["terraform.io/builtin/terraform"]',
                "instances": [
                    {"schema_version": 0, "attributes": {"id": f"{name}-{i}"}} for i in range(instances)
                ],
            }
            for name in names
        ]
        + [
            {"mode": "data", "type": "terraform_remote_state", "name": "d", "instances": [{"attributes": {}}]}
        ],
    }


class Env:
    """Environment shop/dev of ``org``, linked to a local vm runner (state storage ``orchestrator``)."""

    def __init__(self, app: FastAPI, org: Org, env: dict[str, Any]) -> None:
        self.app = app
        self.org = org
        self.env = env
        self.gateway = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")
        self.path = f"/orgs/{org.id}/projects/shop/envs/dev/state-versions"

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self.env["uuid"])

    async def deployment(self, *, status: str = "executing", created_by: str = "test") -> str:
        return await insert_deployment(self.app, self.org.id, self.env, status=status, created_by=created_by)

    def state_url(self, suffix: str = "") -> str:
        return f"/runner-gateway/v1/orgs/{self.org.id}/environments/{self.env['uuid']}/state{suffix}"

    def auth(self, deployment_id: str) -> httpx.BasicAuth:
        key = self.app.state.services.token_key
        return httpx.BasicAuth(
            deployment_id, deployment_tokens.deployment_token(key, self.org.id, deployment_id)
        )

    async def write(self, deployment_id: str, state: dict[str, Any]) -> None:
        """Write ``state`` as Terraform does: LOCK, POST, UNLOCK."""
        auth = self.auth(deployment_id)
        lock = {"ID": f"lock-{deployment_id}", "Who": "terraform@runner", "Operation": "OperationTypeApply"}
        locked = await self.gateway.request("LOCK", self.state_url("/lock"), json=lock, auth=auth)
        written = await self.gateway.post(self.state_url(), params={"ID": lock["ID"]}, json=state, auth=auth)
        unlocked = await self.gateway.request("UNLOCK", self.state_url("/lock"), json=lock, auth=auth)
        assert (200, 200, 200) == (locked.status_code, written.status_code, unlocked.status_code), (
            written.text
        )

    async def read_state(self) -> dict[str, Any]:
        """The state Terraform of the next deployment reads."""
        reader = await self.deployment()
        answer = await self.gateway.get(self.state_url(), auth=self.auth(reader))
        assert 200 == answer.status_code, answer.text
        await self.end(reader)
        state: dict[str, Any] = answer.json()
        return state

    async def end(self, deployment_id: str) -> None:
        async with self.app.state.services.engine.begin() as conn:
            await conn.execute(
                deployments.update()
                .where(deployments.c.id == uuid.UUID(deployment_id))
                .values(status="succeeded", completed_at=datetime.now(UTC))
            )

    async def deploy(self, *states: dict[str, Any]) -> str:
        """A deployment that writes ``states`` and ends."""
        deployment_id = await self.deployment()
        for state in states:
            await self.write(deployment_id, state)
        await self.end(deployment_id)
        return deployment_id

    async def versions(self) -> list[int]:
        async with self.app.state.services.engine.connect() as conn:
            return await state_store.versions(conn, self.uuid)

    async def locks(self) -> int:
        async with self.app.state.services.engine.connect() as conn:
            return int(
                (await conn.execute(sa.select(sa.func.count()).select_from(tf_state_locks))).scalar_one()
            )


async def _make_env(org: Org) -> dict[str, Any]:
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
    ]:
        created = await org.admin.post(base + path, json=body)
        assert 201 == created.status_code, created.text
    runner = await org.platform.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    assert 201 == runner.status_code, runner.text
    rule = await org.admin.post(f"{base}/runner-rules", json={"runner_id": "vm1"})
    assert 201 == rule.status_code, rule.text
    linked = await org.admin.post(f"{base}/projects/shop/envs/dev/actions/refresh_runner")
    assert 200 == linked.status_code, linked.text
    env: dict[str, Any] = (await org.admin.get(f"{base}/projects/shop/envs/dev")).json()
    assert "vm1" == env["runner_id"]
    return env


@pytest.fixture
async def env(app: FastAPI, org: Org) -> Env:
    return Env(app, org, await _make_env(org))


def keep_versions(app: FastAPI, kept: int) -> None:
    """PO_STATE_VERSIONS_KEPT of the running app."""
    services = app.state.services
    app.state.services = dataclasses.replace(
        services, settings=services.settings.model_copy(update={"state_versions_kept": kept})
    )


async def test_list__newest_first_described_and_readable_by_viewers(env: Env) -> None:
    first = await env.deploy(tfstate(1, "a"))
    second = await env.deploy(tfstate(2, "a", "b", instances=2), tfstate(3, "a", "b", "c", instances=2))

    listed = await env.org.clients["viewer"].get(env.path)
    paged = await walk_pages(env.org.clients["viewer"], env.path, per_page=2)

    assert 200 == listed.status_code, listed.text
    items = listed.json()["items"]
    assert [3, 2, 1] == [v["version"] for v in items]
    assert [True, False, False] == [v["current"] for v in items]
    assert [3, 2, 1] == [v["serial"] for v in items]
    assert {"lineage-1"} == {v["lineage"] for v in items}
    # Managed resource instances only (the data source is not counted).
    assert [6, 4, 1] == [v["resources"] for v in items]
    assert [second, second, first] == [v["deployment_id"] for v in items]
    assert {("terraform", "test")} == {(v["kind"], v["created_by"]) for v in items}
    assert {("acme", "shop", "dev")} == {(v["org_id"], v["project_id"], v["env_id"]) for v in items}
    assert all("rolled_back_from" not in v for v in items)
    assert items == paged


async def test_get__one_version_and_404_for_an_unknown_one(env: Env) -> None:
    deployment_id = await env.deploy(tfstate(1, "a"), tfstate(2, "a", "b"))

    one = await env.org.clients["viewer"].get(f"{env.path}/1")
    unknown = await env.org.clients["viewer"].get(f"{env.path}/9")
    other_env = await env.org.admin.get(f"/orgs/{env.org.id}/projects/shop/envs/nope/state-versions")

    assert 200 == one.status_code, one.text
    assert {
        "version": 1,
        "current": False,
        "serial": 1,
        "resources": 1,
        "deployment_id": deployment_id,
    }.items() <= (one.json().items())
    assert (404, "state version 9 not found in environment 'shop/dev'") == (
        unknown.status_code,
        unknown.json()["message"],
    )
    assert (404, "environment 'nope' not found in project 'shop'") == (
        other_env.status_code,
        other_env.json()["message"],
    )


async def test_download__admins_get_the_document_decrypted_and_each_download_is_logged(env: Env) -> None:
    await env.deploy(tfstate(1, "a"), tfstate(2, "a", "b"))
    url = f"{env.path}/1/download"

    with capture_logs() as logged:
        by_admin = await env.org.admin.get(url)
        by_platform = await env.org.platform.get(url)
    viewer = await env.org.clients["viewer"].get(url)
    deployer = await env.org.clients["deployer"].get(url)

    assert 200 == by_admin.status_code, by_admin.text
    assert tfstate(1, "a") == by_admin.json() == by_platform.json()
    assert "no-store" == by_admin.headers["cache-control"]
    assert 'filename="shop-dev-1.tfstate"' in by_admin.headers["content-disposition"]
    assert (403, 403) == (viewer.status_code, deployer.status_code)
    assert "role 'viewer' may not manage in organization 'acme'" == viewer.json()["message"]
    audit = [entry for entry in logged if entry["event"] == "state_version_downloaded"]
    assert 2 == len(audit)
    assert {("acme", "shop", "dev", env.env["uuid"], 1)} == {
        (e["org_id"], e["project_id"], e["env_id"], e["env_uuid"], e["version"]) for e in audit
    }
    assert [False, True] == [e["platform_token"] for e in audit]
    assert all(e["token_id"] for e in audit)


async def test_rollback__the_old_content_becomes_current_as_a_new_version_with_the_next_serial(
    env: Env,
) -> None:
    first = await env.deploy(tfstate(1, "a"))
    await env.deploy(tfstate(2, "a", "b"), tfstate(3, "a", "b", "c"))
    admin_token = (await env.org.admin.get(f"/orgs/{env.org.id}/tokens")).json()["items"]

    with capture_logs() as logged:
        rolled = await env.org.admin.post(f"{env.path}/1/actions/rollback")
    listed = (await env.org.clients["viewer"].get(env.path)).json()["items"]
    state = await env.read_state()

    assert 201 == rolled.status_code, rolled.text
    body = rolled.json()
    assert {
        "version": 4,
        "current": True,
        "kind": "rollback",
        "rolled_back_from": 1,
        "serial": 4,
        "lineage": "lineage-1",
        "resources": 1,
    }.items() <= body.items()
    assert "deployment_id" not in body
    assert body["created_by"] in {t["id"] for t in admin_token}
    assert [4, 3, 2, 1] == [v["version"] for v in listed]
    assert first == listed[-1]["deployment_id"]
    # What the next deployment's Terraform reads: version 1's resources, serial after the current one.
    assert {**tfstate(1, "a"), "serial": 4} == state
    assert 0 == await env.locks()
    assert [("state_version_rolled_back", 1, 4)] == [
        (e["event"], e["rolled_back_from"], e["version"]) for e in logged if e["event"].startswith("state_")
    ]


async def test_rollback__viewers_and_deployers_are_refused_and_nothing_is_written(env: Env) -> None:
    await env.deploy(tfstate(1, "a"), tfstate(2, "a", "b"))

    viewer = await env.org.clients["viewer"].post(f"{env.path}/1/actions/rollback")
    deployer = await env.org.clients["deployer"].post(f"{env.path}/1/actions/rollback")

    assert (403, 403) == (viewer.status_code, deployer.status_code)
    assert "role 'deployer' may not manage in organization 'acme'" == deployer.json()["message"]
    assert [1, 2] == await env.versions()


async def test_rollback__refused_while_a_deployment_executes_or_holds_the_lock(env: Env) -> None:
    await env.deploy(tfstate(1, "a"), tfstate(2, "a", "b"))
    running = await env.deployment()
    auth = env.auth(running)

    while_executing = await env.org.admin.post(f"{env.path}/1/actions/rollback")
    locked = await env.gateway.request(
        "LOCK",
        env.state_url("/lock"),
        json={"ID": "held-1", "Who": "tf@runner", "Operation": "OperationTypeApply"},
        auth=auth,
    )
    # Its run ended without an unlock reaching the server (the lock is let go when results arrive).
    await env.end(running)
    while_locked = await env.org.admin.post(f"{env.path}/1/actions/rollback")

    assert (409, 200) == (while_executing.status_code, locked.status_code)
    assert (
        f"deployment '{running}' of environment 'shop/dev' is executing: its Terraform holds or will "
        "take the state lock; roll back once it has ended"
    ) == while_executing.json()["message"]
    assert 409 == while_locked.status_code
    assert (
        f"the state of environment 'shop/dev' is locked by deployment '{running}' (lock 'held-1', Operation "
        "OperationTypeApply, Who tf@runner): roll back once it is released"
    ) == while_locked.json()["message"]
    assert [1, 2] == await env.versions()
    assert 1 == await env.locks()


async def test_rollback__to_the_current_or_an_unknown_version_or_another_lineage_is_refused(env: Env) -> None:
    await env.deploy(tfstate(1, "a", lineage="old"))
    await env.deploy(tfstate(1, "b", lineage="new"), tfstate(2, "b", "c", lineage="new"))

    current = await env.org.admin.post(f"{env.path}/3/actions/rollback")
    unknown = await env.org.admin.post(f"{env.path}/7/actions/rollback")
    lineage = await env.org.admin.post(f"{env.path}/1/actions/rollback")
    zero = await env.org.admin.post(f"{env.path}/0/actions/rollback")

    assert (
        409,
        "state version 3 is the current state of environment 'shop/dev' already: nothing to roll back",
    ) == (
        current.status_code,
        current.json()["message"],
    )
    assert (404, "state version 7 not found in environment 'shop/dev'") == (
        unknown.status_code,
        unknown.json()["message"],
    )
    assert 409 == lineage.status_code
    assert (
        "state version 1 has lineage 'old', the current state of environment 'shop/dev' lineage 'new'"
        in (lineage.json()["message"])
    )
    assert 400 == zero.status_code
    assert zero.json()["message"].startswith("version:")
    assert [1, 2, 3] == await env.versions()
    assert 0 == await env.locks()


async def test_other_org__404_on_every_route_and_nothing_written(env: Env, other_org: Org) -> None:
    await env.deploy(tfstate(1, "a"), tfstate(2, "a", "b"))

    answers = [
        await other_org.admin.get(env.path),
        await other_org.admin.get(f"{env.path}/1"),
        await other_org.admin.get(f"{env.path}/1/download"),
        await other_org.admin.post(f"{env.path}/1/actions/rollback"),
    ]

    assert [404] * 4 == [a.status_code for a in answers]
    assert {"organization 'acme' not found"} == {a.json()["message"] for a in answers}
    assert [1, 2] == await env.versions()


async def test_retention__only_the_newest_n_are_kept_never_the_current_one(env: Env, app: FastAPI) -> None:
    keep_versions(app, 3)
    await env.deploy(*(tfstate(serial, "a") for serial in range(1, 6)))
    kept_after_writes = await env.versions()

    rolled = await env.org.admin.post(f"{env.path}/3/actions/rollback")
    keep_versions(app, 1)
    await env.deploy(tfstate(7, "a", "b"))
    listed = (await env.org.admin.get(env.path)).json()["items"]

    assert [3, 4, 5] == kept_after_writes
    assert 201 == rolled.status_code, rolled.text
    assert (6, 3, 6) == (rolled.json()["version"], rolled.json()["rolled_back_from"], rolled.json()["serial"])
    assert [(7, True, 7)] == [(v["version"], v["current"], v["serial"]) for v in listed]


async def test_versions_written_before_their_description__described_from_the_document(
    env: Env, app: FastAPI
) -> None:
    """Rows of migration 0012's days have no serial, lineage or resources stored: read from the state."""
    services = app.state.services
    data = json.dumps(tfstate(5, "a", "b")).encode()
    async with services.engine.begin() as conn:
        await state_store.add_version(
            conn,
            org_id=env.org.id,
            env_uuid=env.uuid,
            data=services.box.seal(data, context=f"tfstate:{env.uuid}"),
            md5="0" * 32,
            size=len(data),
            deployment_id=None,
            now=datetime.now(UTC),
        )
        stored = (
            await conn.execute(sa.select(tf_states.c.serial, tf_states.c.lineage, tf_states.c.resources))
        ).one()

    [listed] = (await env.org.clients["viewer"].get(env.path)).json()["items"]

    assert (None, None, None) == tuple(stored)
    assert {
        "version": 1,
        "serial": 5,
        "lineage": "lineage-1",
        "resources": 2,
        "kind": "terraform",
    }.items() <= (listed.items())


async def test_state_kept_elsewhere__each_route_says_versions_are_kept_only_for_orchestrator_storage(
    env: Env,
) -> None:
    base = f"/orgs/{env.org.id}"
    created = await env.org.admin.post(f"{base}/runners", json={"id": "s3-runner", **S3_RUNNER})
    assert 201 == created.status_code, created.text
    await env.org.admin.post(f"{base}/projects/shop/envs", json={"id": "prod", "env_type_id": "development"})
    for rule in (await env.org.admin.get(f"{base}/runner-rules")).json()["items"]:
        await env.org.admin.delete(f"{base}/runner-rules/{rule['id']}")
    await env.org.admin.post(f"{base}/runner-rules", json={"runner_id": "s3-runner"})
    linked = await env.org.admin.post(f"{base}/projects/shop/envs/prod/actions/refresh_runner")
    assert "s3-runner" == linked.json()["runner_id"], linked.text
    path = f"{base}/projects/shop/envs/prod/state-versions"

    answers = [
        await env.org.admin.get(path),
        await env.org.admin.get(f"{path}/1"),
        await env.org.admin.get(f"{path}/1/download"),
        await env.org.admin.post(f"{path}/1/actions/rollback"),
    ]

    assert [400] * 4 == [a.status_code for a in answers]
    assert {
        "environment 'shop/prod' keeps its Terraform state in state storage 's3' of its runner 's3-runner': "
        "the orchestrator keeps state versions only for state storage 'orchestrator'"
    } == {a.json()["message"] for a in answers}


async def test_environment_without_state__lists_nothing(env: Env) -> None:
    listed = await env.org.clients["viewer"].get(env.path)

    assert (200, {"items": []}) == (listed.status_code, listed.json())
