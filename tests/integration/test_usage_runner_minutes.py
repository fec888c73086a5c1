"""Usage counts only the time a runner held a deployment (issue 26): an agent deployment counts from the
moment the agent created its runner's job (``job_created_at`` of its ``create-job`` command), not from the
moment the command was queued; a command no agent ever picked up counts zero. Deployments and commands
written with known times; on each database of PO_TEST_DATABASES."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from fastapi import FastAPI

from orchestrator.protocol.commands import CommandType
from orchestrator.store import deployments as deployment_store
from orchestrator.store.schema import agent_commands
from tests.support.deployments import insert_run
from tests.support.orgs import Org
from tests.support.usage import figures as _figures
from tests.support.usage import make_env as _env

MARCH = {"from": "2026-03-01", "to": "2026-04-01"}


def at(day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


async def _command(
    app: FastAPI,
    org: Org,
    deployment_id: uuid.UUID,
    *,
    queued_at: datetime,
    state: str,
    job_created_at: datetime | None,
) -> None:
    """The ``create-job`` command the dispatcher queued for the agent runner ``k8s-agent``."""
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            sa.insert(agent_commands).values(
                id=f"{CommandType.CREATE_JOB.value}:{deployment_id}:1",
                org_id=org.id,
                runner_id="k8s-agent",
                deployment_id=deployment_id,
                type=CommandType.CREATE_JOB.value,
                envelope={},
                state=state,
                attempt=0 if job_created_at is None else 1,
                available_at=queued_at,
                expires_at=at(31),
                created_at=queued_at,
                updated_at=job_created_at or queued_at,
                completed_at=job_created_at,
                job_id=None if job_created_at is None else "job-1",
                job_created_at=job_created_at,
            )
        )


def test_store__the_create_job_command_type_is_the_protocols() -> None:
    assert CommandType.CREATE_JOB.value == deployment_store.CREATE_JOB


async def test_usage__an_agent_deployment_never_picked_up_counts_zero_one_picked_up_counts_from_its_job(
    app: FastAPI, org: Org
) -> None:
    """Never picked up: queued at 10:00, timed out 12.19 minutes later (was billed 12.19 minutes): 0.
    Picked up: queued at 10:00, the agent created the job at 10:02, done at 10:05: 3 minutes. A runner
    the orchestrator launched itself (no command) still counts from its launch: 5 minutes."""
    env = await _env(org, "shop", "dev")
    async with app.state.services.engine.begin() as conn:
        never = await insert_run(
            conn,
            org.id,
            env,
            runner_id="k8s-agent",
            created_at=at(5, 10),
            launched_at=at(5, 10),
            completed_at=at(5, 10, 12, 11),
        )
        picked = await insert_run(
            conn,
            org.id,
            env,
            runner_id="k8s-agent",
            created_at=at(6, 10),
            launched_at=at(6, 10),
            completed_at=at(6, 10, 5),
        )
        await insert_run(
            conn,
            org.id,
            env,
            runner_id="vm1",
            created_at=at(7, 10),
            launched_at=at(7, 10),
            completed_at=at(7, 10, 5),
        )
    await _command(app, org, never, queued_at=at(5, 10), state="expired", job_created_at=None)
    await _command(app, org, picked, queued_at=at(6, 10), state="acked", job_created_at=at(6, 10, 2))

    answer = await org.admin.get(f"/orgs/{org.id}/usage", params=MARCH)

    assert 200 == answer.status_code, answer.text
    body = answer.json()
    assert [(8.0, 0.0, 8.0, 3)] == [_figures(row) for row in body["rows"]]
    assert (8.0, 0.0, 8.0, 3) == _figures(body)


async def test_usage__an_agent_run_picked_up_before_the_period_counts_only_within_it(
    app: FastAPI, org: Org
) -> None:
    """Picked up at 23:58 on Feb 28th, done at 00:04 on March 1st: 4 minutes in March; the same run never
    picked up counts nothing in either month."""
    env = await _env(org, "shop", "dev")
    feb_end = datetime(2026, 2, 28, 23, 50, tzinfo=UTC)
    async with app.state.services.engine.begin() as conn:
        picked = await insert_run(
            conn,
            org.id,
            env,
            runner_id="k8s-agent",
            created_at=feb_end,
            launched_at=feb_end,
            completed_at=at(1, 0, 4),
        )
        never = await insert_run(
            conn,
            org.id,
            env,
            runner_id="k8s-agent",
            created_at=feb_end,
            launched_at=feb_end,
            completed_at=at(1, 0, 4),
        )
    await _command(
        app,
        org,
        picked,
        queued_at=feb_end,
        state="acked",
        job_created_at=datetime(2026, 2, 28, 23, 58, tzinfo=UTC),
    )
    await _command(app, org, never, queued_at=feb_end, state="expired", job_created_at=None)

    march = (await org.admin.get(f"/orgs/{org.id}/usage", params=MARCH)).json()
    february = (
        await org.admin.get(f"/orgs/{org.id}/usage", params={"from": "2026-02-01", "to": "2026-03-01"})
    ).json()

    assert (4.0, 0.0, 4.0, 0) == _figures(march)
    assert (2.0, 0.0, 2.0, 2) == _figures(february)
