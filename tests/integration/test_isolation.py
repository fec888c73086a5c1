"""Every route under /orgs/{org_id} is scoped to its organization and checks the caller's role."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from orchestrator.dispatch import state_versions
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org

# Not a local runner: those are the platform admin's alone (tests/integration/test_runners_api.py).
RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-agent.yaml").read_text())

# (method, path, body, permission needed); {rule} and {token} are filled with ids of real objects of `org`.
ROUTES: list[tuple[str, str, Any, str]] = [
    ("GET", "/orgs/{org}", None, "read"),
    ("GET", "/orgs/{org}/tokens", None, "manage"),
    ("POST", "/orgs/{org}/tokens", {"role": "viewer"}, "manage"),
    ("DELETE", "/orgs/{org}/tokens/{token}", None, "manage"),
    ("GET", "/orgs/{org}/env-types", None, "read"),
    ("POST", "/orgs/{org}/env-types", {"id": "staging"}, "manage"),
    ("GET", "/orgs/{org}/env-types/development", None, "read"),
    ("PATCH", "/orgs/{org}/env-types/development", {"display_name": "Dev"}, "manage"),
    ("DELETE", "/orgs/{org}/env-types/unused", None, "manage"),
    ("GET", "/orgs/{org}/projects", None, "read"),
    ("POST", "/orgs/{org}/projects", {"id": "blog"}, "manage"),
    ("GET", "/orgs/{org}/projects/shop", None, "read"),
    ("PATCH", "/orgs/{org}/projects/shop", {"display_name": "Shop"}, "manage"),
    ("DELETE", "/orgs/{org}/projects/empty", None, "manage"),
    ("GET", "/orgs/{org}/envs", None, "read"),
    ("GET", "/orgs/{org}/projects/shop/envs", None, "read"),
    ("POST", "/orgs/{org}/projects/shop/envs", {"id": "qa", "env_type_id": "development"}, "deploy"),
    ("GET", "/orgs/{org}/projects/shop/envs/dev", None, "read"),
    ("PATCH", "/orgs/{org}/projects/shop/envs/dev", {"display_name": "Dev"}, "deploy"),
    ("DELETE", "/orgs/{org}/projects/shop/envs/spare", None, "deploy"),
    ("POST", "/orgs/{org}/projects/shop/envs/dev/actions/refresh_runner", None, "manage"),
    ("GET", "/orgs/{org}/projects/shop/envs/dev/state-versions", None, "read"),
    ("GET", "/orgs/{org}/projects/shop/envs/dev/state-versions/1", None, "read"),
    ("GET", "/orgs/{org}/projects/shop/envs/dev/state-versions/1/download", None, "manage"),
    ("POST", "/orgs/{org}/projects/shop/envs/dev/state-versions/1/actions/rollback", None, "manage"),
    ("GET", "/orgs/{org}/runners", None, "read"),
    ("POST", "/orgs/{org}/runners", {"id": "new-runner", **RUNNER}, "manage"),
    ("GET", "/orgs/{org}/runners/vm1", None, "read"),
    ("PATCH", "/orgs/{org}/runners/vm1", {"description": "x"}, "manage"),
    ("DELETE", "/orgs/{org}/runners/spare-runner", None, "manage"),
    ("GET", "/orgs/{org}/runner-rules", None, "read"),
    ("POST", "/orgs/{org}/runner-rules", {"runner_id": "vm1", "project_id": "shop"}, "manage"),
    ("GET", "/orgs/{org}/runner-rules/{rule}", None, "read"),
    ("DELETE", "/orgs/{org}/runner-rules/{rule}", None, "manage"),
    ("GET", "/orgs/{org}/deployments", None, "read"),
    (
        "POST",
        "/orgs/{org}/deployments",
        {"project_id": "shop", "env_id": "dev", "manifest": {"workloads": {}}, "is_dry_run": True},
        "deploy",
    ),
    ("GET", "/orgs/{org}/deployments/{deployment}", None, "read"),
    (
        "GET",
        "/orgs/{org}/deployments/{deployment}/actions/wait-for-complete?timeout_in_seconds=2",
        None,
        "read",
    ),
    ("GET", "/orgs/{org}/deployments/{deployment}/tf", None, "read"),
    ("GET", "/orgs/{org}/deployments/{deployment}/encrypted-outputs", None, "read"),
    ("GET", "/orgs/{org}/deployments/{deployment}/actions/get-logs", None, "read"),
    ("GET", "/orgs/{org}/deployments/{deployment}/logs", None, "read"),
    ("GET", "/orgs/{org}/deployments/{deployment}/errored-state", None, "manage"),
    ("GET", "/orgs/{org}/usage", None, "read"),
    # Last: it ends the deployment the routes above read.
    ("POST", "/orgs/{org}/deployments/{deployment}/actions/cancel", None, "deploy"),
]
ALLOWED = {
    "admin": {"read", "deploy", "manage"},
    "deployer": {"read", "deploy"},
    "viewer": {"read"},
}
#: Route families another module covers with its own isolation tests.
COVERED_ELSEWHERE = (
    "/orgs/{org_id}/resource-types",
    "/orgs/{org_id}/module",
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/available-resource-types",
)


async def populate(org: Org, app: FastAPI) -> dict[str, str]:
    client, base = org.admin, f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/env-types", {"id": "unused"}),
        ("/projects", {"id": "shop"}),
        ("/projects", {"id": "empty"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/projects/shop/envs", {"id": "spare", "env_type_id": "development"}),
        ("/runners", {"id": "vm1", **RUNNER}),
        ("/runners", {"id": "spare-runner", **RUNNER}),
    ]:
        response = await client.post(base + path, json=body)
        assert 201 == response.status_code, response.text
    rule = (await client.post(f"{base}/runner-rules", json={"runner_id": "vm1"})).json()["id"]
    token = (await client.post(f"{base}/tokens", json={"role": "viewer"})).json()["id"]
    env = (await client.get(f"{base}/projects/shop/envs/dev")).json()
    await _state_versions(app, org.id, env)
    return {
        "org": org.id,
        "rule": rule,
        "token": token,
        "deployment": await insert_deployment(app, org.id, env),
    }


async def _state_versions(app: FastAPI, org_id: str, env: dict[str, Any]) -> None:
    """Two state versions of ``env`` (the second current), as its deployments' Terraform writes them."""
    services = app.state.services
    async with services.engine.begin() as conn:
        for serial in (1, 2):
            state: dict[str, Any] = {"version": 4, "serial": serial, "lineage": "l", "resources": []}
            await state_versions.write(
                conn,
                services.box,
                org_id=org_id,
                env_uuid=uuid.UUID(env["uuid"]),
                data=json.dumps(state).encode(),
                keep=100,
                now=datetime.now(UTC),
            )


