"""Organizations, tokens, env types, projects and environments through the HTTP API."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import httpx
import sqlalchemy as sa
from fastapi import FastAPI

from orchestrator.api.context import hash_token
from orchestrator.store import orgs as org_store
from orchestrator.store.schema import api_tokens
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, walk_pages


async def test_healthz__answers_without_auth(admin: httpx.AsyncClient) -> None:
    response = await httpx.AsyncClient(transport=admin._transport, base_url="http://po.test").get("/healthz")

    assert 200 == response.status_code


async def test_metrics__answer_without_auth_and_hold_no_token_or_id(admin: httpx.AsyncClient) -> None:
    """``/metrics`` needs no credentials; after a request naming an organization and using a token, the
    exposition names neither (routes are templates), and the database gauges are there."""
    created = await admin.post("/orgs", json={"id": "metrics-org"})
    await admin.get("/orgs/metrics-org/projects/nope")
    anonymous = httpx.AsyncClient(transport=admin._transport, base_url="http://po.test")
    response = await anonymous.get("/metrics")

    assert 201 == created.status_code
    assert 200 == response.status_code
    assert response.headers["content-type"].startswith("text/plain")
    assert "metrics-org" not in response.text
    assert BOOTSTRAP_TOKEN not in response.text
    assert (
        'po_http_requests_total{method="GET",route="/orgs/{org_id}/projects/{project_id}",status="404"}'
        in response.text
    )
    assert "# TYPE po_deployments_running gauge" in response.text
    assert "po_agent_commands_pending 0.0" in response.text


async def test_orgs__create_with_id_and_generated(admin: httpx.AsyncClient) -> None:
    named = await admin.post("/orgs", json={"id": "my-org"})
    generated = await admin.post("/orgs")

    assert 201 == named.status_code
    assert "my-org" == named.json()["id"]
    assert 201 == generated.status_code
    assert generated.json()["id"].startswith("org-")
    assert 409 == (await admin.post("/orgs", json={"id": "my-org"})).status_code


async def test_orgs__bad_id_names_the_field(admin: httpx.AsyncClient) -> None:
    response = await admin.post("/orgs", json={"id": "Not_Valid"})

    assert 400 == response.status_code
    assert response.json()["message"].startswith("id:")


async def test_orgs__unknown_field_is_refused(admin: httpx.AsyncClient) -> None:
    response = await admin.post("/orgs", json={"id": "ok-org", "colour": "red"})

    assert 400 == response.status_code
    assert "colour: unknown field" == response.json()["message"]


async def test_auth__missing_and_wrong_token(admin: httpx.AsyncClient) -> None:
    anonymous = httpx.AsyncClient(transport=admin._transport, base_url="http://po.test")
    wrong = httpx.AsyncClient(
        transport=admin._transport, base_url="http://po.test", headers={"Authorization": "Bearer nope"}
    )

    assert 401 == (await anonymous.get("/orgs")).status_code
    assert 401 == (await wrong.get("/orgs")).status_code
    assert "error" in (await wrong.get("/orgs")).json()


async def test_tokens__answered_once_listed_without_secret_and_revoked(org: Org) -> None:
    created = await org.admin.post(f"/orgs/{org.id}/tokens", json={"role": "viewer", "description": "ci"})
    secret = created.json()["token"]
    listed = await org.admin.get(f"/orgs/{org.id}/tokens")
    viewer = httpx.AsyncClient(
        transport=org.admin._transport,
        base_url="http://po.test",
        headers={"Authorization": f"Bearer {secret}"},
    )
    before = await viewer.get(f"/orgs/{org.id}/projects")
    revoked = await org.admin.delete(f"/orgs/{org.id}/tokens/{created.json()['id']}")
    after = await viewer.get(f"/orgs/{org.id}/projects")

    assert 201 == created.status_code
    assert secret not in listed.text
    assert all("token" not in item for item in listed.json()["items"])
    assert 200 == before.status_code
    assert 204 == revoked.status_code
    assert 401 == after.status_code


async def test_tokens__stored_as_keyed_hashes_never_bare_sha256(app: FastAPI, org: Org) -> None:
    """Org tokens and the bootstrap token are stored as HMAC-SHA256 under a key derived from the server
    key: the table alone holds no bare SHA-256 of any token."""
    secret = (await org.admin.post(f"/orgs/{org.id}/tokens", json={"role": "viewer"})).json()["token"]
    async with app.state.services.engine.connect() as conn:
        stored = set((await conn.execute(sa.select(api_tokens.c.token_hash))).scalars())

    assert _sha256(secret) not in stored
    assert _sha256(BOOTSTRAP_TOKEN) not in stored
    assert hash_token(app.state.services.api_token_key, secret) in stored
    assert hash_token(app.state.services.api_token_key, BOOTSTRAP_TOKEN) in stored


async def test_tokens__legacy_sha256_row_authenticates_and_is_upgraded(app: FastAPI, org: Org) -> None:
    """A row written before keyed hashes (bare SHA-256) still admits its token, and on that first use
    is rewritten to the keyed hash."""
    secret = "pot_legacy-token-0123456789abcdef0123456789abcdef"
    async with app.state.services.engine.begin() as conn:
        legacy = await org_store.create_token(
            conn, org_id=org.id, role="viewer", description="old", token_hash=_sha256(secret), prefix="pot_le"
        )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://po.test",
        headers={"Authorization": f"Bearer {secret}"},
    )

    async with client:
        first = await client.get(f"/orgs/{org.id}/projects")
        async with app.state.services.engine.connect() as conn:
            stored = (
                await conn.execute(sa.select(api_tokens.c.token_hash).where(api_tokens.c.id == legacy.id))
            ).scalar_one()
        second = await client.get(f"/orgs/{org.id}/projects")
        wrong = await client.get(f"/orgs/{org.id}/projects", headers={"Authorization": f"Bearer {secret}x"})

    assert (200, 200, 401) == (first.status_code, second.status_code, wrong.status_code)
    assert hash_token(app.state.services.api_token_key, secret) == stored


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_tokens__platform_role_cannot_be_given(org: Org) -> None:
    response = await org.admin.post(f"/orgs/{org.id}/tokens", json={"role": "platform-admin"})

    assert 400 == response.status_code
    assert response.json()["message"].startswith("role:")


async def test_projects__crud(org: Org) -> None:
    base = f"/orgs/{org.id}/projects"
    created = await org.admin.post(base, json={"id": "shop", "display_name": "Shop"})
    got = await org.admin.get(f"{base}/shop")
    patched = await org.admin.patch(f"{base}/shop", json={"display_name": "The Shop"})
    listed = await org.admin.get(base)
    deleted = await org.admin.delete(f"{base}/shop")

    assert 201 == created.status_code
    assert {"id": "shop", "display_name": "Shop", "status": "active"}.items() <= got.json().items()
    assert "The Shop" == patched.json()["display_name"]
    assert ["shop"] == [p["id"] for p in listed.json()["items"]]
    assert 204 == deleted.status_code
    assert 404 == (await org.admin.get(f"{base}/shop")).status_code


async def test_projects__display_name_with_newline_refused(org: Org) -> None:
    response = await org.admin.post(f"/orgs/{org.id}/projects", json={"id": "p1", "display_name": "a\nb"})

    assert 400 == response.status_code
    assert response.json()["message"].startswith("display_name:")


async def test_envs__create_starts_unlinked_and_lists(org: Org) -> None:
    await org.admin.post(f"/orgs/{org.id}/env-types", json={"id": "development"})
    await org.admin.post(f"/orgs/{org.id}/projects", json={"id": "shop"})
    created = await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"}
    )
    by_type = await org.admin.get(f"/orgs/{org.id}/envs", params={"byEnvTypeId": "development"})
    other_type = await org.admin.get(f"/orgs/{org.id}/envs", params={"byEnvTypeId": "production"})

    assert 201 == created.status_code
    body = created.json()
    assert "runner_id" not in body  # absent, not null: upstream's optional fields are never null
    assert {
        "id": "dev",
        "project_id": "shop",
        "env_type_id": "development",
        "status": "active",
    }.items() <= body.items()
    assert body["uuid"] and body["project_uuid"]
    assert ["dev"] == [e["id"] for e in by_type.json()["items"]]
    assert [] == other_type.json()["items"]


async def test_envs__unknown_env_type_names_field(org: Org) -> None:
    await org.admin.post(f"/orgs/{org.id}/projects", json={"id": "shop"})
    response = await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": "dev", "env_type_id": "nope"}
    )

    assert 400 == response.status_code
    assert response.json()["message"].startswith("env_type_id:")


async def test_env_types__in_use_cannot_be_deleted(org: Org) -> None:
    await org.admin.post(f"/orgs/{org.id}/env-types", json={"id": "development"})
    await org.admin.post(f"/orgs/{org.id}/projects", json={"id": "shop"})
    await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"}
    )

    response = await org.admin.delete(f"/orgs/{org.id}/env-types/development")

    assert 409 == response.status_code
    assert "shop/dev" in response.json()["message"]


async def test_paging__walks_every_item_once(org: Org) -> None:
    for i in range(7):
        await org.admin.post(f"/orgs/{org.id}/projects", json={"id": f"p{i}"})
    seen = [p["id"] for p in await walk_pages(org.admin, f"/orgs/{org.id}/projects", 3)]

    assert [f"p{i}" for i in range(7)] == seen


async def test_paging__tokens_walk_every_item_once(org: Org) -> None:
    """Tokens page by their UUID: small pages give each once, in the order of one large page."""
    for i in range(3):
        await org.admin.post(f"/orgs/{org.id}/tokens", json={"role": "viewer", "description": f"t{i}"})
    path = f"/orgs/{org.id}/tokens"

    ids = [t["id"] for t in await walk_pages(org.admin, path, 2)]

    assert len(ids) == 6  # the org's admin, deployer and viewer tokens, and these three
    assert ids == [t["id"] for t in await walk_pages(org.admin, path, 100)]


async def test_paging__bad_token_and_per_page(org: Org) -> None:
    bad_token = await org.admin.get(f"/orgs/{org.id}/projects", params={"page": "!!!"})
    bad_size = await org.admin.get(f"/orgs/{org.id}/projects", params={"per_page": 0})

    assert 400 == bad_token.status_code
    assert "page: invalid page token" == bad_token.json()["message"]
    assert 400 == bad_size.status_code
    assert bad_size.json()["message"].startswith("per_page:")


async def test_body_limit__413(org: Org) -> None:
    response = await org.admin.post(
        f"/orgs/{org.id}/projects",
        content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )

    assert 413 == response.status_code
    assert "API-413" == response.json()["error"]


async def _chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """A JSON body of ``total`` bytes, streamed: httpx sends it chunked, without Content-Length."""
    yield b"{"
    for _ in range(total // size):
        yield b" " * size
    yield b"}"


async def test_body_limit__chunked_body_413(org: Org) -> None:
    """Without Content-Length the limit is found while reading: still 413, not a 400 parse error."""
    over = await org.admin.post(
        f"/orgs/{org.id}/projects",
        content=_chunks(2 * 1024 * 1024),
        headers={"content-type": "application/json"},
    )
    under = await org.admin.post(
        f"/orgs/{org.id}/projects",
        content=_streamed(b'{"id": "streamed"}'),
        headers={"content-type": "application/json"},
    )

    assert "chunked" == over.request.headers["transfer-encoding"]
    assert (413, "API-413") == (over.status_code, over.json()["error"])
    assert "request body is larger than 1048576 bytes" == over.json()["message"]
    assert 201 == under.status_code, under.text


async def _streamed(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_malformed_json__400(org: Org) -> None:
    response = await org.admin.post(
        f"/orgs/{org.id}/projects", content=b"{not json", headers={"content-type": "application/json"}
    )

    assert 400 == response.status_code
