"""One real server per test module and database (uvicorn on 127.0.0.1 with the dispatcher, as
``orchestrator serve`` runs it) filled by ``tests.support.console_site.populate``, and headless Chromium
(tests/support/browser.py) with a fresh context (empty sessionStorage) per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.settings import ServerSettings
from tests.support import browser
from tests.support.console_site import Site, populate
from tests.support.databases import DATABASES, TEMPLATE_DB
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.postgres import PostgresServer
from tests.support.stack import running_server

_counter = itertools.count()


@pytest.fixture(scope="module", params=DATABASES)
def module_database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh, migrated database for the module, on each database of PO_TEST_DATABASES."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('console-db') / 'test.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"console{os.getpid()}_{next(_counter)}"
    server.create_database(name, template=TEMPLATE_DB)
    return server.url(name)


@pytest.fixture(scope="module")
def chromium(module_database_url: str) -> Iterator[Any]:
    """Started after the module's database (PostgreSQL's set-up runs asyncio.run(), which cannot run once
    Playwright's synchronous API runs its event loop in this thread), and again for each database."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser.missing(browser.NO_PLAYWRIGHT)
        raise
    executable = browser.chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=list(browser.CHROMIUM_ARGS))
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def site(module_database_url: str, chromium: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The browser first: a machine without one skips before a server starts."""
    tmp = tmp_path_factory.mktemp("console")

    def make(port: int) -> ServerSettings:
        return ServerSettings(
            data_dir=tmp / "data",
            database_url=module_database_url,
            bootstrap_token=BOOTSTRAP_TOKEN,
            allow_local_runners=True,
            local_run_user="",
            local_runs_dir=tmp / "runs",
            listen=f"127.0.0.1:{port}",
            public_url=f"http://127.0.0.1:{port}",
            status_check_interval_seconds=0.5,
            # The Managed pool, shown read-only on the Runners page.
            managed_runner_secret="m" * 48,
        )

    with running_server(make) as url:
        made = populate(url, tmp)
        yield made
        made.stack.client.close()


@pytest.fixture(scope="session")
def axe() -> str:
    return browser.axe_source()


@pytest.fixture
def tab(chromium: Any) -> Iterator[browser.Tab]:
    """A page in a fresh browser context (its own sessionStorage), laptop-sized, its requests recorded;
    at the end, no script error and no policy violation happened in it."""
    context = chromium.new_context(viewport=browser.LAPTOP, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    recorder = browser.Recorder()
    recorder.attach(page)
    yield browser.Tab(page=page, recorder=recorder)
    context.close()
    assert [] == recorder.errors, "errors in the page (script errors, policy violations)"
