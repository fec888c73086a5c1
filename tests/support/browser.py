"""Headless Chromium for the console's tests (tests/browser): Debian's ``chromium`` driven by PyPI
``playwright`` (whose own browser download cannot work here), axe-core injected from
``tests/tools/axe`` (npm ``axe-core``, ``npm ci --prefix tests/tools/axe``), and a record of every
request a page makes.

A missing piece skips the tests locally, saying which and how to install it, and fails them in CI
(:func:`tests.support.tools.tools_required`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.tools import tools_required

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / "tests" / "tools" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
SCREENSHOTS = ROOT / "docs" / "screenshots"
#: Chromium's flags here: no sandbox (the tests may run as root), nothing fetched from the network.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
#: The viewports of the screenshots: a laptop and a phone.
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def missing(reason: str, *, module: bool = False) -> None:
    """Skip locally, fail in CI (a tool the tests need is missing); ``module``: the whole test module."""
    if tools_required():
        pytest.fail(reason)
    pytest.skip(reason, allow_module_level=module)


#: Why the browser tests cannot run without PyPI playwright.
NO_PLAYWRIGHT = (
    "PyPI playwright is not installed (it belongs in the dev dependency group; the browser is Debian's "
    "chromium)"
)


def chromium_path() -> str:
    """Debian's Chromium (``PO_TEST_CHROMIUM`` overrides); skipped or failed when there is none."""
    found = os.environ.get("PO_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        missing("no chromium on PATH: apt-get install -y chromium (.ci/run installs it)")
    assert found is not None
    return found


def axe_source() -> str:
    if not AXE.is_file():
        missing(f"axe-core is not installed: npm ci --prefix tests/tools/axe ({AXE} is missing)")
    return AXE.read_text()


@dataclass
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    body: str | None


@dataclass
class Recorder:
    """Every request the page made (URL, headers, body), and the page's errors (uncaught exceptions and
    console errors other than failed loads, which the API's 4xx answers cause on purpose)."""

    requests: list[Sent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> None:
        page.on("request", self._request)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        page.on("console", self._console)

    def _request(self, request: Request) -> None:
        self.requests.append(Sent(request.method, request.url, dict(request.headers), request.post_data))

    def _console(self, message: Any) -> None:
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {message.text}")

    def carrying(self, secret: str) -> list[Sent]:
        """The requests whose URL, headers or body hold ``secret``."""
        return [
            sent
            for sent in self.requests
            if secret in sent.url
            or secret in (sent.body or "")
            or any(secret in v for v in sent.headers.values())
        ]


def check_accessible(page: Page, source: str) -> list[str]:
    """axe-core's serious and critical violations on the page as it is (rule, impact, target, summary)."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        # Evaluated, not added as a <script>: the console's policy refuses inline script (as it should).
        page.evaluate(source + "\n;undefined")
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations.map(v => ("
        "{id: v.id, impact: v.impact, nodes: v.nodes.map(n => [n.target.join(' '), n.failureSummary])}))"
    )
    return [
        f"{violation['id']} ({violation['impact']}): {target}: {summary}"
        for violation in result
        if violation["impact"] in ("serious", "critical")
        for target, summary in violation["nodes"]
    ]


def screenshot(page: Page, name: str, *, full_page: bool = True) -> None:
    """docs/screenshots/<name>.png, shown in docs/guides/console.md."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page, animations="disabled")


@dataclass
class Tab:
    """A page of its own browser context, and the record of its requests and errors."""

    page: Any
    recorder: Recorder
