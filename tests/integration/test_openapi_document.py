"""What ``/openapi.json`` and ``/docs`` offer: security schemes, the error answers of each operation, the
methods of each path (OPTIONS, 405), and a documentation page that loads nothing from outside."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from orchestrator.api import docs
from tests.support.orgs import Org

SCHEMES = {
    "ApiToken": {"type": "http", "scheme": "bearer"},
    "AgentJWT": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
    "DeploymentToken": {"type": "apiKey", "in": "header", "name": "X-Deployment-Token"},
    "StateBasicAuth": {"type": "http", "scheme": "basic"},
    "ManagedRunnerToken": {"type": "http", "scheme": "bearer"},
}
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture
async def anonymous(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        yield client


@pytest.fixture
async def document(anonymous: httpx.AsyncClient) -> dict[str, Any]:
    response = await anonymous.get("/openapi.json")
    assert 200 == response.status_code
    body: dict[str, Any] = response.json()
    return body


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in HTTP_METHODS
    ]


async def test_openapi__declares_the_security_schemes(document: dict[str, Any]) -> None:
    declared = document["components"]["securitySchemes"]

    assert SCHEMES == {
        name: {k: v for k, v in s.items() if k != "description"} for name, s in declared.items()
    }


async def test_openapi__each_operation_names_its_credentials(document: dict[str, Any]) -> None:
    def scheme(path: str) -> str:
        if path.startswith(("/orgs", "/managed-runner-registrations", "/whoami")):
            return "ApiToken"
        if "/environments/{env_uuid}/state" in path:
            return "StateBasicAuth"
        if "/commands/" in path or path.endswith("/events"):
            return "AgentJWT"
        if path.startswith("/runner/"):
            return "ManagedRunnerToken"
        return "DeploymentToken"

    found = {(method, path): op["security"] for method, path, op in operations(document)}
    public = {path for (_, path), security in found.items() if security == []}

    assert {
        "/healthz",
        "/readyz",
        "/metrics",
        "/runner-compatibility",
        "/openapi.json",
        "/docs",
        "/.well-known/openid-configuration",
        "/.well-known/jwks",
        # Managed runners register with the shared secret in the body: it only mints their token.
        "/runner/register",
    } == public
    assert {} == {
        key: security
        for key, security in found.items()
        if key[1] not in public and security != [{scheme(key[1]): []}]
    }


async def test_openapi__errors_documented_with_the_error_body_and_no_422(document: dict[str, Any]) -> None:
    error_answers = [
        (method, path, code, response)
        for method, path, op in operations(document)
        for code, response in op["responses"].items()
        if int(code) >= 400
    ]

    assert [] == [(m, p) for m, p, code, _ in error_answers if code == "422"]
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert {"error", "message"} == set(document["components"]["schemas"]["Error"]["required"])
    assert [] == [
        (m, p, code)
        for m, p, code, response in error_answers
        if response["content"]["application/json"]["schema"] != {"$ref": "#/components/schemas/Error"}
    ]


async def test_openapi__statuses_follow_what_the_route_does(document: dict[str, Any]) -> None:
    paths = document["paths"]

    def codes(method: str, path: str) -> set[str]:
        return set(paths[path][method]["responses"])

    env = "/orgs/{org_id}/projects/{project_id}/envs/{env_id}"
    assert {"200", "400", "401", "404", "503"} == codes("get", env)
    assert {"200", "400", "401", "403", "404", "409", "413", "503"} == codes("patch", env)
    assert {"202", "204", "400", "401", "403", "404", "409", "503"} == codes("delete", env)
    # Only a platform admin creates organizations; no organization in the path to be missing.
    assert {"201", "400", "401", "403", "409", "413", "503"} == codes("post", "/orgs")
    # Revoking a token cannot conflict; every role reads, so a read is never refused with 403.
    assert "409" not in codes("delete", "/orgs/{org_id}/tokens/{token_id}")
    assert [] == [(m, p) for m, p, op in operations(document) if m == "GET" and "409" in op["responses"]]
    assert {"200"} == codes("get", "/healthz")
    # A probe: 503 names the check that failed; never a credential to miss.
    assert {"200", "503"} == codes("get", "/readyz")
    assert {"200"} == codes("get", "/metrics")
    assert ["text/plain"] == list(paths["/metrics"]["get"]["responses"]["200"]["content"])
    # Managed runners: 404 when not enabled; a wrong secret 401; registering replaces, never conflicts.
    assert {"201", "400", "401", "404", "413", "503"} == codes("post", "/runner/register")
    assert {"200", "204", "400", "401", "404", "409", "413", "503"} == codes("post", "/runner/claim")
    # Cancel: 200 when it had not started (cancelled now), 202 while its run is stopped, 409 when final.
    cancel = "/orgs/{org_id}/deployments/{deployment_id}/actions/cancel"
    assert {"200", "202", "400", "401", "403", "404", "409", "413", "503"} == codes("post", cancel)


async def test_openapi__state_versions(document: dict[str, Any]) -> None:
    """Every role lists and describes an environment's state versions; downloads and rollbacks are the
    admins' (403); a rollback answers the new version (201) or 409 while the state is held."""
    paths = document["paths"]
    base = "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/state-versions"

    def codes(method: str, path: str) -> set[str]:
        return set(paths[path][method]["responses"])

    assert {"200", "400", "401", "404", "503"} == codes("get", base)
    assert {"200", "400", "401", "404", "503"} == codes("get", base + "/{version}")
    assert {"200", "400", "401", "403", "404", "503"} == codes("get", base + "/{version}/download")
    assert ["application/json"] == list(
        paths[base + "/{version}/download"]["get"]["responses"]["200"]["content"]
    )
    rollback = base + "/{version}/actions/rollback"
    assert {"201", "400", "401", "403", "404", "409", "413", "503"} == codes("post", rollback)
    assert "the state lock is held" in paths[rollback]["post"]["responses"]["409"]["description"]
    answer = paths[rollback]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/StateVersionOut"} == answer
    fields = document["components"]["schemas"]["StateVersionOut"]["properties"]
    assert {"version", "current", "kind", "serial", "lineage", "resources", "deployment_id"} <= set(fields)
    assert ["terraform", "rollback"] == fields["kind"]["examples"]


