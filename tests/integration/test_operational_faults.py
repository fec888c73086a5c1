"""Operational faults answer what failed: 503 (with Retry-After where retrying can help) for the object
store, the database and secrets that do not open; a bug answers 500 with an error id the log has too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI
from structlog.testing import capture_logs

from orchestrator.errors import DatabaseUnavailableError
from orchestrator.secretbox import SecretBox
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store.schema import runners
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, make_org
from tests.support.postgres import PostgresError, PostgresServer
from tests.support.readonly import read_only
from tests.support.tools import tools_required

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "demo"
SECRET_VALUE = "s3cr3t-value-do-not-show"


def manifest() -> dict[str, Any]:
    app = {"type": "demo-app", "params": {"name": "shop"}}
    return {"workloads": {"shop": {"resources": {"app": app}}}}


async def make_ready(org: Org) -> None:
    """shop/dev with a local vm runner holding a secret, its rule, and the demo module."""
    runner = yaml.safe_load((EXAMPLES / "runner.yaml").read_text())
    runner["runner_configuration"]["job"]["secrets"] = {"API_TOKEN": SECRET_VALUE}
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/runners", {"id": "local", **runner}),
        ("/runner-rules", {"runner_id": "local"}),
        (
            "/resource-types",
            {"id": "demo-app", **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
        ),
        ("/modules", {"id": "demo-app", **yaml.safe_load((EXAMPLES / "module.yaml").read_text())}),
        ("/module-rules", {"module_id": "demo-app"}),
    ]:
        # A runner with a local connection is the platform admin's to create.
        client = org.platform if path == "/runners" else org.admin
        response = await client.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)


async def deploy(org: Org) -> httpx.Response:
    body = {"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": manifest()}
    return await org.admin.post(f"/orgs/{org.id}/deployments", json=body)


async def test_object_store__read_only_on_deploy_answers_503_naming_it(
    app: FastAPI, org: Org, settings: ServerSettings
) -> None:
    await make_ready(org)

    with read_only(settings.data_dir / "objects", required=tools_required()):
        refused = await deploy(org)
    created = await deploy(org)

    assert 503 == refused.status_code, refused.text
    assert refused.json()["message"].startswith("object store unavailable: cannot write 'bundles/acme/")
    assert str(settings.data_dir) not in refused.text
    assert refused.headers["Retry-After"].isdigit()
    # Nothing of the refused deployment is left: the environment takes the next one.
    assert 201 == created.status_code, created.text


async def test_sealed_secret__runner_reads_deploy_fails_with_a_message_update_mends_it(
    app: FastAPI, org: Org
) -> None:
    await make_ready(org)
    sealed = SecretBox(os.urandom(32)).seal(
        b'{"job.secrets.API_TOKEN": "x"}', context=f"runner:{org.id}/local"
    )
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            runners.update()
            .where(runners.c.org_id == org.id, runners.c.id == "local")
            .values(config_secret=sealed)
        )
    url = f"/orgs/{org.id}/runners/local"

    read = await org.clients["viewer"].get(url)
    created = await deploy(org)
    finished = await org.admin.get(
        f"/orgs/{org.id}/deployments/{created.json()['id']}/actions/wait-for-complete",
        params={"timeout_in_seconds": 30},
    )
    kept = await org.platform.patch(url, json={"runner_configuration": read.json()["runner_configuration"]})
    config = read.json()["runner_configuration"]
    config["job"]["secrets"] = {"API_TOKEN": "a-new-value"}
    mended = await org.platform.patch(url, json={"runner_configuration": config})

    assert 200 == read.status_code, read.text
    assert "SECRET" == read.json()["runner_configuration"]["job"]["secrets"]["API_TOKEN"]
    assert 201 == created.status_code, created.text
    assert "failed" == finished.json()["status"]
    assert finished.json()["status_message"].startswith(
        "the secrets of runner 'local' do not open with the server key"
    )
    assert 400 == kept.status_code, kept.text
    assert "does not open with the server key" in kept.json()["message"]
    assert kept.json()["message"].endswith("send every secret value again")
    assert 200 == mended.status_code, mended.text


async def test_unexpected_error__500_with_an_error_id_the_log_line_has(app: FastAPI) -> None:
    async def broken() -> None:
        raise RuntimeError(f"a bug holding {SECRET_VALUE}")

    app.add_api_route("/test-only/broken", broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://po.test") as client:
        with capture_logs() as logs:
            answer = await client.get("/test-only/broken")
    logged = [e for e in logs if e["event"] == "unexpected error"]

    assert 500 == answer.status_code
    assert "API-500" == answer.json()["error"]
    assert SECRET_VALUE not in answer.text
    assert "Traceback" not in answer.text
    assert 1 == len(logged)
    assert logged[0]["error_id"] == answer.json()["details"]["error_id"]
    assert f"error id {logged[0]['error_id']}" in answer.json()["message"]
    assert isinstance(logged[0]["exc_info"], RuntimeError)


async def test_database__read_only_sqlite_file_is_unavailable_not_a_bug(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'po.db'}"
    engine = db.create_engine(url)
    try:
        await migrate.upgrade(engine)
    finally:
        await db.dispose(engine)

    with read_only(tmp_path / "po.db", required=tools_required()):
        engine = db.create_engine(url)
        try:
            with pytest.raises(DatabaseUnavailableError) as refused:
                async with engine.begin() as conn:
                    await conn.execute(sa.text("DELETE FROM orgs"))
        finally:
            await db.dispose(engine)

    assert "database unavailable: attempt to write a readonly database" == refused.value.message


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
async def test_database__stopped_postgresql_answers_503_and_recovers(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    settings = ServerSettings(
        data_dir=tmp_path / "data",
        database_url=own_postgres.url("po"),
        bootstrap_token=BOOTSTRAP_TOKEN,
        listen="127.0.0.1:0",
    )
    app = create_app(settings, run_dispatcher=False)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://po.test",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        ) as platform:
            org = await make_org(app, platform, "acme")
            own_postgres.pause()
            down = await org.admin.get(f"/orgs/{org.id}/projects")
            own_postgres.resume()
            back = await org.admin.get(f"/orgs/{org.id}/projects")
            for client in org.clients.values():
                await client.aclose()

    assert 503 == down.status_code, down.text
    assert down.json()["message"].startswith("database unavailable: ")
    assert "127.0.0.1" not in down.text
    assert down.headers["Retry-After"].isdigit()
    assert 200 == back.status_code, back.text
