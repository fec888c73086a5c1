"""A fault while launching or checking one deployment stays with that deployment: it fails with a message
naming the cause, or is retried, or ends by its timeout; the other deployments of the round go on.

The dispatcher is driven round by round (``run_once``) against the real database, with launchers that are
real classes behind its ``launcher_for`` seam. Time passing is simulated by moving a deployment's
``timeout_at``/``next_check_at`` in the database, never by sleeping.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi import FastAPI
from sqlalchemy import event as sa_event
from structlog.testing import capture_logs

from orchestrator.dispatch.dispatcher import Dispatcher, DispatchSettings
from orchestrator.domain.deployments import TIMEOUT_MESSAGE, before_start_message
from orchestrator.errors import DatabaseUnavailableError
from orchestrator.launchers.base import Launcher, RunState, RunStatus
from orchestrator.launchers.local import LocalLauncher
from orchestrator.protocol.launch import RunSpec
from orchestrator.secretbox import SecretBox
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import deployments as store
from orchestrator.store.schema import deployments, runners
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org
from tests.support.readonly import read_only
from tests.support.tools import tools_required

DEMO_RUNNER = yaml.safe_load(
    (Path(__file__).parent.parent.parent / "examples" / "demo" / "runner.yaml").read_text()
)


@pytest.fixture
async def app(settings: ServerSettings) -> AsyncIterator[FastAPI]:
    """The app without its own dispatcher: each test drives one."""
    application = create_app(settings, run_dispatcher=False)
    async with application.router.lifespan_context(application):
        yield application


class RecordingLauncher:
    """Launches nothing; records what it was asked. ``fail_launch``/``fail_status``: raise that instead."""

    def __init__(
        self, *, fail_launch: list[Exception] | None = None, fail_status: Exception | None = None
    ) -> None:
        self.launched: list[str] = []
        self.status_calls = 0
        self.cancelled: list[str] = []
        self.fail_launch = list(fail_launch or [])
        self.fail_status = fail_status

    async def launch(self, spec: RunSpec) -> str:
        if self.fail_launch:
            raise self.fail_launch.pop(0)
        self.launched.append(spec.deployment_id)
        return f"fake:{spec.deployment_id}"

    async def status(self, handle: str) -> RunStatus:
        self.status_calls += 1
        if self.fail_status is not None:
            raise self.fail_status
        return RunStatus(state=RunState.RUNNING)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        self.cancelled.append(handle)


def dispatcher(app: FastAPI, launcher: Launcher) -> Dispatcher:
    services = app.state.services
    return Dispatcher(
        engine=services.engine,
        box=services.box,
        blobs=services.blobs,
        token_key=services.token_key,
        gateway_url="http://po.test",
        launcher_for=lambda _target: launcher,
        on_final=lambda _id: None,
        settings=DispatchSettings(check_interval_seconds=5.0),
    )


async def make_runner(org: Org, runner_id: str, *, secret: str = "s3cr3t-value") -> None:
    config = {**DEMO_RUNNER["runner_configuration"]}
    config["job"] = {**config["job"], "secrets": {"API_TOKEN": secret}}
    body = {"id": runner_id, **DEMO_RUNNER, "runner_configuration": config}
    response = await org.platform.post(f"/orgs/{org.id}/runners", json=body)
    assert 201 == response.status_code, response.text


async def make_pending(app: FastAPI, org: Org, runner_id: str, env_id: str) -> str:
    """An executing deployment on ``runner_id``, never launched, as the API creates them."""
    base = f"/orgs/{org.id}"
    if (await org.admin.get(f"{base}/projects/shop")).status_code == 404:
        await org.admin.post(f"{base}/env-types", json={"id": "development"})
        await org.admin.post(f"{base}/projects", json={"id": "shop"})
    env = (
        await org.admin.post(f"{base}/projects/shop/envs", json={"id": env_id, "env_type_id": "development"})
    ).json()
    deployment_id = await insert_deployment(app, org.id, env, status="executing", runner_id=runner_id)
    await set_row(
        app,
        deployment_id,
        dispatch_state="pending",
        next_check_at=None,
        launched_at=None,
        dispatch_attempts=0,
    )
    return deployment_id


async def set_row(app: FastAPI, deployment_id: str, **values: Any) -> None:
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            deployments.update().where(deployments.c.id == uuid.UUID(deployment_id)).values(**values)
        )


async def row(app: FastAPI, deployment_id: str) -> Any:
    async with app.state.services.engine.connect() as conn:
        return (
            await conn.execute(deployments.select().where(deployments.c.id == uuid.UUID(deployment_id)))
        ).one()


async def seal_under_another_key(app: FastAPI, org_id: str, runner_id: str) -> None:
    """The runner's secrets as a database restored next to another server key would hold them."""
    sealed = SecretBox(os.urandom(32)).seal(
        b'{"job.secrets.API_TOKEN": "x"}', context=f"runner:{org_id}/{runner_id}"
    )
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            runners.update()
            .where(runners.c.org_id == org_id, runners.c.id == runner_id)
            .values(config_secret=sealed)
        )


