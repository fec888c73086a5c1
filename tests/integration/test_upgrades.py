"""Upgrades from every earlier released schema, with data in it, on both databases: the database is
migrated to revision R, rows of every kind that R has are written as R's orchestrator wrote them
(organizations, tokens, a runner with sealed secrets, an environment, a deployment, a sealed state
version, an agent command, managed runners, the key check, and from 0014 on a live log chunk), then it is
upgraded to the head: every row is there, the sealed values still open with the server key, and the API
answers them (a deployment from before 0014 with the phases its row tells)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from pydantic import SecretStr

from orchestrator.dispatch.state_versions import state_context
from orchestrator.secretbox import SecretBox, key_check_value
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store.schema import metadata
from tests.support.orgs import BOOTSTRAP_TOKEN, api_client
from tests.support.postgres import PostgresServer

KEY = b"u" * 32
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(days=3650)
ENV_UUID = uuid.UUID("00000000-0000-0000-0000-00000000e001")
DEPLOYMENT_ID = uuid.UUID("00000000-0000-0000-0000-00000000d001")
SECRETS = {"token": "s3cret"}
STATE = json.dumps({"version": 4, "serial": 1, "lineage": "l", "resources": []}).encode()
#: A live log chunk (issue 22; migration 0014): age ciphertext, as bytes.
CHUNK = b"age-encryption.org/v1\n-> X25519 stand-in\n"


def _earlier_revisions() -> list[str]:
    """Every revision from the first to the one before the head, oldest first."""
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    revisions = [script.revision for script in reversed(list(scripts.walk_revisions()))]
    return [revision for revision in revisions if revision not in migrate.head_revisions()]


def _rows(box: SecretBox) -> list[tuple[str, dict[str, Any]]]:
    """One row of each kind, in foreign-key order, with the head's column names; a revision gets the
    columns it has (columns added later are nullable or have defaults)."""
    stamps = {"created_at": NOW, "updated_at": NOW}
    return [
        ("orgs", {"id": "o", "uuid": uuid.uuid4(), "status": "active", "created_by": "x", **stamps}),
        (
            "api_tokens",
            {
                "id": uuid.uuid4(),
                "org_id": "o",
                "role": "admin",
                "description": "before the upgrade",
                "token_hash": "1" * 64,
                "prefix": "po_abcdef",
                "created_at": NOW,
            },
        ),
        (
            "env_types",
            {"org_id": "o", "id": "development", "uuid": uuid.uuid4(), "display_name": "D", **stamps},
        ),
        (
            "projects",
            {
                "org_id": "o",
                "id": "shop",
                "uuid": uuid.uuid4(),
                "display_name": "S",
                "status": "active",
                **stamps,
            },
        ),
        (
            "runners",
            {
                "org_id": "o",
                "id": "r",
                "type": "vm",
                "configuration": {"type": "vm", "connection": {"type": "local"}},
                "config_secret": box.seal(json.dumps(SECRETS).encode(), context="runner:o/r"),
                "state_type": "orchestrator",
                "state_configuration": {"type": "orchestrator"},
                **stamps,
            },
        ),
        (
            "envs",
            {
                "org_id": "o",
                "project_id": "shop",
                "id": "dev",
                "uuid": ENV_UUID,
                "env_type_id": "development",
                "display_name": "Dev",
                "status": "active",
                "runner_id": "r",
                **stamps,
            },
        ),
        (
            "deployments",
            {
                "id": DEPLOYMENT_ID,
                "org_id": "o",
                "project_id": "shop",
                "env_id": "dev",
                "env_uuid": ENV_UUID,
                "runner_id": "r",
                "mode": "deploy",
                "plan_only": False,
                "status": "succeeded",
                "status_message": "",
                "manifest": {},
                "tf": "",
                "graph": [],
                "bundle_key": "bundles/b.tar.gz",
                "runner_log_level": "info",
                "request_digest": "0" * 64,
                "created_by": "token-1",
                "metrics": {},
                "dispatch_state": "done",
                "dispatch_attempts": 1,
                "timeout_at": NOW,
                "launched_at": NOW,
                "completed_at": NOW,
                **stamps,
            },
        ),
        (
            "tf_states",
            {
                "env_uuid": ENV_UUID,
                "version": 1,
                "org_id": "o",
                "data": box.seal(STATE, context=state_context(ENV_UUID)),
                "md5": "0" * 32,
                "size": len(STATE),
                "deployment_id": DEPLOYMENT_ID,
                "created_at": NOW,
            },
        ),
        (
            "agent_commands",
            {
                "id": "c1",
                "org_id": "o",
                "runner_id": "r",
                "deployment_id": DEPLOYMENT_ID,
                "type": "deploy",
                "envelope": {},
                "state": "done",
                "attempt": 1,
                "available_at": NOW,
                "expires_at": LATER,
                **stamps,
            },
        ),
        ("agent_presence", {"org_id": "o", "runner_id": "r", "last_seen_at": NOW}),
        (
            "deployment_log_chunks",
            {
                "deployment_id": DEPLOYMENT_ID,
                "seq": 1,
                "org_id": "o",
                "phase": "plan",
                "received_at": NOW,
                "size": len(CHUNK),
                "ciphertext": CHUNK,
            },
        ),
        ("key_checks", {"id": "server", "check_value": key_check_value(KEY), "created_at": NOW}),
        (
            "managed_runners",
            {
                "id": uuid.uuid4(),
                "name": "m1",
                "token_hash": "2" * 64,
                "tags": ["linux"],
                "registered_at": NOW,
                "last_seen_at": NOW,
            },
        ),
        (
            "managed_runner_registrations",
            {
                "id": uuid.uuid4(),
                "secret_hash": "3" * 64,
                "tags": ["linux"],
                "description": "pool",
                "created_at": NOW,
            },
        ),
    ]


def _insert_as_of(connection: sa.Connection, rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Insert the rows of the tables this revision has, with the columns it has; the tables written."""
    inspector = sa.inspect(connection)
    present = set(inspector.get_table_names())
    written = []
    for name, row in rows:
        if name not in present:
            continue
        columns = {column["name"] for column in inspector.get_columns(name)}
        head = metadata.tables[name]
        # The head's column types (UUIDs, JSON, UTC timestamps), without its defaults.
        table = sa.Table(
            name, sa.MetaData(), *(sa.Column(c.name, c.type) for c in head.columns if c.name in columns)
        )
        connection.execute(table.insert().values({k: v for k, v in row.items() if k in columns}))
        written.append(name)
    return written