async def test_openapi__live_log(document: dict[str, Any]) -> None:
    """Issue 22: the live log's page or event stream (410 once removed), the runner's chunk upload (409
    for other bytes under a stored number, 410 after the end), and the phases of deployments."""
    paths, schemas = document["paths"], document["components"]["schemas"]
    logs = paths["/orgs/{org_id}/deployments/{deployment_id}/logs"]["get"]
    chunk = paths[
        "/runner-gateway/v1/orgs/{org_id}/runners/{runner_id}/environments/{env_uuid}/deployments/"
        "{deployment_id}/log-chunks/{seq}"
    ]["put"]

    assert {"200", "400", "401", "404", "410", "503"} == set(logs["responses"])
    assert ["application/json", "text/event-stream"] == sorted(logs["responses"]["200"]["content"])
    event = logs["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert ["phase", "chunk", "log", "end"] == event["properties"]["event"]["enum"]
    assert {"after", "limit", "follow", "Last-Event-ID"} <= {p["name"] for p in logs["parameters"]}
    assert {"items", "last_seq", "complete", "status", "whole_log"} == set(
        schemas["LogPageOut"]["properties"]
    )
    assert {"seq", "phase", "received_at", "ciphertext"} == set(schemas["LogChunkOut"]["properties"])
    assert {"202", "400", "401", "404", "409", "410", "413", "503"} == set(chunk["responses"])
    assert [{"DeploymentToken": []}] == chunk["security"]
    [phase] = [p for p in chunk["parameters"] if p["name"] == "X-Log-Phase"]
    assert ["apply", "destroy", "init", "plan", "reporting"] == phase["schema"]["enum"]
    for name in ("DeploymentOut", "DeploymentSummaryOut"):
        assert {"phase", "phases"} <= set(schemas[name]["properties"])
    assert {"phase", "started_at"} == set(schemas["PhaseOut"]["required"])


async def test_openapi__deployment_statuses_include_cancelled(document: dict[str, Any]) -> None:
    """The status stays a string for upstream's clients; its values are named, cancelled among them, and
    the list's ``by_status[]`` filter takes them."""
    schemas = document["components"]["schemas"]
    status = schemas["DeploymentOut"]["properties"]["status"]
    assert "string" == status["type"]
    assert ["executing", "succeeded", "failed", "cancelled"] == status["examples"]
    listing = document["paths"]["/orgs/{org_id}/deployments"]["get"]["parameters"]
    [by_status] = [p for p in listing if p["name"] == "by_status[]"]
    assert "cancelled" in by_status["description"]


async def test_openapi__documented_400_is_what_validation_answers(org: Org, document: dict[str, Any]) -> None:
    response = await org.admin.post(f"/orgs/{org.id}/projects", json={"id": 7})

    assert 400 == response.status_code
    assert response.json()["message"].startswith("id:")
    assert "400" in document["paths"]["/orgs/{org_id}/projects"]["post"]["responses"]


async def test_openapi__state_lock_methods_described_on_their_path(document: dict[str, Any]) -> None:
    item = document["paths"]["/runner-gateway/v1/orgs/{org_id}/environments/{env_uuid}/state/lock"]

    assert set() == set(item) - {"description"}
    assert "`LOCK`" in item["description"] and "423" in item["description"]
    assert "`UNLOCK`" in item["description"]


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/orgs", "GET, POST, OPTIONS"),
        ("/orgs/acme/projects/shop", "GET, PATCH, DELETE, OPTIONS"),
        ("/orgs/acme/projects/shop/envs/dev", "GET, PATCH, DELETE, OPTIONS"),
        ("/healthz", "GET, OPTIONS"),
        ("/readyz", "GET, OPTIONS"),
        ("/runner-gateway/v1/orgs/acme/environments/0-0/state/lock", "OPTIONS, LOCK, UNLOCK"),
    ],
)
async def test_options__allow_names_every_method_of_the_path(
    anonymous: httpx.AsyncClient, path: str, allow: str
) -> None:
    options = await anonymous.options(path)
    refused = await anonymous.put(path)

    assert (204, allow) == (options.status_code, options.headers["allow"])
    assert (405, allow) == (refused.status_code, refused.headers["allow"])
    assert "API-405" == refused.json()["error"]
    assert "PUT" in refused.json()["message"]


async def test_options__unknown_path_is_404(anonymous: httpx.AsyncClient) -> None:
    response = await anonymous.options("/no/such/path")

    assert 404 == response.status_code


async def test_docs__loads_only_its_own_assets(anonymous: httpx.AsyncClient) -> None:
    page = await anonymous.get("/docs")
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assets = {url: await anonymous.get(url) for url in urls}

    assert 200 == page.status_code
    assert [] == re.findall(r"(?:https?:)?//[\w.-]+", page.text)
    assert {f"{docs.ASSETS_PATH}/{name}" for name in docs.ASSETS} == set(urls)
    assert {url: 200 for url in urls} == {url: r.status_code for url, r in assets.items()}
    for url, response in assets.items():
        assert (docs.assets_dir() / url.rsplit("/", 1)[1]).read_bytes() == response.content
    assert "url: '/openapi.json'" in page.text