async def call(
    client: httpx.AsyncClient, route: tuple[str, str, Any, str], ids: dict[str, str]
) -> httpx.Response:
    method, path, body, _ = route
    return await client.request(method, path.format(**ids), json=body)


async def test_isolation__other_org_gets_404_everywhere_and_nothing_changes(
    app: FastAPI, org: Org, other_org: Org
) -> None:
    ids = await populate(org, app)
    before = {
        r[1]: _unclocked((await call(org.admin, ("GET", r[1], None, ""), ids)).text)
        for r in ROUTES
        if r[0] == "GET"
    }

    answers = {route[:2]: await call(other_org.admin, route, ids) for route in ROUTES}
    after = {
        r[1]: _unclocked((await call(org.admin, ("GET", r[1], None, ""), ids)).text)
        for r in ROUTES
        if r[0] == "GET"
    }

    wrong = {key: (r.status_code, r.text) for key, r in answers.items() if r.status_code != 404}
    assert {} == wrong
    assert {f"organization '{org.id}' not found"} == {r.json()["message"] for r in answers.values()}
    assert before == after


def _unclocked(text: str) -> str:
    """An answer without the moment it was computed at (usage's ``asOf``), which changes by itself."""
    return re.sub(r'"asOf":"[^"]*"', '"asOf":"-"', text)


