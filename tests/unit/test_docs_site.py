"""The docs site builds with `mkdocs build --strict` (no broken link or anchor, no page left out of the
navigation, no warning) and works offline: no page loads a script, a style sheet or a font from another
host, search is there and works from the file system, and nothing uses Mermaid (whose script Material
would fetch from a CDN). The settings table of docs/operate/server.md names only variables the generated
configuration reference lists (so, that exist)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

import pytest

from orchestrator.settings import ServerSettings
from tests.support.docs import DOCS, ROOT, docs_example

pytestmark = pytest.mark.timeout(300)


@cache
def built(directory: str) -> Path:
    site = Path(directory) / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert 0 == done.returncode, done.stdout[-3000:] + done.stderr[-5000:]
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built(str(tmp_path_factory.mktemp("docs")))


class _Loads(HTMLParser):
    """What a page makes the browser load: script sources, style sheets and other `<link>`s, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.urls.append(str(values["src"]))
        elif tag == "link" and values.get("rel") in ("stylesheet", "preconnect", "preload", "icon"):
            self.urls.append(str(values.get("href")))
        elif tag in ("img", "iframe") and values.get("src"):
            self.urls.append(str(values["src"]))


def test_site__builds_strictly_with_every_page(site: Path) -> None:
    pages = sorted(p.relative_to(DOCS).with_suffix(".html").as_posix() for p in DOCS.rglob("*.md"))
    assert [] == [page for page in pages if not (site / page).is_file()]
    assert (site / "search" / "search_index.js").is_file(), "the offline plugin's search index"


def test_site__loads_nothing_from_another_host(site: Path) -> None:
    remote = []
    for page in sorted(site.rglob("*.html")):
        parser = _Loads()
        text = page.read_text(encoding="utf-8")
        parser.feed(text)
        remote += [
            f"{page.relative_to(site)}: {url}" for url in parser.urls if re.match(r"(https?:)?//", url)
        ]
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        assert 'class="mermaid"' not in text, page
    assert [] == remote
    stylesheets = [p for p in site.rglob("*.css") if "@import url(http" in p.read_text(encoding="utf-8")]
    assert [] == stylesheets


def test_server_page__its_settings_table_names_settings_that_exist() -> None:
    text = (DOCS / "operate" / "server.md").read_text(encoding="utf-8")
    table = text[text.index("## Settings") :]
    named = {
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
    }
    reference = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    known = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", reference, re.M))
    assert {
        f"PO_{name.upper()}" for name in ServerSettings.model_fields if name != "managed_runner_secret"
    } <= known
    assert named, "no settings table found"
    assert [] == sorted(named - known)


def test_concepts__the_manifest_is_part_of_the_one_get_started_deploys() -> None:
    """docs/concepts/modules.md's manifest holds only what examples/demo/manifest.yaml holds (which the Get
    started test deploys): the same workload, resource and outputs, fewer of them."""
    import yaml

    def within(part: object, whole: object) -> bool:
        if isinstance(part, dict):
            return isinstance(whole, dict) and all(
                k in whole and within(v, whole[k]) for k, v in part.items()
            )
        return part == whole

    shown = yaml.safe_load(docs_example("concepts/manifest"))
    assert within(shown, yaml.safe_load((ROOT / "examples" / "demo" / "manifest.yaml").read_text()))


def test_site__search_works_from_the_file_system_and_nothing_is_fetched(site: Path) -> None:
    """Opened as files (file://, no server), in headless Chromium: the search finds a page, and the page
    requested nothing but files."""
    from tests.support import browser

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser.missing(browser.NO_PLAYWRIGHT)
        raise
    requested: list[str] = []
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=browser.chromium_path(), args=list(browser.CHROMIUM_ARGS)
        )
        try:
            page = chromium.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.goto((site / "get-started" / "octl.html").as_uri())
            page.click(".md-search__input")
            page.type(".md-search__input", "rollback", delay=50)
            page.wait_for_selector(".md-search-result__item", timeout=20_000)
            found = page.inner_text(".md-search-result__meta")
            titles = page.locator(".md-search-result__item h1").all_inner_texts()
        finally:
            chromium.close()

    assert "matching document" in found
    assert "State versions" in titles
    assert [] == [url for url in requested if not url.startswith("file://")]