def _empty_database(database_url: str, request: pytest.FixtureRequest) -> str:
    if database_url.startswith("sqlite"):
        return database_url
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"u{os.getpid()}_{uuid.uuid4().hex[:8]}"
    server.create_database(name)
    return server.url(name)


@pytest.mark.parametrize("revision", _earlier_revisions())
async def test_upgrade_with_data__from_every_earlier_schema_to_head(
    revision: str, database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _empty_database(database_url, request)
    box = SecretBox(KEY)
    rows = _rows(box)
    engine = db.create_engine(url)
    try:
        await migrate.upgrade(engine, revision)
        async with engine.begin() as conn:
            written = await conn.run_sync(_insert_as_of, rows)
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            assert migrate.head_revisions() == await migrate.current_revisions(conn)
            counts = {
                name: (await conn.execute(sa.text(f"SELECT count(*) FROM {name}"))).scalar()
                for name in written
            }
            secret = (await conn.execute(sa.text("SELECT config_secret FROM runners"))).scalar_one()
            state = (await conn.execute(sa.text("SELECT data FROM tf_states"))).scalar_one_or_none()
    finally:
        await db.dispose(engine)

    assert {name: 1 for name in written} == counts
    assert {"orgs", "api_tokens", "runners", "envs"} <= set(written)
    assert SECRETS == json.loads(box.open(secret, context="runner:o/r"))
    if "tf_states" in written:
        assert state is not None
        assert STATE == box.open(state, context=state_context(ENV_UUID))
    settings = ServerSettings(
        data_dir=tmp_path / "data",
        database_url=url,
        bootstrap_token=BOOTSTRAP_TOKEN,
        encryption_key=SecretStr(base64.b64encode(KEY).decode()),
        listen="127.0.0.1:0",
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app), api_client(app, BOOTSTRAP_TOKEN) as client:
        runner = await client.get("/orgs/o/runners/r")
        assert 200 == runner.status_code, runner.text
        env = await client.get("/orgs/o/projects/shop/envs/dev")
        assert 200 == env.status_code, env.text
        if "deployments" in written:
            deployment = await client.get(f"/orgs/o/deployments/{DEPLOYMENT_ID}")
            assert 200 == deployment.status_code, deployment.text
            # Migration 0014 gives the deployments kept so far the phases their rows tell.
            assert ["queued", "launching"] == [p["phase"] for p in deployment.json()["phases"]]
            logs = await client.get(f"/orgs/o/deployments/{DEPLOYMENT_ID}/logs")
            assert 200 == logs.status_code, logs.text
            expected = [base64.b64encode(CHUNK).decode()] if "deployment_log_chunks" in written else []
            assert expected == [item["ciphertext"] for item in logs.json()["items"]]
        if "tf_states" in written:
            versions = await client.get("/orgs/o/projects/shop/envs/dev/state-versions")
            assert 200 == versions.status_code, versions.text
            assert 1 == len(versions.json()["items"]), versions.text
