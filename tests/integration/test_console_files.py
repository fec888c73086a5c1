"""The web console's files as the server answers them (no browser: tests/browser drives the pages), and
``GET /whoami``, which the console reads to know the token's organization and permissions."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from orchestrator import console
from tests.support.orgs import Org, api_client

STATIC = Path(console.__file__).parent / "static"
#: The console's own scripts (the vendored bundles are checked by their build, not here).
OWN_SCRIPTS = sorted(path for path in (STATIC / "js").rglob("*.js"))


@pytest.fixture
async def anonymous(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(app, None) as client:
        yield client


@pytest.mark.parametrize("path", ["/", "/console"])
async def test_console__the_root_redirects_to_the_console_relatively(
    anonymous: httpx.AsyncClient, path: str
) -> None:
    """Relative: behind a proxy that serves the orchestrator under /po/, the browser lands on /po/console/."""
    answer = await anonymous.get(path)

    assert (302, "console/") == (answer.status_code, answer.headers["location"])
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


async def test_console__the_page_is_served_with_its_policy_and_revalidated(
    anonymous: httpx.AsyncClient,
) -> None:
    page = await anonymous.get("/console/")
    again = await anonymous.get("/console/", headers={"If-None-Match": page.headers["etag"]})
    script = await anonymous.get("/console/js/app.js")

    assert (200, "text/html; charset=utf-8") == (page.status_code, page.headers["content-type"])
    assert console.CONTENT_SECURITY_POLICY == page.headers["content-security-policy"]
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
    ):
        assert directive in page.headers["content-security-policy"]
    assert ("nosniff", "no-cache") == (page.headers["x-content-type-options"], page.headers["cache-control"])
    assert (304, b"") == (again.status_code, again.content)
    assert (200, "text/javascript; charset=utf-8") == (script.status_code, script.headers["content-type"])
    assert (STATIC / "js" / "app.js").read_bytes() == script.content


async def test_console__an_unknown_file_is_a_404_and_nothing_outside_static_is_served(
    anonymous: httpx.AsyncClient,
) -> None:
    missing = await anonymous.get("/console/js/nope.js")
    escaping = await anonymous.get("/console/%2e%2e/__init__.py")
    writing = await anonymous.post("/console/index.html")

    assert (404, "no console file 'js/nope.js'") == (missing.status_code, missing.json()["message"])
    assert 404 == escaping.status_code
    assert (405, "GET, HEAD, OPTIONS") == (writing.status_code, writing.headers["allow"])


def test_console__the_page_loads_only_relative_urls_and_no_inline_script() -> None:
    """Absolute URLs would break behind a path prefix; inline script or style the policy refuses."""
    html = (STATIC / "index.html").read_text()
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)

    assert urls and [] == [url for url in urls if url.startswith(("/", "http:", "https:", "//"))]
    assert [] == re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert [] == re.findall(r"\son[a-z]+=|\sstyle=", html)


@pytest.mark.parametrize("script", OWN_SCRIPTS, ids=lambda path: str(path.relative_to(STATIC)))
def test_console__no_script_writes_html_or_evaluates_strings(script: Path) -> None:
    """The console builds the DOM from elements and text nodes only (the policy's Trusted Types would
    make these throw anyway); and its API paths are relative."""
    source = script.read_text()

    assert [] == re.findall(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function", source
    )
    assert [] == re.findall(r"""fetch\(\s*["'`]/""", source)


async def test_whoami__an_organization_token_and_a_platform_admin(
    org: Org, admin: httpx.AsyncClient, anonymous: httpx.AsyncClient
) -> None:
    viewer = await org.clients["viewer"].get("/whoami")
    org_admin = await org.admin.get("/whoami")
    platform = await admin.get("/whoami")
    nobody = await anonymous.get("/whoami")

    assert ("acme", "viewer", ["read"]) == (
        viewer.json()["org_id"],
        viewer.json()["role"],
        viewer.json()["permissions"],
    )
    assert ["read", "deploy", "manage"] == org_admin.json()["permissions"]
    assert (None, "platform-admin") == (platform.json()["org_id"], platform.json()["role"])
    assert 401 == nobody.status_code
