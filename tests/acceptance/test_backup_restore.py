"""Backup and restore as an operator runs them, on both databases: ``orchestrator backup`` while
deployments run, the server stopped, ``orchestrator restore`` into a fresh data dir and an empty database
(the server key kept apart, copied in by hand), a server started on it: redeploying every environment plans
0 to add (the states came back with the database)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from orchestrator.store import db
from tests.support.outages import ServerProcess
from tests.support.postgres import PostgresServer
from tests.support.stack import Stack, build_stack, demo_manifest

pytestmark = pytest.mark.slow

ENVS = ("dev", "prod")


def _orchestrator(*args: str, data_dir: Path, database_url: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PO_")}
    environ.update(PO_DATA_DIR=str(data_dir), PO_DATABASE_URL=database_url)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.server", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _burst(stack: Stack, env_id: str, stop: threading.Event, started: list[str], errors: list[str]) -> None:
    """Deploy ``env_id`` again and again, each as soon as the one before ended, until ``stop``; every
    one succeeds (else its status lands in ``errors``). One such loop per environment: the moments when
    neither environment has a deployment in flight are rare, so a backup catches one."""
    with httpx.Client(base_url=stack.client.base_url, headers=stack.client.headers, timeout=60) as client:
        burst_stack = Stack(client=client, org=stack.org, tf_config=stack.tf_config)
        while not stop.is_set():
            try:
                deployment_id = _start_deploy(burst_stack, env_id)
                started.append(deployment_id)
                ended = burst_stack.wait(deployment_id)
            except (AssertionError, httpx.HTTPError) as exc:  # the test's thread reports it
                errors.append(f"{env_id}: {exc!r}")
                return
            if "succeeded" != ended["status"]:
                errors.append(f"{deployment_id}: {ended['status']} {ended['status_message']}")


def _statuses(database_url: str, deployment_ids: list[str]) -> list[str | None]:
    """The deployments' statuses in a database (None: not in it; "pending": executing, not launched yet)."""

    async def read() -> list[str | None]:
        engine = db.create_engine(database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(sa.text("SELECT id, status, dispatch_state FROM deployments"))
                found = {
                    uuid.UUID(str(row[0])): "pending"
                    if (row[1], row[2]) == ("executing", "pending")
                    else str(row[1])
                    for row in rows
                }
        finally:
            await db.dispose(engine)
        return [found.get(uuid.UUID(deployment_id)) for deployment_id in deployment_ids]

    return asyncio.run(read())


def _empty_database_like(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A new, empty database of the same kind as ``database_url``."""
    if database_url.startswith("postgresql"):
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"r{os.getpid()}_{uuid.uuid4().hex[:8]}"
        server.create_database(name)
        return server.url(name)
    return f"sqlite+aiosqlite:///{tmp_path / 'restored' / 'data' / 'orchestrator.db'}"


def _start_deploy(stack: Stack, env_id: str) -> str:
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": env_id, "mode": "deploy", "manifest": demo_manifest()},
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


def test_backup_during_deploys__restored_server_deploys_every_env_with_nothing_to_add(
    database_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data_dir = tmp_path / "original" / "data"
    server = ServerProcess(database_url, data_dir)
    server.start()
    try:
        stack = build_stack(server.url, tmp_path)
        assert (
            201
            == stack.client.post(
                f"/orgs/{stack.org}/projects/shop/envs", json={"id": "prod", "env_type_id": "development"}
            ).status_code
        )
        for env_id in ENVS:
            first = stack.wait(_start_deploy(stack, env_id))
            assert "succeeded" == first["status"], first["status_message"]
            assert first["metrics"]["num_tf_resources_added"] > 0
        # A burst: both environments deploy again and again while the backup is made.
        stop, started, errors = threading.Event(), list[str](), list[str]()
        bursts = [
            threading.Thread(target=_burst, args=(stack, env_id, stop, started, errors)) for env_id in ENVS
        ]
        for burst in bursts:
            burst.start()
        try:
            # The backup starts once the burst's second round is under way (created, not yet finished).
            while len(started) < 2 * len(ENVS) and all(burst.is_alive() for burst in bursts):
                time.sleep(0.05)
            backup = _orchestrator(
                "backup", str(tmp_path / "backup"), data_dir=data_dir, database_url=database_url
            )
        finally:
            stop.set()
            for burst in bursts:
                burst.join()
        assert [] == errors
        assert 0 == backup.returncode, backup.stderr
        assert "server key not included" in backup.stderr
        stack.client.close()
    finally:
        server.stop()

    restored_dir = tmp_path / "restored" / "data"
    restored_url = _empty_database_like(database_url, tmp_path, request)
    restored_dir.mkdir(parents=True, mode=0o700)
    shutil.copy2(data_dir / "server.key", restored_dir / "server.key")
    restore = _orchestrator(
        "restore", str(tmp_path / "backup"), data_dir=restored_dir, database_url=restored_url
    )
    assert 0 == restore.returncode, restore.stderr
    # The snapshot caught the burst mid-way: a deployment of it had not finished.
    in_backup = _statuses(restored_url, started)
    assert set(in_backup) - {"succeeded", None}, in_backup
    # At the backed-up server's address (PO_PUBLIC_URL), as the docs say: a deployment created before the
    # backup reaches its state through the URL compiled into its bundle.
    again = ServerProcess(restored_url, restored_dir).at_port(server.port)
    again.start()
    try:
        client = httpx.Client(base_url=again.url, headers=stack.client.headers, timeout=60)
        restored_stack = Stack(client=client, org=stack.org, tf_config=stack.tf_config)
        # The deployments the snapshot caught executing have no runner any more: the restored server
        # ends them (failed, the runner exited without reporting results; restore handed back the
        # backed-up server's dispatch claims). One it caught still pending is launched and runs.
        for deployment_id, status in zip(started, in_backup, strict=True):
            if status in (None, "succeeded"):
                continue
            ended = restored_stack.wait(deployment_id, timeout=120)
            expected = "succeeded" if status == "pending" else "failed"
            assert expected == ended["status"], (status, ended)
        for env_id in ENVS:
            redeployed = restored_stack.wait(_start_deploy(restored_stack, env_id))
            assert "succeeded" == redeployed["status"], redeployed["status_message"]
            assert 0 == redeployed["metrics"]["num_tf_resources_added"], redeployed["metrics"]
        client.close()
    finally:
        again.stop()
