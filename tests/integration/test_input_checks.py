"""NUL characters, lone surrogates, NaN and Infinity are refused with a 400 naming the field, in every path
parameter, query parameter, header and JSON body, before authentication, on both databases: never a 500,
never a traceback in the log. A Terraform state document is stored as it is, whatever text it holds."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from structlog.testing import capture_logs

from orchestrator import deployment_tokens
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.web.input_checks import NON_FINITE_MESSAGE, NUL_MESSAGE, SURROGATE_MESSAGE
from tests.support.deployments import insert_deployment
from tests.support.live_server import serve_in_thread
from tests.support.orgs import BOOTSTRAP_TOKEN, Org

GW = "/runner-gateway/v1/orgs/acme"
DEPLOYMENT = "6f1c9c52-3a8e-4b0e-9d1e-2f9f0c7f5a11"
ENV = "0b8e2d2e-7f0c-4f7e-8a53-6a3f7f1f3c22"
RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())

# (method, url, body: JSON text as bytes or None, field, message)
CASES: list[tuple[str, str, bytes | None, str, str]] = [
    # path parameters: user API, gateway, long poll, state backend
    ("GET", "/orgs/acme/runners/ab%00c", None, "runner_id", NUL_MESSAGE),
    ("GET", "/orgs/ac%00me/projects", None, "org_id", NUL_MESSAGE),
    ("PATCH", "/orgs/acme/projects/p%00", b'{"display_name": "x"}', "project_id", NUL_MESSAGE),
    ("GET", "/orgs/acme/deployments/d%00", None, "deployment_id", NUL_MESSAGE),
    ("POST", "/runner-gateway/v1/orgs/x/runners/ab%00c/events", b"{}", "runner_id", NUL_MESSAGE),
    ("POST", "/runner-gateway/v1/orgs/x%00/runners/r/commands/next", None, "org_id", NUL_MESSAGE),
    ("POST", f"{GW}/runners/r/commands/c%00/ack", b"{}", "command_id", NUL_MESSAGE),
    ("GET", f"{GW}/runners/r/deployments/d%00/bundle", None, "deployment_id", NUL_MESSAGE),
    ("POST", f"{GW}/runners/r%00/deployments/{DEPLOYMENT}/results", b"{}", "runner_id", NUL_MESSAGE),
    ("PUT", f"{GW}/runners/r/environments/e%00/deployments/{DEPLOYMENT}/logs", b"x", "env_uuid", NUL_MESSAGE),
    ("GET", f"{GW}/environments/e%00/state", None, "env_uuid", NUL_MESSAGE),
    ("LOCK", f"/runner-gateway/v1/orgs/x%00/environments/{ENV}/state/lock", b"{}", "org_id", NUL_MESSAGE),
    ("GET", "/orgs/acme/nowhere%00", None, "path", NUL_MESSAGE),
    # query parameters
    ("GET", "/orgs/acme/deployments?env_id=a%00b", None, "env_id", NUL_MESSAGE),
    ("GET", "/orgs/acme/runners?page=%00", None, "page", NUL_MESSAGE),
    ("POST", f"{GW}/runners/r/commands/next?wait=%00", None, "wait", NUL_MESSAGE),
    ("POST", f"{GW}/runners/r/events?x=1&y=%00", b"{}", "y", NUL_MESSAGE),
    ("POST", f"{GW}/environments/{ENV}/state?ID=%00", b"{}", "ID", NUL_MESSAGE),
    # JSON bodies, at any depth, keys included
    ("POST", "/orgs/acme/projects", b'{"id": "p", "display_name": "a\\u0000b"}', "display_name", NUL_MESSAGE),
    (
        "POST",
        "/orgs/acme/runners",
        b'{"id": "r", "runner_configuration": {"job": {"environment": {"A": "\\u0000"}}}}',
        "runner_configuration.job.environment.A",
        NUL_MESSAGE,
    ),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "tags": ["ok", "\\u0000"]}', "tags[1]", NUL_MESSAGE),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "a\\u0000": 1}', '["a<U+0000>"]', f"key {NUL_MESSAGE}"),
    (
        "POST",
        "/orgs/acme/projects",
        b'{"id": "p", "display_name": "\\ud800"}',
        "display_name",
        SURROGATE_MESSAGE,
    ),
    (
        "POST",
        "/orgs/acme/projects",
        b'{"id": "p", "display_name": "\xed\xa0\x80"}',
        "display_name",
        SURROGATE_MESSAGE,
    ),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "display_name": NaN}', "display_name", NON_FINITE_MESSAGE),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "n": [Infinity]}', "n[0]", NON_FINITE_MESSAGE),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "n": -Infinity}', "n", NON_FINITE_MESSAGE),
    ("POST", "/orgs/acme/projects", b'{"id": "p", "n": 1e999}', "n", NON_FINITE_MESSAGE),
    (
        "POST",
        "/orgs/acme/deployments",
        b'{"project_id": "p", "env_id": "e", "manifest": {"workloads": {"w": {"params": {"x": "\\u0000"}}}}}',
        "manifest.workloads.w.params.x",
        NUL_MESSAGE,
    ),
    (
        "POST",
        "/runner-gateway/v1/orgs/x/runners/r/events",
        b'{"event_id": "\\u0000"}',
        "event_id",
        NUL_MESSAGE,
    ),
    ("POST", f"{GW}/runners/r/commands/next", b'{"a": "\\u0000"}', "a", NUL_MESSAGE),
    (
        "POST",
        f"{GW}/runners/r/deployments/{DEPLOYMENT}/results",
        b'{"status": "failure", "error": {"message": "\\u0000"}}',
        "error.message",
        NUL_MESSAGE,
    ),
    ("LOCK", f"{GW}/environments/{ENV}/state/lock", b'{"ID": "a\\u0000"}', "ID", NUL_MESSAGE),
]


def _id(case: tuple[str, str, bytes | None, str, str]) -> str:
    return f"{case[0]} {case[1][:60]} {case[3]}"


@pytest.mark.parametrize(("method", "url", "body", "field", "message"), CASES, ids=[_id(c) for c in CASES])
async def test_input__refused_with_400_naming_the_field(
    app: FastAPI, org: Org, method: str, url: str, body: bytes | None, field: str, message: str
) -> None:
    headers = {"Content-Type": "application/json"} if body is not None else {}

    with capture_logs() as logs:
        answer = await org.admin.request(method, url, content=body, headers=headers)

    assert 400 == answer.status_code, answer.text
    assert {"error": "API-400", "message": f"{field}: {message}"} == {
        k: answer.json()[k] for k in ("error", "message")
    }
    assert [] == [e for e in logs if e["log_level"] in ("error", "critical") or "exc_info" in e]


async def test_input__refused_before_authentication(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://po.test") as anonymous:
        gateway = await anonymous.post("/runner-gateway/v1/orgs/x/runners/ab%00c/events", json={})
        long_poll = await anonymous.post("/runner-gateway/v1/orgs/x/runners/ab%00c/commands/next")
        api = await anonymous.get("/orgs/acme/runners/ab%00c")

    assert [400, 400, 400] == [gateway.status_code, long_poll.status_code, api.status_code]


async def test_input__a_header_used_as_an_id_is_checked(app: FastAPI, org: Org) -> None:
    answer = await org.admin.post(
        "/orgs/acme/deployments", json={"project_id": "p"}, headers={"Idempotency-Key": "a\x00b"}
    )

    assert 400 == answer.status_code, answer.text
    assert f"idempotency-key: {NUL_MESSAGE}" == answer.json()["message"]


async def test_input__escapes_of_real_text_pass(app: FastAPI, org: Org) -> None:
    body = b'{"id": "pp", "display_name": "caf\\u00e9 \\ud83d\\ude00 1e9 NaNa \\\\u0000"}'

    created = await org.admin.post(
        "/orgs/acme/projects", content=body, headers={"Content-Type": "application/json"}
    )

    assert 201 == created.status_code, created.text
    assert "café 😀 1e9 NaNa \\u0000" == created.json()["display_name"]


async def test_input__a_state_document_is_kept_whatever_text_it_holds(app: FastAPI, org: Org) -> None:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    await org.admin.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    env = (
        await org.admin.post(f"{base}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"})
    ).json()
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    token = deployment_tokens.deployment_token(app.state.services.token_key, org.id, deployment_id)
    auth = {"Authorization": "Basic " + base64.b64encode(f"{deployment_id}:{token}".encode()).decode()}
    state = b'{"version": 4, "serial": 1, "lineage": "l", "outputs": {"x": {"value": "a\\u0000b"}}}'
    url = f"/runner-gateway/v1/orgs/{org.id}/environments/{env['uuid']}/state"

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as runner:
        stored = await runner.post(url, content=state, headers={**auth, "Content-Type": "application/json"})
        read = await runner.get(url, headers=auth)

    assert 200 == stored.status_code, stored.text
    assert state == read.content


def test_input__over_real_http_the_issue_s_request_answers_400(settings: ServerSettings) -> None:
    with serve_in_thread(create_app(settings, run_dispatcher=False)) as base_url:
        with httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
        ) as client:
            answers: dict[str, Any] = {
                "events": client.post("/runner-gateway/v1/orgs/x/runners/ab%00c/events", json={}),
                "next": client.post("/runner-gateway/v1/orgs/x/runners/ab%00c/commands/next"),
                "query": client.get("/orgs/x/deployments", params={"env_id": "a\x00"}),
                "body": client.post("/orgs", json={"id": f"o{uuid.uuid4().hex[:6]}", "x": "\x00"}),
            }

    assert {name: 400 for name in answers} == {name: a.status_code for name, a in answers.items()}
    assert f"runner_id: {NUL_MESSAGE}" == answers["events"].json()["message"]
    assert f"x: {NUL_MESSAGE}" == answers["body"].json()["message"]
