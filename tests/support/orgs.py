"""Organizations of the in-process app and their API clients: the platform admin's bootstrap token, an
:class:`Org` with one client per role, and :func:`make_org` to create one (tests/conftest.py's ``org``
and ``other_org`` fixtures use it); :func:`walk_pages` follows a list's page tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

#: The platform admin's token of the test settings (tests/conftest.py's ``settings``).
BOOTSTRAP_TOKEN = "test-bootstrap-token-0123456789"


def api_client(app: FastAPI, token: str | None) -> httpx.AsyncClient:
    """A client of the in-process ``app`` (ASGI transport), with ``token`` as its bearer if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://po.test", headers=headers
    )


@dataclass
class Org:
    id: str
    #: Clients of this organization by role: admin, deployer, viewer.
    clients: dict[str, httpx.AsyncClient]
    #: The platform admin (bootstrap token): the only one who may create local runners.
    platform: httpx.AsyncClient

    @property
    def admin(self) -> httpx.AsyncClient:
        return self.clients["admin"]


async def make_org(app: FastAPI, platform: httpx.AsyncClient, org_id: str) -> Org:
    response = await platform.post("/orgs", json={"id": org_id})
    assert response.status_code == 201, response.text
    clients: dict[str, httpx.AsyncClient] = {}
    for role in ("admin", "deployer", "viewer"):
        created = await platform.post(f"/orgs/{org_id}/tokens", json={"role": role, "description": role})
        assert created.status_code == 201, created.text
        clients[role] = api_client(app, created.json()["token"])
    return Org(id=org_id, clients=clients, platform=platform)


async def walk_pages(client: httpx.AsyncClient, path: str, per_page: int) -> list[Any]:
    """Every item of the list at ``path``, read ``per_page`` at a time by following its page tokens."""
    items: list[Any] = []
    token: str | None = None
    while True:
        params: dict[str, str | int] = {"per_page": per_page}
        if token:
            params["page"] = token
        response = await client.get(path, params=params)
        assert response.status_code == 200, response.text
        items += response.json()["items"]
        token = response.json().get("next_page_token")
        if not token:
            return items