async def test_isolation__unknown_org_answers_like_a_foreign_one(org: Org, other_org: Org) -> None:
    foreign = await other_org.admin.get(f"/orgs/{org.id}/runners")
    unknown = await other_org.admin.get("/orgs/no-such-org/runners")

    assert (404, 404) == (foreign.status_code, unknown.status_code)
    assert foreign.json()["message"].replace(org.id, "X") == unknown.json()["message"].replace(
        "no-such-org", "X"
    )


@pytest.mark.parametrize("role", ["deployer", "viewer"])
async def test_roles__writes_beyond_the_role_are_403(app: FastAPI, org: Org, role: str) -> None:
    ids = await populate(org, app)
    results = {}
    for route in ROUTES:
        response = await call(org.clients[role], route, ids)
        results[route[:2]] = (route[3] in ALLOWED[role], response.status_code)

    refused = {key for key, (allowed, status) in results.items() if not allowed and status != 403}
    admitted = {key for key, (allowed, status) in results.items() if allowed and status in (401, 403, 404)}
    assert set() == refused
    assert set() == admitted


async def test_roles__anonymous_is_401_everywhere(app: FastAPI, org: Org) -> None:
    ids = await populate(org, app)
    anonymous = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")

    statuses = {route[:2]: (await call(anonymous, route, ids)).status_code for route in ROUTES}

    assert {401} == set(statuses.values())


def test_isolation__table_covers_every_org_route(app: FastAPI) -> None:
    listed = {
        (method, _normalize(path.replace("{org}", "{org_id}").partition("?")[0]))
        for method, path, _, _ in ROUTES
    }
    declared = {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/orgs/{org_id}") and not path.startswith(COVERED_ELSEWHERE)
        for method in operations
    }

    assert len(declared) > 20
    assert set() == {(m, p) for m, p in declared if (m, _normalize(p)) not in listed}


def _normalize(path: str) -> str:
    """Compare shapes: every path parameter or concrete id segment after a collection name counts the same."""
    parts = path.split("/")
    collections = {
        "orgs",
        "tokens",
        "env-types",
        "projects",
        "envs",
        "runners",
        "runner-rules",
        "deployments",
        "state-versions",
    }
    return "/".join("*" if i > 0 and parts[i - 1] in collections else part for i, part in enumerate(parts))


#: The test's ids of real objects, as the security page's route templates name them.
_TEMPLATES = {
    "shop": "{project}",
    "empty": "{project}",
    "dev": "{env}",
    "spare": "{env}",
    "development": "{env_type}",
    "unused": "{env_type}",
    "vm1": "{runner}",
    "spare-runner": "{runner}",
    "1": "{version}",
}


def _template(path: str) -> str:
    """``/orgs/{org}/projects/shop/envs/dev`` as the security page writes it: ``.../{project}/envs/{env}``."""
    segments = path.split("?")[0].split("/")
    # "dev" after "env-types" is an environment type, not an environment.
    named = []
    for index, segment in enumerate(segments):
        if segment == "development" or (segment == "dev" and segments[index - 1] == "env-types"):
            named.append("{env_type}")
        else:
            named.append(_TEMPLATES.get(segment, segment))
    return "/".join(named)


def test_docs__the_security_pages_table_is_this_tests_routes_and_roles() -> None:
    """docs/security.md's table of permissions: each route of ROUTES in the row of its permission, the
    roles that have each permission as ALLOWED says (and the platform admin all), and no route more."""
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in ("read", "deploy", "manage"):
            routes = set(re.findall(r"`((?:GET|POST|PATCH|DELETE) /orgs/[^`]*)`", cells[1]))
            columns = ("viewer", "deployer", "admin", "platform-admin")
            roles = {role for role, mark in zip(columns, cells[2:], strict=True) if mark}
            rows[cells[0]] = (routes, roles)

    for permission, (_routes, roles) in rows.items():
        assert {role for role, allowed in ALLOWED.items() if permission in allowed} | {
            "platform-admin"
        } == roles
    expected: dict[str, set[str]] = {"read": set(), "deploy": set(), "manage": set()}
    for method, path, _body, permission in ROUTES:
        expected[permission].add(f"{method} {_template(path)}")
    assert expected == {permission: routes for permission, (routes, _roles) in rows.items()}
