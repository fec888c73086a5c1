"""``orchestrator backup`` and ``restore`` (orchestrator.backup) on both databases: a backup made while a
burst of writes runs restores, elsewhere, to a consistent copy (every table's rows as at one moment);
restore refuses a newer schema, a key that does not open the backup and a target that is not empty, each
with its message; the key is in the backup only when asked."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from pydantic import SecretStr

from orchestrator import backup as backups
from orchestrator.blobs import FileBlobStore
from orchestrator.secretbox import KEY_FILE_NAME
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store import log_chunks as chunk_store
from orchestrator.store import phases as phase_store
from tests.support.agent_gateway import AgentHarness
from tests.support.deployments import insert_deployment
from tests.support.emulators import MOTO_CREDENTIALS, emulator_or_skip, start_moto
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, api_client
from tests.support.postgres import PostgresServer

_BURST_PREFIX = "burst"
#: A live log chunk: what a runner sends (age ciphertext).
CHUNK = b"age-encryption.org/v1\n-> X25519 stand-in\n"


def _elsewhere(
    settings: ServerSettings, tmp_path: Path, request: pytest.FixtureRequest, name: str
) -> ServerSettings:
    """Settings of a new, empty data dir and database of the same kind as ``settings``'."""
    database_url = None
    if settings.resolved_database_url.startswith("postgresql"):
        server: PostgresServer = request.getfixturevalue("postgres_server")
        database = f"r{os.getpid()}_{uuid.uuid4().hex[:8]}"
        server.create_database(database)
        database_url = server.url(database)
    return settings.model_copy(update={"data_dir": tmp_path / name, "database_url": database_url})


async def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names())
            found = {}
            for name in sorted(names):
                rows = (await conn.execute(sa.text(f"SELECT * FROM {name}"))).all()
                found[name] = sorted(tuple(map(str, row)) for row in rows)
    finally:
        await db.dispose(engine)
    return found


def _burst(url: str, stop: threading.Event, written: list[str]) -> None:
    """Orgs ``burst00000``, ``burst00001``... one per transaction, until ``stop``."""

    async def run() -> None:
        engine = db.create_engine(url)
        try:
            while not stop.is_set():
                org_id = f"{_BURST_PREFIX}{len(written):05d}"
                async with engine.begin() as conn:
                    await conn.execute(
                        sa.text("INSERT INTO orgs VALUES (:id, :u, 'active', 'x', :t, :t)"),
                        {"id": org_id, "u": uuid.uuid4().hex, "t": datetime.now(UTC)},
                    )
                written.append(org_id)
        finally:
            await db.dispose(engine)

    asyncio.run(run())


async def _populate(app: FastAPI, org: Org, settings: ServerSettings) -> str:
    """Runners, an object, and a deployment with its phases and a live log chunk (issue 22); its id."""
    harness = await AgentHarness.create(app, org)
    await harness.aclose()
    await FileBlobStore(settings.data_dir / "objects").put("bundles/one.tar.gz", b"bundle bytes")
    env = (
        await org.admin.post(
            f"/orgs/{org.id}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"}
        )
    ).json()
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    now = datetime.now(UTC)
    async with app.state.services.engine.begin() as conn:
        for phase in ("queued", "launching", "plan"):
            await phase_store.append(
                conn, deployment_id=uuid.UUID(deployment_id), org_id=org.id, phase=phase, now=now
            )
        await chunk_store.insert(
            conn,
            deployment_id=uuid.UUID(deployment_id),
            org_id=org.id,
            seq=1,
            phase="plan",
            ciphertext=CHUNK,
            now=now,
        )
    return deployment_id


