"""Managed runners in tests: the secret of the test settings, registration, and an organization whose
environments deploy on the managed pool (runner ``managed``) through a rule."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.orgs import Org

#: MANAGED_RUNNER_SECRET of the tests that enable managed runners (48 characters or more).
MANAGED_SECRET = "managed-runner-secret-for-tests-0123456789abcdefghij"
#: A deployment with nothing to deploy: it compiles, and runs with any engine.
EMPTY_MANIFEST: dict[str, Any] = {"workloads": {}}


async def register(
    client: httpx.AsyncClient, name: str, tags: list[str] | None = None, secret: str = MANAGED_SECRET
) -> httpx.Response:
    return await client.post(
        "/runner/register", json={"managedSecret": secret, "name": name, "tags": tags or []}
    )


async def registered(client: httpx.AsyncClient, name: str, tags: list[str] | None = None) -> str:
    """A registered runner's token."""
    response = await register(client, name, tags)
    assert 201 == response.status_code, response.text
    token: str = response.json()["token"]
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def claim(client: httpx.AsyncClient, token: str, wait: int = 0) -> httpx.Response:
    return await client.post("/runner/claim", json={"waitSeconds": wait}, headers=bearer(token))


async def managed_env(org: Org, env_id: str, required_tags: list[str] | None = None) -> None:
    """Environment ``shop/<env_id>`` (env type ``<env_id>``) linked to the managed pool by a rule that
    requires ``required_tags``."""
    base = f"/orgs/{org.id}"
    rule: dict[str, Any] = {"runner_id": "managed", "env_type_id": env_id}
    if required_tags:
        rule["required_tags"] = required_tags
    for path, body in [
        ("/env-types", {"id": env_id}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": env_id, "env_type_id": env_id}),
        ("/runner-rules", rule),
    ]:
        response = await org.admin.post(base + path, json=body)
        assert response.status_code in (201, 409), (path, response.text)


async def deploy(org: Org, env_id: str) -> str:
    """A deployment of ``shop/<env_id>``; its id."""
    response = await org.admin.post(
        f"/orgs/{org.id}/deployments",
        json={"project_id": "shop", "env_id": env_id, "mode": "deploy", "manifest": EMPTY_MANIFEST},
    )
    assert 201 == response.status_code, response.text
    deployment_id: str = response.json()["id"]
    return deployment_id
