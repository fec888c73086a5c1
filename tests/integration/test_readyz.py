"""``/readyz``: 200 when the database answers, its schema is this code's and the object store takes a
write and a delete; else 503 naming the check that failed (``details.failed``), on the real app, a real
database (a stopped PostgreSQL, a schema behind) and a real object store directory (read-only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from fastapi import FastAPI
from structlog.testing import capture_logs

from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from tests.support.postgres import PostgresError, PostgresServer
from tests.support.readonly import read_only
from tests.support.tools import tools_required


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")


async def test_readyz__every_check_ok(app: FastAPI, settings: ServerSettings) -> None:
    async with client(app) as probe:
        ready = await probe.get("/readyz")
        live = await probe.get("/healthz")

    assert 200 == ready.status_code, ready.text
    assert {
        "status": "ok",
        "checks": {"database": "ok", "migrations": "ok", "object_store": "ok"},
    } == ready.json()
    assert {"status": "ok"} == live.json()
    # The probe object was deleted again.
    assert not list((settings.data_dir / "objects").rglob("readyz-*"))


async def test_readyz__schema_behind_the_code__503_naming_migrations(
    app: FastAPI, settings: ServerSettings
) -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    (head,) = script.get_heads()
    previous = script.get_revision(head).down_revision
    assert isinstance(previous, str)
    engine = db.create_engine(settings.resolved_database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": previous})
        async with client(app) as probe:
            behind = await probe.get("/readyz")
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": head})
        async with client(app) as probe:
            current = await probe.get("/readyz")
    finally:
        await db.dispose(engine)

    assert 503 == behind.status_code, behind.text
    body = behind.json()
    assert "API-503" == body["error"]
    assert ["migrations"] == body["details"]["failed"]
    assert body["details"]["checks"]["database"] == "ok"
    assert f"the schema is at revision {previous}, this server needs {head}" in body["message"]
    assert "orchestrator migrate" in body["message"]
    assert 200 == current.status_code, current.text


async def test_readyz__schema_newer_than_the_code__503_saying_to_replace_this_server(
    app: FastAPI, settings: ServerSettings
) -> None:
    """An old replica still running after a newer one migrated: out of rotation, never migrating down."""
    engine = db.create_engine(settings.resolved_database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_newer'"))
        async with client(app) as probe:
            newer = await probe.get("/readyz")
        async with engine.connect() as conn:
            still = await migrate.current_revisions(conn)
    finally:
        await db.dispose(engine)

    assert 503 == newer.status_code, newer.text
    assert ["migrations"] == newer.json()["details"]["failed"]
    assert (
        f"the schema is at revision 9999_newer, newer than this server's {migrate.head()}: replace this "
        "server with a newer orchestrator"
    ) in newer.json()["message"]
    assert frozenset({"9999_newer"}) == still


async def test_readyz__object_store_not_writable__503_naming_it(
    app: FastAPI, settings: ServerSettings
) -> None:
    with read_only(settings.data_dir / "objects", required=tools_required()):
        async with client(app) as probe:
            refused = await probe.get("/readyz")
            live = await probe.get("/healthz")

    assert 503 == refused.status_code, refused.text
    body = refused.json()
    assert ["object_store"] == body["details"]["failed"]
    assert body["details"]["checks"]["object_store"].startswith("object store unavailable: cannot write")
    assert str(settings.data_dir) not in refused.text
    assert refused.headers["Retry-After"].isdigit()
    # Liveness does not depend on it: a restart would not mend the store.
    assert 200 == live.status_code


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except PostgresError as exc:
        if tools_required():
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    server.start(tmp_path / "pg")
    try:
        server.create_database("po")
        yield server
    finally:
        server.stop()


@pytest.mark.postgres
async def test_readyz__database_stopped__503_naming_it_and_ready_again(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    settings = ServerSettings(
        data_dir=tmp_path / "data", database_url=own_postgres.url("po"), listen="127.0.0.1:0"
    )
    app = create_app(settings, run_dispatcher=False)
    async with app.router.lifespan_context(app), client(app) as probe:
        own_postgres.pause()
        # Captured, not rendered: the background workers' tracebacks of the outage render slowly.
        with capture_logs() as logs:
            try:
                down = await probe.get("/readyz")
                live = await probe.get("/healthz")
            finally:
                own_postgres.resume()
        back = await probe.get("/readyz")

    assert 503 == down.status_code, down.text
    body = down.json()
    assert ["database"] == body["details"]["failed"]
    assert body["details"]["checks"]["migrations"] == "not checked: the database does not answer"
    assert body["message"].startswith("not ready: database: ")
    assert "127.0.0.1" not in down.text
    assert 200 == live.status_code
    assert 200 == back.status_code, back.text
    # The server's log has the cause.
    assert any(e["event"] == "readiness check failed" and e["check"] == "database" for e in logs)
