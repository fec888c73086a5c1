"""Retention of deployment objects: bundles and logs deleted PO_OBJECT_RETENTION_DAYS after the deployment
finished and once its environment is deleted, on a real object store (files, and S3 on moto); executing
deployments keep theirs; the logs API then answers 410 naming the retention. Encrypted outputs are answered
PO_OUTPUTS_RETENTION_SECONDS after the deployment finished, then 404 (upstream's message), and deleted."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pydantic
import pytest
import time_machine
from fastapi import FastAPI

from orchestrator.dispatch.retention import RetentionWorker
from orchestrator.domain.deployments import Status
from orchestrator.settings import ServerSettings
from orchestrator.store import deployments as deployment_store
from tests.support.deployments import insert_deployment
from tests.support.emulators import MOTO_CREDENTIALS, Emulator, emulator_or_skip, start_moto
from tests.support.orgs import Org

DAY = timedelta(days=1)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = emulator_or_skip(start_moto, tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3"])
def settings(
    settings: ServerSettings, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> ServerSettings:
    """The conftest settings with a one-day retention, on the filesystem store or a fresh moto bucket."""
    update: dict[str, Any] = {"object_retention_days": 1.0}
    if request.param == "s3":
        moto: Emulator = request.getfixturevalue("moto")
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in MOTO_CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        bucket = f"retention-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=moto.url).create_bucket(Bucket=bucket)
        update |= {"object_store_url": f"s3://{bucket}/po", "object_store_endpoint": moto.url}
    return settings.model_copy(update=update)


async def _env(org: Org, env_id: str) -> dict[str, Any]:
    if env_id == "dev":
        for path, body in [("/env-types", {"id": "development"}), ("/projects", {"id": "shop"})]:
            response = await org.admin.post(f"/orgs/{org.id}{path}", json=body)
            assert 201 == response.status_code, response.text
    created = await org.admin.post(
        f"/orgs/{org.id}/projects/shop/envs", json={"id": env_id, "env_type_id": "development"}
    )
    assert 201 == created.status_code, created.text
    env: dict[str, Any] = created.json()
    return env


def _keys(org_id: str, deployment_id: str) -> list[str]:
    return [f"bundles/{org_id}/{deployment_id}.tar.gz", f"logs/{org_id}/{deployment_id}"]


async def _present(app: FastAPI, org_id: str, deployment_id: str) -> list[bool]:
    return [await app.state.services.blobs.get(k) is not None for k in _keys(org_id, deployment_id)]


async def _insert(
    app: FastAPI, org: Org, env: dict[str, Any], *, at: datetime, status: str = "succeeded"
) -> str:
    with time_machine.travel(at, tick=True):
        deployment_id = await insert_deployment(app, org.id, env, status=status)
    if status == "executing":
        # A runner may have uploaded logs already: they are kept as long as it executes.
        key = f"logs/{org.id}/{deployment_id}"
        await app.state.services.blobs.put(key, b"partial")
        async with app.state.services.engine.begin() as conn:
            await deployment_store.record_logs(conn, uuid.UUID(deployment_id), key=key, size=7, now=at)
    return deployment_id


def _ids(deleted: list[Any]) -> list[str]:
    return sorted(str(d.deployment_id) for d in deleted)


async def test_retention__old_final_objects_deleted_executing_and_recent_kept(org: Org, app: FastAPI) -> None:
    worker: RetentionWorker = app.state.retention
    now = datetime.now(UTC)
    env, other = await _env(org, "dev"), await _env(org, "stage")
    old = await _insert(app, org, env, at=now - 3 * DAY)
    executing = await _insert(app, org, other, at=now - 3 * DAY, status="executing")
    recent = await _insert(app, org, env, at=now - DAY / 2)

    deleted = await worker.run_once()
    present = {d: await _present(app, org.id, d) for d in (old, executing, recent)}
    logs = await org.admin.get(f"/orgs/{org.id}/deployments/{old}/actions/get-logs")
    row = await org.admin.get(f"/orgs/{org.id}/deployments/{old}")
    again = await worker.run_once()
    with time_machine.travel(now + DAY, tick=True):
        later = await worker.run_once()

    assert [old] == _ids(deleted)
    assert set(_keys(org.id, old)) == set(deleted[0].keys)
    assert {old: [False, False], executing: [True, True], recent: [True, True]} == present
    assert 410 == logs.status_code, logs.text
    assert "API-410" == logs.json()["error"]
    message = logs.json()["message"]
    assert f"the logs of deployment '{old}' were removed on " in message
    assert "after the retention period" in message and "kept 1 days" in message
    assert 200 == row.status_code
    assert row.json()["has_logs"] is False
    assert [] == again
    # `recent` is dev's newest successful change: a destroy of dev needs its code, however old.
    assert [] == _ids(later)
    assert [True, True] == await _present(app, org.id, recent)
    assert [True, True] == await _present(app, org.id, executing)
    assert 200 == (await org.admin.get(f"/orgs/{org.id}/deployments/{executing}")).status_code


async def test_retention__an_executing_deployment_keeps_its_objects_until_it_finished_long_enough(
    org: Org, app: FastAPI
) -> None:
    worker: RetentionWorker = app.state.retention
    now = datetime.now(UTC)
    executing = await _insert(app, org, await _env(org, "dev"), at=now - 10 * DAY, status="executing")

    with time_machine.travel(now + 10 * DAY, tick=True):
        while_executing = await worker.run_once()
    async with app.state.services.engine.begin() as conn:
        await deployment_store.complete(
            conn, uuid.UUID(executing), status=Status.FAILED, message="timeout", now=datetime.now(UTC)
        )
    just_finished = await worker.run_once()
    with time_machine.travel(now + DAY + timedelta(minutes=1), tick=True):
        expired = await worker.run_once()

    assert [] == while_executing
    assert [] == just_finished
    assert [executing] == _ids(expired)
    assert [False, False] == await _present(app, org.id, executing)


async def test_retention__a_deleted_environment_loses_its_deployments_objects_at_once(
    org: Org, app: FastAPI
) -> None:
    worker: RetentionWorker = app.state.retention
    now = datetime.now(UTC)
    env, kept_env = await _env(org, "dev"), await _env(org, "stage")
    gone = [await _insert(app, org, env, at=now - timedelta(minutes=m)) for m in (5, 1)]
    kept = await _insert(app, org, kept_env, at=now - timedelta(minutes=1))

    deleted_env = await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev", params={"force": "true"})
    deleted = await worker.run_once()
    logs = await org.admin.get(f"/orgs/{org.id}/deployments/{gone[0]}/actions/get-logs")

    assert 204 == deleted_env.status_code, deleted_env.text
    assert sorted(gone) == _ids(deleted)
    for deployment_id in gone:
        assert [False, False] == await _present(app, org.id, deployment_id)
        assert 200 == (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).status_code
    assert [True, True] == await _present(app, org.id, kept)
    assert 410 == logs.status_code
    assert "removed" in logs.json()["message"]


async def test_retention__missing_objects_are_no_error_and_replicas_share_the_work(
    org: Org, app: FastAPI
) -> None:
    services = app.state.services
    now = datetime.now(UTC)
    env = await _env(org, "dev")
    newest, *old = [await _insert(app, org, env, at=now - 2 * DAY - timedelta(minutes=m)) for m in range(8)]
    await services.blobs.delete(_keys(org.id, old[0])[0])
    await services.blobs.delete(_keys(org.id, old[1])[1])
    replicas = [
        RetentionWorker(
            engine=services.engine, blobs=services.blobs, retention=DAY, interval_seconds=3600, batch_size=2
        )
        for _ in range(3)
    ]

    rounds = await asyncio.gather(*(r.run_once() for r in replicas))

    ids = [str(d.deployment_id) for found in rounds for d in found]
    assert sorted(old) == sorted(ids)  # every one deleted, none twice
    for deployment_id in old:
        assert [False, False] == await _present(app, org.id, deployment_id)
    assert [True, True] == await _present(app, org.id, newest)  # the environment's current code


async def test_retention__the_loop_deletes_due_objects_until_stopped(org: Org, app: FastAPI) -> None:
    services = app.state.services
    deployment_id = await _insert(
        app, org, await _env(org, "dev"), at=datetime.now(UTC) - DAY, status="failed"
    )
    worker = RetentionWorker(
        engine=services.engine, blobs=services.blobs, retention=timedelta(hours=1), interval_seconds=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    for _ in range(400):
        if [False, False] == await _present(app, org.id, deployment_id):
            break
        await asyncio.sleep(0.05)
    stop.set()
    await task

    assert [False, False] == await _present(app, org.id, deployment_id)


async def test_retention__the_code_a_destroy_needs_is_kept_and_the_environment_deletes(
    org: Org, app: FastAPI
) -> None:
    """The newest successful change of an existing environment keeps its objects past the retention (the
    destroy that deleting the environment runs copies its bundle); older ones, failed ones and plan-only
    ones go."""
    worker: RetentionWorker = app.state.retention
    now = datetime.now(UTC)
    env = await _env(org, "dev")
    superseded = await _insert(app, org, env, at=now - 9 * DAY)
    current = await _insert(app, org, env, at=now - 8 * DAY)
    failed = await _insert(app, org, env, at=now - 7 * DAY, status="failed")

    deleted = await worker.run_once()
    deleting = await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev")

    assert sorted([superseded, failed]) == _ids(deleted)
    assert [True, True] == await _present(app, org.id, current)
    # Not refused with "the code ... is no longer stored": the destroy deployment was created.
    assert deleting.status_code in (202, 204), deleting.text
    async with app.state.services.engine.connect() as conn:
        destroy = await deployment_store.last_in_env(conn, uuid.UUID(env["uuid"]))
    assert destroy is not None and "destroy" == destroy.mode


async def test_retention__logs_of_a_deployment_without_logs_still_404(org: Org, app: FastAPI) -> None:
    executing = await insert_deployment(app, org.id, await _env(org, "dev"), status="executing")

    logs = await org.admin.get(f"/orgs/{org.id}/deployments/{executing}/actions/get-logs")

    assert 404 == logs.status_code
    assert f"deployment '{executing}' has no logs" == logs.json()["message"]


def test_retention__settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    default = ServerSettings()
    monkeypatch.setenv("PO_OBJECT_RETENTION_DAYS", "7.5")
    monkeypatch.setenv("PO_CLEANUP_INTERVAL_SECONDS", "60")
    configured = ServerSettings()
    monkeypatch.setenv("PO_OBJECT_RETENTION_DAYS", "0")

    assert (30.0, 3600.0) == (default.object_retention_days, default.cleanup_interval_seconds)
    assert (7.5, 60.0) == (configured.object_retention_days, configured.cleanup_interval_seconds)
    with pytest.raises(pydantic.ValidationError, match="object_retention_days"):
        ServerSettings()


async def test_outputs__answered_for_their_retention_then_404_and_deleted(org: Org, app: FastAPI) -> None:
    """Upstream keeps outputs 5 minutes (DEPLOYMENTS_COMPLETED_BEFORE) and then answers 404 "deployment
    outputs are no longer available"; so do we (PO_OUTPUTS_RETENTION_SECONDS, 300 by default), whether or
    not the worker has deleted the ciphertext yet."""
    worker: RetentionWorker = app.state.retention
    now = datetime.now(UTC)
    env = await _env(org, "dev")
    old = await _insert(app, org, env, at=now - timedelta(seconds=301))
    recent = await _insert(app, org, env, at=now - timedelta(seconds=60))
    executing = await _insert(app, org, await _env(org, "stage"), at=now, status="executing")

    def outputs(deployment_id: str) -> Any:
        return org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}/encrypted-outputs")

    async def stored(deployment_id: str) -> Any:
        async with app.state.services.engine.connect() as conn:
            found = await deployment_store.get(conn, org.id, uuid.UUID(deployment_id))
        assert found is not None
        return found.outputs

    before = [await outputs(d) for d in (old, recent, executing)]
    rows_before = [(await org.admin.get(f"/orgs/{org.id}/deployments/{d}")).json() for d in (old, recent)]
    kept_before = await stored(old)
    await worker.run_once()
    after = [await outputs(d) for d in (old, recent)]
    row = (await org.admin.get(f"/orgs/{org.id}/deployments/{old}")).json()

    assert [404, 200, 404] == [r.status_code for r in before]
    assert "deployment outputs are no longer available" == before[0].json()["message"]
    assert before[1].json()["raw"]
    assert (
        f"deployment '{executing}' has no outputs yet: it is still executing" == before[2].json()["message"]
    )
    # The API says so at once; the worker deletes the ciphertext on its next round.
    assert [False, True] == [row["has_outputs"] for row in rows_before]
    assert kept_before is not None
    assert None is await stored(old)  # the ciphertext is gone from the database
    assert await stored(recent) is not None
    assert [404, 200] == [r.status_code for r in after]
    assert "deployment outputs are no longer available" == after[0].json()["message"]
    assert row["has_outputs"] is False


async def test_outputs__the_loop_comes_as_often_as_outputs_fall_due(org: Org, app: FastAPI) -> None:
    services = app.state.services
    old = await _insert(app, org, await _env(org, "dev"), at=datetime.now(UTC) - timedelta(seconds=2))
    worker = RetentionWorker(
        engine=services.engine,
        blobs=services.blobs,
        retention=DAY,
        interval_seconds=3600,
        outputs_retention=timedelta(seconds=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    for _ in range(400):
        async with services.engine.connect() as conn:
            found = await deployment_store.get(conn, org.id, uuid.UUID(old))
        if found is not None and found.outputs is None:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await task

    assert found is not None and found.outputs is None
