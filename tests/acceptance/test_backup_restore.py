"""Backup and restore as an operator runs them: ``orchestrator backup`` while deployments run, the server
stopped, ``orchestrator restore`` into a fresh data dir (the server key kept apart, copied in by hand), a
server started on it: redeploying every environment plans 0 to add (the states came back with the
database)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.outages import ServerProcess
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


def _burst(stack: Stack, stop: threading.Event, started: list[str]) -> None:
    """Deploy every environment at once, wait for them, again, until ``stop``; every one succeeds."""
    with httpx.Client(base_url=stack.client.base_url, headers=stack.client.headers, timeout=60) as client:
        burst_stack = Stack(client=client, org=stack.org, tf_config=stack.tf_config)
        while not stop.is_set():
            round_ids = [_start_deploy(burst_stack, env_id) for env_id in ENVS]
            started.extend(round_ids)
            for deployment_id in round_ids:
                assert "succeeded" == burst_stack.wait(deployment_id)["status"]


def _statuses(database: Path, deployment_ids: list[str]) -> list[str | None]:
    """The deployments' statuses in a backup's SQLite copy (None: not in it)."""
    with contextlib.closing(sqlite3.connect(database)) as conn:
        found = []
        for deployment_id in deployment_ids:
            row = conn.execute("SELECT status FROM deployments WHERE id = ?", (uuid.UUID(deployment_id).hex,))
            one = row.fetchone()
            found.append(None if one is None else str(one[0]))
        return found


def _start_deploy(stack: Stack, env_id: str) -> str:
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": env_id, "mode": "deploy", "manifest": demo_manifest()},
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


def test_backup_during_deploys__restored_server_deploys_every_env_with_nothing_to_add(tmp_path: Path) -> None:
    data_dir = tmp_path / "original" / "data"
    database_url = f"sqlite+aiosqlite:///{data_dir / 'orchestrator.db'}"
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
        stop, started = threading.Event(), list[str]()
        burst = threading.Thread(target=_burst, args=(stack, stop, started))
        burst.start()
        try:
            backup = _orchestrator(
                "backup", str(tmp_path / "backup"), data_dir=data_dir, database_url=database_url
            )
        finally:
            stop.set()
            burst.join()
        assert 0 == backup.returncode, backup.stderr
        assert "server key not included" in backup.stderr
        # The snapshot caught the burst mid-way: a deployment of it had not finished.
        in_backup = _statuses(tmp_path / "backup" / "database.sqlite3", started)
        assert set(in_backup) - {"succeeded", None}, in_backup
        stack.client.close()
    finally:
        server.stop()

    restored_dir = tmp_path / "restored" / "data"
    restored_url = f"sqlite+aiosqlite:///{restored_dir / 'orchestrator.db'}"
    restored_dir.mkdir(parents=True, mode=0o700)
    shutil.copy2(data_dir / "server.key", restored_dir / "server.key")
    restore = _orchestrator(
        "restore", str(tmp_path / "backup"), data_dir=restored_dir, database_url=restored_url
    )
    assert 0 == restore.returncode, restore.stderr
    again = ServerProcess(restored_url, restored_dir)
    again.start()
    try:
        client = httpx.Client(base_url=again.url, headers=stack.client.headers, timeout=60)
        restored_stack = Stack(client=client, org=stack.org, tf_config=stack.tf_config)
        # The deployments the snapshot caught executing have no runner any more: the restored server
        # ends them (failed, the runner exited without reporting results; restore handed back the
        # backed-up server's dispatch claims), before their environments deploy again.
        unfinished = [
            d for d, status in zip(started, in_backup, strict=True) if status not in (None, "succeeded")
        ]
        for deployment_id in unfinished:
            ended = restored_stack.wait(deployment_id, timeout=30)
            assert "failed" == ended["status"], ended
        for env_id in ENVS:
            redeployed = restored_stack.wait(_start_deploy(restored_stack, env_id))
            assert "succeeded" == redeployed["status"], redeployed["status_message"]
            assert 0 == redeployed["metrics"]["num_tf_resources_added"], redeployed["metrics"]
        client.close()
    finally:
        again.stop()