async def test_backup_during_a_burst__restores_elsewhere_consistent(
    app: FastAPI, org: Org, settings: ServerSettings, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    deployment_id = await _populate(app, org, settings)
    stop, written = threading.Event(), list[str]()
    burst = threading.Thread(target=_burst, args=(settings.resolved_database_url, stop, written))
    burst.start()
    try:
        while len(written) < 5:  # noqa: ASYNC110 - the burst is a thread
            await asyncio.sleep(0.01)
        manifest = await asyncio.to_thread(backups.backup, settings, tmp_path / "backup")
        after_backup = len(written)
        while len(written) < after_backup + 5:  # noqa: ASYNC110 - the burst is a thread
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        burst.join()
    target = _elsewhere(settings, tmp_path, request, "restored")
    (target.data_dir).mkdir()
    # The key is kept apart: the operator puts it into the new data dir.
    (target.data_dir / KEY_FILE_NAME).write_text((settings.data_dir / KEY_FILE_NAME).read_text())

    await asyncio.to_thread(backups.restore, target, tmp_path / "backup")

    source_rows = await _rows(settings.resolved_database_url)
    restored_rows = await _rows(target.resolved_database_url)
    burst_orgs = [row for row in restored_rows["orgs"] if row[0].startswith(_BURST_PREFIX)]
    # One moment: the burst's first k orgs, k between its count when the backup began and ended.
    assert [row[0] for row in burst_orgs] == written[: len(burst_orgs)]
    assert 5 <= len(burst_orgs) <= after_backup
    source_rows["orgs"] = [row for row in source_rows["orgs"] if row[0] not in written[len(burst_orgs) :]]
    assert source_rows == restored_rows
    assert manifest["schema_revision"] == migrate.head()
    assert not manifest["key_included"]
    assert not (tmp_path / "backup" / KEY_FILE_NAME).exists()
    assert b"bundle bytes" == (target.data_dir / "objects" / "bundles" / "one.tar.gz").read_bytes()
    restored = create_app(target)
    async with restored.router.lifespan_context(restored), api_client(restored, BOOTSTRAP_TOKEN) as client:
        response = await client.get(f"/orgs/{org.id}/runners")
        assert 200 == response.status_code, response.text
        assert {"agent1", "local1"} <= {runner["id"] for runner in response.json()["items"]}
        deployment = (await client.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()
        logs = (await client.get(f"/orgs/{org.id}/deployments/{deployment_id}/logs")).json()
    assert ["queued", "launching", "plan"] == [p["phase"] for p in deployment["phases"]]
    assert [base64.b64encode(CHUNK).decode()] == [item["ciphertext"] for item in logs["items"]]


async def test_include_key__restores_onto_a_bare_data_dir(
    app: FastAPI, org: Org, settings: ServerSettings, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await _populate(app, org, settings)
    await asyncio.to_thread(backups.backup, settings, tmp_path / "backup", include_key=True)
    target = _elsewhere(settings, tmp_path, request, "restored")

    await asyncio.to_thread(backups.restore, target, tmp_path / "backup")

    key_file = tmp_path / "backup" / KEY_FILE_NAME
    assert 0o600 == key_file.stat().st_mode & 0o777
    assert key_file.read_text() == (target.data_dir / KEY_FILE_NAME).read_text()
    assert json.loads((tmp_path / "backup" / "manifest.json").read_text())["key_included"]


async def test_restore__refuses_a_newer_schema_a_wrong_key_and_a_non_empty_target(
    app: FastAPI, org: Org, settings: ServerSettings, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await _populate(app, org, settings)
    source = tmp_path / "backup"
    await asyncio.to_thread(backups.backup, settings, source)
    manifest_path = source / "manifest.json"
    manifest = json.loads(manifest_path.read_text())

    # A key that does not open it.
    wrong = _elsewhere(settings, tmp_path, request, "wrong-key")
    wrong = wrong.model_copy(update={"encryption_key": SecretStr(base64.b64encode(b"k" * 32).decode())})
    with pytest.raises(
        backups.BackupError, match="the server key does not open this backup: PO_ENCRYPTION_KEY"
    ):
        await asyncio.to_thread(backups.restore, wrong, source)
    # No key at all.
    bare = _elsewhere(settings, tmp_path, request, "bare")
    with pytest.raises(
        backups.BackupError, match=r"the server key does not open this backup: .*--include-key"
    ):
        await asyncio.to_thread(backups.restore, bare, source)
    # A non-empty target: the source's own database and data dir.
    with pytest.raises(backups.BackupError, match="is not empty"):
        await asyncio.to_thread(backups.restore, settings, source)
    # A newer schema.
    manifest_path.write_text(json.dumps({**manifest, "schema_revision": "9999"}))
    with pytest.raises(
        backups.BackupError,
        match=f"the backup is of schema 9999, newer than this build's {migrate.head()}: restore it with",
    ):
        await asyncio.to_thread(backups.restore, bare, source)
    # A non-empty destination of a backup.
    with pytest.raises(backups.BackupError, match="is not an empty directory"):
        await asyncio.to_thread(backups.backup, settings, source)


def test_s3_object_store__objects_backed_up_and_restored_into_another_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With PO_OBJECT_STORE_URL s3://...: every object under the prefix is in the backup's objects/ and
    restored under the target's prefix; a bucket already holding objects is refused."""
    import boto3

    from orchestrator.blobs.s3 import S3BlobStore

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in MOTO_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    moto = emulator_or_skip(start_moto, tmp_path / "moto")
    try:
        client = boto3.client("s3", endpoint_url=moto.url)
        for bucket in ("source", "target"):
            client.create_bucket(Bucket=bucket)
        source = ServerSettings(
            data_dir=tmp_path / "data",
            encryption_key=SecretStr(base64.b64encode(b"s" * 32).decode()),
            object_store_url="s3://source/po/objects",
            object_store_endpoint=moto.url,
        )
        target = source.model_copy(
            update={"data_dir": tmp_path / "restored", "object_store_url": "s3://target/other"}
        )
        asyncio.run(_migrated(source))
        store = S3BlobStore("source", "po/objects", endpoint_url=moto.url)
        asyncio.run(store.put("bundles/a.tar.gz", b"a"))
        asyncio.run(store.put("logs/b/c.log", b"bc"))
        client.put_object(Bucket="source", Key="elsewhere/not-ours", Body=b"x")

        manifest = backups.backup(source, tmp_path / "backup")
        backups.restore(target, tmp_path / "backup")
        listed = client.list_objects_v2(Bucket="target")["Contents"]
        with pytest.raises(backups.BackupError, match="the object store s3://target/other is not empty"):
            backups.restore(target.model_copy(update={"data_dir": tmp_path / "again"}), tmp_path / "backup")
    finally:
        moto.stop()

    assert 2 == manifest["objects"]
    assert ["other/bundles/a.tar.gz", "other/logs/b/c.log"] == sorted(item["Key"] for item in listed)
    assert b"bc" == (tmp_path / "backup" / "objects" / "logs" / "b" / "c.log").read_bytes()


async def _migrated(settings: ServerSettings) -> None:
    settings.data_dir.mkdir(mode=0o700)
    engine = db.create_engine(settings.resolved_database_url)
    try:
        await migrate.upgrade(engine)
    finally:
        await db.dispose(engine)


async def test_backup_of_an_older_schema__restored_and_migrated_to_the_head(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A backup made by an older orchestrator (schema 0012 here) is restored, then migrated to the head."""
    from alembic import command

    key = base64.b64encode(b"o" * 32).decode()
    source = ServerSettings(
        data_dir=tmp_path / "data", database_url=database_url, encryption_key=SecretStr(key)
    )
    source.data_dir.mkdir(mode=0o700)
    engine = db.create_engine(database_url)
    try:
        # The SQLite fixture is a new file, the PostgreSQL one a migrated database: to 0012 either way.
        await migrate.upgrade(engine, "0012")
        async with engine.begin() as conn:
            if await migrate.current_revisions(conn) != {"0012"}:
                await conn.run_sync(lambda sync: command.downgrade(migrate.alembic_config(sync), "0012"))
            await conn.execute(
                sa.text("INSERT INTO orgs VALUES ('old', :u, 'active', 'x', :t, :t)"),
                {"u": uuid.uuid4().hex, "t": datetime.now(UTC)},
            )
            await conn.execute(_claimed_deployment())
    finally:
        await db.dispose(engine)
    manifest = await asyncio.to_thread(backups.backup, source, tmp_path / "backup")
    target = _elsewhere(source, tmp_path, request, "restored")

    await asyncio.to_thread(backups.restore, target, tmp_path / "backup")

    assert "0012" == manifest["schema_revision"]
    engine = db.create_engine(target.resolved_database_url)
    try:
        async with engine.connect() as conn:
            assert migrate.head_revisions() == await migrate.current_revisions(conn)
            assert ["old"] == list((await conn.execute(sa.text("SELECT id FROM orgs"))).scalars())
            # The backed-up server's dispatch claim is handed back: the restored server checks it at once.
            claims = await conn.execute(
                sa.text("SELECT dispatch_owner, dispatch_lease_until FROM deployments")
            )
            assert [(None, None)] == [tuple(row) for row in claims]
    finally:
        await db.dispose(engine)


def _claimed_deployment() -> sa.Insert:
    """An executing deployment of org ``old``, launched, claimed by a replica of the backed-up server."""
    from orchestrator.store.schema import deployments

    now = datetime.now(UTC)
    return deployments.insert().values(
        id=uuid.uuid4(),
        org_id="old",
        project_id="p",
        env_id="e",
        env_uuid=uuid.uuid4(),
        runner_id="r",
        mode="deploy",
        plan_only=False,
        status="executing",
        status_message="",
        manifest={},
        tf="",
        graph=[],
        bundle_key="b",
        runner_log_level="info",
        request_digest="0" * 64,
        created_by="token-1",
        created_at=now,
        updated_at=now,
        metrics={},
        dispatch_state="launched",
        dispatch_owner="old-replica",
        dispatch_lease_until=now + timedelta(minutes=1),
        dispatch_attempts=1,
        timeout_at=now + timedelta(hours=1),
    )


def test_backup__no_database_at_the_settings_and_a_schema_before_key_checks(tmp_path: Path) -> None:
    """Pointed at no database: said so, nothing made. A database at 0005 (before key check values): the
    manifest carries the configured key's check value."""
    from orchestrator.secretbox import key_check_value

    key = b"f" * 32
    settings = ServerSettings(
        data_dir=tmp_path / "data", encryption_key=SecretStr(base64.b64encode(key).decode())
    )
    with pytest.raises(backups.BackupError, match=r"no SQLite database at .*orchestrator\.db: run it with"):
        backups.backup(settings, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    settings.data_dir.mkdir(mode=0o700)

    async def to_0005() -> None:
        engine = db.create_engine(settings.resolved_database_url)
        try:
            await migrate.upgrade(engine, "0005")
        finally:
            await db.dispose(engine)

    asyncio.run(to_0005())

    manifest = backups.backup(settings, tmp_path / "backup")

    assert ("0005", key_check_value(key)) == (manifest["schema_revision"], manifest["key_check"])


def test_pg_tools__found_in_po_pg_bin_or_named_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(backups.PG_BIN_ENV, str(tmp_path))
    with pytest.raises(backups.BackupError, match=f"PO_PG_BIN={tmp_path} holds no pg_dump"):
        backups.find_pg_tool("pg_dump")
    (tmp_path / "pg_dump").write_text("#!/bin/sh\n")

    assert str(tmp_path / "pg_dump") == backups.find_pg_tool("pg_dump")