async def test_launch__secret_sealed_under_another_key_fails_that_deployment_only(
    app: FastAPI, org: Org
) -> None:
    await make_runner(org, "broken")
    await make_runner(org, "fine")
    await seal_under_another_key(app, org.id, "broken")
    broken = await make_pending(app, org, "broken", "dev")
    fine = await make_pending(app, org, "fine", "prod")
    launcher = RecordingLauncher()

    await dispatcher(app, launcher).run_once()
    failed, launched = await row(app, broken), await row(app, fine)

    assert "failed" == failed.status
    assert "the secrets of runner 'broken' do not open with the server key" in failed.status_message
    assert "RUNNER_UNAVAILABLE" == failed.error["error"]
    assert [fine] == launcher.launched
    assert ("executing", "launched") == (launched.status, launched.dispatch_state)


async def test_launch__failed_deployment_releases_its_environment(app: FastAPI, org: Org) -> None:
    await make_runner(org, "broken")
    await seal_under_another_key(app, org.id, "broken")
    await make_pending(app, org, "broken", "dev")

    await dispatcher(app, RecordingLauncher()).run_once()
    deleted = await org.admin.delete(f"/orgs/{org.id}/projects/shop/envs/dev")

    assert deleted.status_code in (202, 204), deleted.text


async def test_launch__unexpected_error_fails_with_an_error_id_the_log_has(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    bad = await make_pending(app, org, "vm1", "dev")
    good = await make_pending(app, org, "vm1", "prod")
    # The first launch of the round raises; the second goes through.
    launcher = RecordingLauncher(fail_launch=[RuntimeError("boom s3cr3t-value")])

    with capture_logs() as logs:
        await dispatcher(app, launcher).run_once()
    rows = {d: await row(app, d) for d in (bad, good)}
    failed = next(r for r in rows.values() if r.status == "failed")
    error_ids = [e["error_id"] for e in logs if e.get("event") == "launch failed"]

    assert 1 == len(launcher.launched)
    assert "LAUNCH_FAILED" == failed.error["error"]
    assert failed.status_message.startswith("the runner could not be launched: unexpected RuntimeError")
    assert "s3cr3t-value" not in failed.status_message
    assert 1 == len(error_ids)
    assert f"error id {error_ids[0]}" in failed.status_message


async def test_launch__transient_error_is_retried_after_a_backoff(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    pending = await make_pending(app, org, "vm1", "dev")
    launcher = RecordingLauncher(fail_launch=[DatabaseUnavailableError("database unavailable: x")])
    dispatch = dispatcher(app, launcher)

    await dispatch.run_once()
    held = await row(app, pending)
    await set_row(app, pending, dispatch_lease_until=None)  # the backoff has passed
    await dispatch.run_once()
    launched = await row(app, pending)

    assert ("executing", "pending", 1) == (held.status, held.dispatch_state, held.dispatch_attempts)
    assert held.dispatch_lease_until > datetime.now(UTC)
    assert ("executing", "launched") == (launched.status, launched.dispatch_state)
    assert [pending] == launcher.launched


async def test_launch__read_only_runs_dir_fails_naming_the_directory(
    app: FastAPI, org: Org, tmp_path: Path
) -> None:
    await make_runner(org, "vm1")
    pending = await make_pending(app, org, "vm1", "dev")
    runs_dir = tmp_path / "runs"

    with read_only(runs_dir, required=tools_required()):
        await dispatcher(app, LocalLauncher(runs_dir, environ={})).run_once()
    failed = await row(app, pending)

    assert "failed" == failed.status
    assert "LAUNCH_FAILED" == failed.error["error"]
    assert failed.status_message.startswith("the runner could not be launched: ")
    assert str(runs_dir) in failed.status_message


async def test_check__failing_status_calls_still_end_by_the_timeout(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    deployment_id = await make_pending(app, org, "vm1", "dev")
    launcher = RecordingLauncher(fail_status=RuntimeError("the cluster API is down"))
    dispatch = dispatcher(app, launcher)
    await set_row(app, deployment_id, timeout_at=datetime.now(UTC) + timedelta(hours=1))
    await dispatch.run_once()  # launched

    await set_row(app, deployment_id, next_check_at=datetime.now(UTC))
    await dispatch.run_once()  # status raises
    after_first = await row(app, deployment_id)
    await set_row(app, deployment_id, next_check_at=datetime.now(UTC))
    await dispatch.run_once()  # raises again
    await set_row(app, deployment_id, timeout_at=datetime.now(UTC))  # the hour has passed
    await dispatch.run_once()
    final = await row(app, deployment_id)

    assert 2 == launcher.status_calls
    assert ("executing", None) == (after_first.status, after_first.dispatch_owner)
    assert "failed" == final.status
    assert TIMEOUT_MESSAGE == final.status_message
    assert [f"fake:{deployment_id}"] == launcher.cancelled


async def test_check__timeout_applies_when_the_runner_cannot_be_looked_at(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    deployment_id = await make_pending(app, org, "vm1", "dev")
    dispatch = dispatcher(app, RecordingLauncher())
    await dispatch.run_once()  # launched
    await seal_under_another_key(app, org.id, "vm1")

    await set_row(app, deployment_id, next_check_at=datetime.now(UTC), timeout_at=datetime.now(UTC))
    await dispatch.run_once()
    final = await row(app, deployment_id)

    assert "failed" == final.status
    assert TIMEOUT_MESSAGE == final.status_message


async def test_check__pending_deployment_past_its_timeout_fails(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    deployment_id = await make_pending(app, org, "vm1", "dev")
    await set_row(app, deployment_id, timeout_at=datetime.now(UTC) - timedelta(seconds=1))
    launcher = RecordingLauncher()

    await dispatcher(app, launcher).run_once()
    final = await row(app, deployment_id)

    assert [] == launcher.launched
    # Upstream's message, and that no runner was ever started (issue 22).
    assert ("failed", before_start_message(TIMEOUT_MESSAGE, "queued")) == (final.status, final.status_message)


async def test_round__one_failing_check_does_not_stop_the_others(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    ids = [await make_pending(app, org, "vm1", env) for env in ("dev", "prod")]
    launcher = RecordingLauncher(fail_status=RuntimeError("boom"))
    dispatch = dispatcher(app, launcher)
    await dispatch.run_once()  # both launched
    now = datetime.now(UTC)
    await set_row(app, ids[0], next_check_at=now)
    await set_row(app, ids[1], next_check_at=now, timeout_at=now)

    await dispatch.run_once()
    rows = [await row(app, d) for d in ids]

    assert ["executing", "failed"] == [r.status for r in rows]
    assert TIMEOUT_MESSAGE == rows[1].status_message
    assert rows[0].dispatch_owner is None


async def test_round__runs_found_running_are_released_together_to_their_next_check(
    app: FastAPI, org: Org
) -> None:
    """A check round's runs still running end their leases in one transaction (one writer transaction per
    round, not per run: on SQLite the writer is shared with the live log's chunks), each due again an
    interval on; a run whose status failed is released on its own, as before."""
    await make_runner(org, "vm1")
    ids = [await make_pending(app, org, "vm1", env) for env in ("dev", "prod", "stage")]
    launcher = RecordingLauncher()
    dispatch = dispatcher(app, launcher)
    await dispatch.run_once()  # launched
    checked_at = datetime.now(UTC)
    for deployment_id in ids:
        await set_row(app, deployment_id, next_check_at=checked_at)
    leases: list[str] = []
    engine = app.state.services.engine

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The round's writes of leases: its claim and the releases.
        if statement.startswith("UPDATE deployments SET") and "dispatch_owner" in statement:
            leases.append(statement)

    sa_event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        await dispatch.run_once()
    finally:
        sa_event.remove(engine.sync_engine, "before_cursor_execute", on_execute)
    rows = [await row(app, d) for d in ids]

    assert 3 == launcher.status_calls
    # The claim of the round, then one release of all three.
    assert 2 == len(leases), leases
    assert [None] * 3 == [r.dispatch_owner for r in rows]
    assert ["executing"] * 3 == [r.status for r in rows]
    for r in rows:
        assert r.next_check_at is not None
        assert checked_at + timedelta(seconds=5) <= r.next_check_at


class BlockedLauncher(RecordingLauncher):
    """A launch that takes as long as the test says (``go``): longer than the dispatcher's lease."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    async def launch(self, spec: RunSpec) -> str:
        self.entered.set()
        await self.go.wait()
        return await super().launch(spec)


async def test_lease__renewed_while_a_launch_outlasts_it_then_released(app: FastAPI, org: Org) -> None:
    await make_runner(org, "vm1")
    pending = await make_pending(app, org, "vm1", "dev")
    launcher = BlockedLauncher()
    dispatch = dispatcher(app, launcher)
    dispatch.settings = DispatchSettings(lease_seconds=3.0, poll_interval_seconds=0.2)
    stop = asyncio.Event()
    running = asyncio.create_task(dispatch.run(stop))
    try:
        await asyncio.wait_for(launcher.entered.wait(), 30)
        claimed = await row(app, pending)
        # Three lease lengths into the launch: the lease still holds, renewed by the heartbeat.
        await asyncio.sleep(9)
        sampled = datetime.now(UTC)
        held = await row(app, pending)
        async with app.state.services.engine.begin() as conn:
            taken = await store.claim_pending(
                conn, owner="another-replica", now=datetime.now(UTC), lease=timedelta(seconds=3), limit=5
            )
        launcher.go.set()
        for _ in range(100):
            launched = await row(app, pending)
            if launched.dispatch_state == "launched":
                break
            await asyncio.sleep(0.1)
    finally:
        launcher.go.set()
        stop.set()
        await asyncio.wait_for(running, 30)

    assert (dispatch.owner, dispatch.owner) == (claimed.dispatch_owner, held.dispatch_owner)
    assert held.dispatch_lease_until > claimed.dispatch_lease_until
    assert held.dispatch_lease_until > sampled
    assert [] == taken
    assert ("launched", None, None) == (
        launched.dispatch_state,
        launched.dispatch_owner,
        launched.dispatch_lease_until,
    )
    assert [pending] == launcher.launched
