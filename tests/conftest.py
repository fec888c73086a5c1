"""Fixtures shared by every test: databases (SQLite and PostgreSQL), the app, API clients."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import structlog
from fastapi import FastAPI

from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from tests.support.databases import DATABASES, TEMPLATE_DB
from tests.support.log_lines import PRISTINE_LOGGER, logger_state, restore_logger
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, api_client, make_org
from tests.support.postgres import PostgresError, PostgresServer
from tests.support.tools import tools_required

_counter = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.spread``: each test function runs on one of the databases (the same at every run),
    for end-to-end tests of behaviour the database has no part in (the store's own tests and the fault and
    isolation suites run on every database); ``@pytest.mark.spread(False)`` on a function of a spread
    module runs it on every database.

    ``@pytest.mark.diagonal("name")``: the test's values of parameter ``name`` are spread over the databases
    instead of crossed with them (value i on database i modulo their number), so each value and each
    database run once, not every pair: for end-to-end tests whose other dimension (the Terraform engine, how
    the server is stopped) has nothing to do with the database. With fewer values than databases, every
    pair runs."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker("diagonal")
        callspec = getattr(item, "callspec", None)
        if callspec is None or "database_url" not in callspec.params:
            kept.append(item)
            continue
        spread = item.get_closest_marker("spread")
        if spread is not None and spread.args != (False,):
            # One database per test function, the same at every run (a checksum of its name).
            chosen = zlib.crc32(item.originalname.encode()) % len(DATABASES)  # type: ignore[attr-defined]
            (kept if DATABASES.index(callspec.params["database_url"]) == chosen else dropped).append(item)
            continue
        if marker is None:
            kept.append(item)
            continue
        (name,) = marker.args
        if name not in callspec.indices:
            kept.append(item)
            continue
        values = _parameter_count(item, name)
        database = DATABASES.index(callspec.params["database_url"])
        if values < len(DATABASES) or callspec.indices[name] % len(DATABASES) == database:
            kept.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _parameter_count(item: pytest.Item, name: str) -> int:
    """How many values parameter ``name`` of ``item``'s function takes (its ``parametrize`` or fixture)."""
    fixture_defs = item._fixtureinfo.name2fixturedefs.get(name)  # type: ignore[attr-defined]
    if fixture_defs and fixture_defs[-1].params is not None:
        return len(fixture_defs[-1].params)
    for mark in item.iter_markers("parametrize"):
        names = mark.args[0]
        listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if name in listed:
            return len(mark.args[1])
    raise ValueError(f"{item.nodeid}: diagonal parameter {name!r} is not parametrized")


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from fixtures, never from the developer's environment."""
    for name in list(os.environ):
        if name.startswith("PO_") and not name.startswith("PO_TEST"):
            monkeypatch.delenv(name)


#: structlog's configuration before a test module is imported (conftest is imported first).
_PRISTINE_STRUCTLOG = structlog.get_config()


@pytest.fixture(autouse=True)
def _isolated_logging() -> Iterator[None]:
    """A test that runs a command configuring logs (``orchestrator serve`` or ``token create`` in-process,
    ``po-runner``) leaves structlog writing to the stream it had then, often a capture already closed: every
    test starts and ends with structlog as it was before any import, and the standard loggers as the test
    found them."""
    structlog.configure(**_PRISTINE_STRUCTLOG)
    loggers = {"": logging.getLogger(), **_loggers()}
    states = {name: logger_state(logger) for name, logger in loggers.items()}
    yield
    structlog.configure(**_PRISTINE_STRUCTLOG)
    # uvicorn's own logging config (a test's uvicorn.Config) stops ``uvicorn.*`` lines reaching the root
    # logger and sets their levels; a library's dictConfig may disable loggers: all put back.
    for name, logger in {"": logging.getLogger(), **_loggers()}.items():
        restore_logger(logger, states.get(name, PRISTINE_LOGGER))


def _loggers() -> dict[str, logging.Logger]:
    return {
        name: logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except PostgresError as exc:
        if tools_required():
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    server.start(tmp_path_factory.mktemp("pg"))
    try:
        server.create_database(TEMPLATE_DB)
        engine = db.create_engine(server.url(TEMPLATE_DB))

        async def _migrate() -> None:
            await migrate.upgrade(engine)
            await engine.dispose()

        asyncio.run(_migrate())
        yield server
    finally:
        server.stop(remove_in_background=True)


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, migrated database per test, on each database of PO_TEST_DATABASES."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"t{os.getpid()}_{next(_counter)}"
        server.create_database(name, template=TEMPLATE_DB)
        return server.url(name)
    raise ValueError(f"unknown database {request.param!r} in PO_TEST_DATABASES")


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> ServerSettings:
    return ServerSettings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        bootstrap_token=BOOTSTRAP_TOKEN,
        allow_local_runners=True,
        # Local runs as the test's own user: tests/acceptance/test_local_isolation.py runs them as an
        # unprivileged user (the default), whose reach tmp_path (0700) is not in.
        local_run_user="",
        local_runs_dir=tmp_path / "runs",
        listen="127.0.0.1:0",
    )


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def admin(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client with the platform-admin bootstrap token."""
    async with api_client(app, BOOTSTRAP_TOKEN) as client:
        yield client


@pytest.fixture
async def org(app: FastAPI, admin: httpx.AsyncClient) -> AsyncIterator[Org]:
    """Organization ``acme`` with an admin, a deployer and a viewer token."""
    made = await make_org(app, admin, "acme")
    yield made
    for client in made.clients.values():
        await client.aclose()


@pytest.fixture
async def other_org(app: FastAPI, admin: httpx.AsyncClient) -> AsyncIterator[Org]:
    """A second organization, ``globex``, to check isolation."""
    made = await make_org(app, admin, "globex")
    yield made
    for client in made.clients.values():
        await client.aclose()
