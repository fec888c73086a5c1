"""Deployments: rows, the executing-per-environment guard, idempotency, and the dispatcher's claims."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.deployments import Deployment, DispatchState, Status, cancelled_message
from orchestrator.domain.usage import Run
from orchestrator.errors import ConflictError
from orchestrator.store.pages import Page, newest_first, newest_key, to_page
from orchestrator.store.schema import agent_commands, deployments, envs, runners

#: The command that hands a deployment to an agent (usage counts from its job's creation).
CREATE_JOB = "create-job"  # protocol.commands.CommandType.CREATE_JOB

#: Columns of the row that are not fields of ``Deployment`` (read with their own functions).
_NOT_IN_ENTITY = frozenset({"objects_deleted_at"})


def _deployment(row: sa.Row[tuple[object, ...]]) -> Deployment:
    return Deployment(**{k: v for k, v in row._mapping.items() if k not in _NOT_IN_ENTITY})


async def insert(conn: AsyncConnection, values: dict[str, Any]) -> Deployment:
    """Insert an executing deployment; ConflictError if one already executes in the environment."""
    # One statement (no savepoint, no read back): a refused insert ends the caller's transaction anyway,
    # as its ConflictError is not caught in it.
    try:
        row = (await conn.execute(deployments.insert().values(values).returning(*deployments.c))).one()
    except sqlalchemy.exc.IntegrityError as exc:
        if "idempotency" in str(exc.orig).lower():
            raise ConflictError("a deployment with this Idempotency-Key is being created") from exc
        raise ConflictError(
            f"a deployment is already executing in environment '{values['project_id']}/{values['env_id']}'"
        ) from exc
    return _deployment(row)


#: Built once: every runner gateway request reads its deployment (building the statement and its cache key
#: cost as much as running it on SQLite).
_GET = deployments.select().where(
    deployments.c.org_id == sa.bindparam("org_id"), deployments.c.id == sa.bindparam("deployment_id")
)
_GET_FOR_UPDATE = _GET.with_for_update()


async def get(
    conn: AsyncConnection, org_id: str, deployment_id: uuid.UUID, *, for_update: bool = False
) -> Deployment | None:
    stmt = _GET_FOR_UPDATE if for_update else _GET
    row = (await conn.execute(stmt, {"org_id": org_id, "deployment_id": deployment_id})).first()
    return _deployment(row) if row else None


async def get_by_id(conn: AsyncConnection, deployment_id: uuid.UUID) -> Deployment | None:
    row = (await conn.execute(deployments.select().where(deployments.c.id == deployment_id))).first()
    return _deployment(row) if row else None


async def find_idempotent(conn: AsyncConnection, org_id: str, key_digest: str) -> Deployment | None:
    row = (
        await conn.execute(
            deployments.select().where(
                deployments.c.org_id == org_id, deployments.c.idempotency_key_digest == key_digest
            )
        )
    ).first()
    return _deployment(row) if row else None


async def forget_idempotency_key(conn: AsyncConnection, deployment_id: uuid.UUID) -> None:
    """An expired key may be used again: the old deployment lets go of it."""
    await conn.execute(
        deployments.update().where(deployments.c.id == deployment_id).values(idempotency_key_digest=None)
    )


async def executing_in_env(conn: AsyncConnection, env_uuid: uuid.UUID) -> Deployment | None:
    row = (
        await conn.execute(
            deployments.select().where(
                deployments.c.env_uuid == env_uuid, deployments.c.status == Status.EXECUTING
            )
        )
    ).first()
    return _deployment(row) if row else None


async def last_in_env(
    conn: AsyncConnection, env_uuid: uuid.UUID, *, succeeded_state_change: bool = False
) -> Deployment | None:
    """The newest deployment of an environment; with ``succeeded_state_change``, the newest that
    changed the infrastructure successfully (a deploy or rollback that was not plan-only)."""
    stmt = deployments.select().where(deployments.c.env_uuid == env_uuid)
    if succeeded_state_change:
        stmt = stmt.where(
            deployments.c.status == Status.SUCCEEDED,
            deployments.c.plan_only.is_(False),
            deployments.c.mode.in_(["deploy", "rollback"]),
        )
    row = (await conn.execute(stmt.order_by(deployments.c.created_at.desc()).limit(1))).first()
    return _deployment(row) if row else None


async def state_changing_in_env(
    conn: AsyncConnection, env_uuid: uuid.UUID, *, limit: int
) -> list[Deployment]:
    """The newest (at most ``limit``) finished deployments of an environment that may have changed its
    infrastructure: deploys and rollbacks that were not plan-only, succeeded or failed (a failed apply may
    have created resources before it stopped). Newest first."""
    stmt = (
        deployments.select()
        .where(
            deployments.c.env_uuid == env_uuid,
            deployments.c.status != Status.EXECUTING,
            deployments.c.plan_only.is_(False),
            deployments.c.mode.in_(["deploy", "rollback"]),
        )
        .order_by(deployments.c.created_at.desc())
        .limit(limit)
    )
    return [_deployment(row) for row in (await conn.execute(stmt)).all()]


async def list_page(
    conn: AsyncConnection,
    org_id: str,
    *,
    project_id: str | None,
    env_id: str | None,
    modes: Sequence[str],
    statuses: Sequence[str],
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[Deployment]:
    """Newest first."""
    stmt = deployments.select().where(deployments.c.org_id == org_id)
    if project_id:
        stmt = stmt.where(deployments.c.project_id == project_id)
    if env_id:
        stmt = stmt.where(deployments.c.env_id == env_id)
    if modes:
        stmt = stmt.where(deployments.c.mode.in_(list(modes)))
    if statuses:
        stmt = stmt.where(deployments.c.status.in_(list(statuses)))
    stmt = newest_first(stmt, deployments.c.created_at, deployments.c.id, after, limit)
    return to_page([_deployment(r) for r in (await conn.execute(stmt)).all()], limit, newest_key)


async def usage_runs(conn: AsyncConnection, org_id: str, start: datetime, end: datetime) -> list[Run]:
    """What ``domain.usage`` reads of the organization's deployments that count in ``[start, end)``: those
    created in it, and those held by a runner before its end whose run had not ended by its start (still
    executing, or completed and exited, whichever is set, after ``start``). One query, on the
    ``(org_id, created_at)`` index; the minutes are ``domain.usage``'s.

    A runner holds a deployment from ``launched_at`` (the orchestrator started its runner, or a managed
    runner claimed it), except for a deployment handed to an agent (it has a ``create-job`` command): that
    one is held from the moment the agent created the runner's job (``job_created_at`` of the command), so
    a command no agent ever picked up counts nothing."""
    c = deployments.c
    commands = agent_commands.c
    agent_jobs = (
        sa.select(
            commands.deployment_id.label("deployment_id"),
            sa.func.min(commands.job_created_at).label("job_created_at"),
        )
        .where(commands.org_id == org_id, commands.type == CREATE_JOB)
        .group_by(commands.deployment_id)
        .subquery()
    )
    held_from = sa.case(
        (agent_jobs.c.deployment_id.is_not(None), agent_jobs.c.job_created_at), else_=c.launched_at
    ).label("launched_at")
    ran_into = sa.and_(
        held_from.is_not(None),
        held_from < end,
        sa.or_(c.completed_at.is_(None), c.completed_at > start),
        sa.or_(c.exited_at.is_(None), c.exited_at > start),
    )
    stmt = (
        sa.select(c.project_id, c.env_id, c.runner_id, c.created_at, held_from, c.completed_at, c.exited_at)
        .select_from(deployments.outerjoin(agent_jobs, agent_jobs.c.deployment_id == c.id))
        .where(c.org_id == org_id, c.created_at < end, sa.or_(c.created_at >= start, ran_into))
    )
    return [Run(**row._mapping) for row in (await conn.execute(stmt)).all()]


# --- results ------------------------------------------------------------------------------------------


async def complete(
    conn: AsyncConnection,
    deployment_id: uuid.UUID,
    *,
    status: Status,
    message: str,
    now: datetime,
    outputs: str | None = None,
    metrics: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    results_digest: str | None = None,
) -> Status | None:
    """Finish an executing deployment; the status it ended with, or None (nothing changed) if it was
    already final. A failure of a deployment whose cancel was asked for ends it ``cancelled`` (decided in
    the same statement: a cancel committed meanwhile is seen)."""
    values: dict[str, Any] = {
        "status": status,
        "status_message": message,
        "completed_at": now,
        "updated_at": now,
        "dispatch_state": DispatchState.DONE,
        "next_check_at": None,
        "error": error,
        "results_digest": results_digest,
    }
    if status == Status.FAILED:
        requested = deployments.c.cancel_requested_at.is_not(None)
        values["status"] = sa.case(
            (requested, sa.literal(Status.CANCELLED.value)), else_=sa.literal(status.value)
        )
        values["status_message"] = sa.case(
            (requested, sa.literal(cancelled_message(message))), else_=sa.literal(message)
        )
    if outputs is not None:
        values["outputs"] = outputs
    if metrics is not None:
        values["metrics"] = metrics
    row = (
        await conn.execute(
            deployments.update()
            .where(deployments.c.id == deployment_id, deployments.c.status == Status.EXECUTING)
            .values(values)
            .returning(deployments.c.status)
        )
    ).first()
    return None if row is None else Status(row[0])


async def cancel_unlaunched(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, by: str, message: str, now: datetime
) -> bool:
    """End a deployment no runner has yet (pending and not being launched, or queued for a managed
    runner) ``cancelled``; False if it was launched or claimed meanwhile."""
    free = sa.or_(deployments.c.dispatch_lease_until.is_(None), deployments.c.dispatch_lease_until < now)
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.status == Status.EXECUTING,
            deployments.c.dispatch_state.in_([DispatchState.PENDING, DispatchState.QUEUED]),
            deployments.c.dispatch_owner.is_(None),
            free,
        )
        .values(
            status=Status.CANCELLED,
            status_message=message,
            completed_at=now,
            updated_at=now,
            dispatch_state=DispatchState.DONE,
            next_check_at=None,
            error={"error": "CANCELLED", "message": message},
            cancel_requested_at=now,
            cancel_requested_by=by,
        )
    )
    return result.rowcount > 0


async def set_status_message(
    conn: AsyncConnection, deployment_id: uuid.UUID, message: str, *, now: datetime
) -> None:
    """Tell something about an executing deployment (a final one keeps its message)."""
    await conn.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id, deployments.c.status == Status.EXECUTING)
        .values(status_message=message, updated_at=now)
    )


async def request_cancel(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, by: str, message: str, now: datetime
) -> bool:
    """Record a cancel of an executing deployment (the first one counts) and have its run checked now;
    False if it is final or a cancel was already asked for."""
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.status == Status.EXECUTING,
            deployments.c.cancel_requested_at.is_(None),
        )
        .values(
            cancel_requested_at=now,
            cancel_requested_by=by,
            status_message=message,
            updated_at=now,
            next_check_at=now,
        )
    )
    return result.rowcount > 0


async def record_logs(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, key: str, size: int, now: datetime
) -> bool:
    """Record the deployment's logs, once: False (nothing changed) if it has logs already, or had them
    before the retention worker deleted them."""
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.logs_key.is_(None),
            deployments.c.objects_deleted_at.is_(None),
        )
        .values(logs_key=key, logs_size=size, updated_at=now)
    )
    return result.rowcount > 0


# --- dispatch claims ------------------------------------------------------------------------------------


async def _claim(
    conn: AsyncConnection,
    condition: sa.ColumnElement[bool],
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> list[Deployment]:
    """Lease up to ``limit`` rows matching ``condition`` to ``owner``; each row goes to exactly one owner.

    PostgreSQL: FOR UPDATE SKIP LOCKED lets replicas claim side by side. SQLite: the transaction holds the
    write lock from BEGIN IMMEDIATE, so claims are serialized.
    """
    free = sa.or_(deployments.c.dispatch_lease_until.is_(None), deployments.c.dispatch_lease_until < now)
    ids = (
        (
            await conn.execute(
                sa.select(deployments.c.id)
                .where(condition, free)
                .order_by(deployments.c.created_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        .scalars()
        .all()
    )
    if not ids:
        return []
    await conn.execute(
        deployments.update()
        .where(deployments.c.id.in_(ids))
        .values(dispatch_owner=owner, dispatch_lease_until=now + lease)
    )
    rows = (await conn.execute(deployments.select().where(deployments.c.id.in_(ids)))).all()
    return sorted((_deployment(r) for r in rows), key=lambda d: d.created_at)


def _pending() -> sa.ColumnElement[bool]:
    return sa.and_(
        deployments.c.dispatch_state == DispatchState.PENDING, deployments.c.status == Status.EXECUTING
    )


def _checks_due(now: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(
        deployments.c.status == Status.EXECUTING,
        deployments.c.dispatch_state == DispatchState.LAUNCHED,
        sa.or_(deployments.c.next_check_at <= now, deployments.c.timeout_at <= now),
    )


def _claimable_exists(condition: sa.ColumnElement[bool], now: datetime) -> sa.Exists:
    free = sa.or_(deployments.c.dispatch_lease_until.is_(None), deployments.c.dispatch_lease_until < now)
    return sa.exists(sa.select(deployments.c.id).where(condition, free))


async def work_due(
    conn: AsyncConnection, *, now: datetime, also: Sequence[sa.Exists] = ()
) -> tuple[bool, ...]:
    """Whether any deployment is pending a launch, any launched one is due for a status check (each not
    leased to anyone), and each of the ``also`` conditions, in one statement: a dispatcher round with
    nothing to do costs one read."""
    row = (
        await conn.execute(
            sa.select(_claimable_exists(_pending(), now), _claimable_exists(_checks_due(now), now), *also)
        )
    ).one()
    return tuple(bool(value) for value in row)


async def count_launched(conn: AsyncConnection, *, handle_prefix: str) -> int:
    """Executing deployments launched with a handle starting with ``handle_prefix`` (a host's runs)."""
    escaped = handle_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    found = await conn.execute(
        sa.select(sa.func.count())
        .select_from(deployments)
        .where(
            deployments.c.status == Status.EXECUTING,
            deployments.c.dispatch_state == DispatchState.LAUNCHED,
            deployments.c.handle.like(escaped + "%", escape="\\"),
        )
    )
    return int(found.scalar_one())


async def release_queued(
    conn: AsyncConnection, ids: Sequence[uuid.UUID], *, owner: str, now: datetime, message: str
) -> None:
    """End ``owner``'s leases of pending deployments left waiting for a run slot, saying so in their
    status message; they stay pending, claimable again at once."""
    await conn.execute(
        deployments.update()
        .where(
            deployments.c.id.in_(list(ids)),
            deployments.c.dispatch_owner == owner,
            deployments.c.status == Status.EXECUTING,
        )
        .values(dispatch_owner=None, dispatch_lease_until=None, updated_at=now, status_message=message)
    )


async def release_every_claim(conn: AsyncConnection, *, now: datetime) -> int:
    """End every dispatch lease, whoever holds it (a restored backup: the servers that held them are
    not this database's); how many were held."""
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.dispatch_owner.is_not(None))
        .values(dispatch_owner=None, dispatch_lease_until=None, updated_at=now)
    )
    return result.rowcount


async def claim_pending(
    conn: AsyncConnection, *, owner: str, now: datetime, lease: timedelta, limit: int
) -> list[Deployment]:
    return await _claim(conn, _pending(), owner=owner, now=now, lease=lease, limit=limit)


async def claim_checks(
    conn: AsyncConnection, *, owner: str, now: datetime, lease: timedelta, limit: int
) -> list[Deployment]:
    """Launched, still executing deployments whose next status check is due (or whose time is up)."""
    return await _claim(conn, _checks_due(now), owner=owner, now=now, lease=lease, limit=limit)


async def release(
    conn: AsyncConnection,
    deployment_id: uuid.UUID,
    *,
    owner: str,
    now: datetime,
    **values: Any,
) -> bool:
    """End ``owner``'s lease, writing ``values``; False if the lease was lost meanwhile."""
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id, deployments.c.dispatch_owner == owner)
        .values(dispatch_owner=None, dispatch_lease_until=None, updated_at=now, **values)
    )
    return result.rowcount > 0


async def release_many(
    conn: AsyncConnection,
    deployment_ids: Sequence[uuid.UUID],
    *,
    owner: str,
    now: datetime,
    **values: Any,
) -> int:
    """End ``owner``'s leases of ``deployment_ids``, writing the same ``values`` to each (one statement); how
    many it still held."""
    if not deployment_ids:
        return 0
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.id.in_(list(deployment_ids)), deployments.c.dispatch_owner == owner)
        .values(dispatch_owner=None, dispatch_lease_until=None, updated_at=now, **values)
    )
    return result.rowcount


async def renew_leases(conn: AsyncConnection, *, owner: str, now: datetime, lease: timedelta) -> int:
    """Extend ``owner``'s leases that still hold to ``now + lease`` (the dispatcher's heartbeat while it
    works on them); how many. A lease that ran out stays out: another server may have taken it over."""
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.dispatch_owner == owner, deployments.c.dispatch_lease_until >= now)
        .values(dispatch_lease_until=now + lease)
    )
    return result.rowcount


async def lease_until(conn: AsyncConnection, deployment_id: uuid.UUID, until: datetime) -> None:
    """Hold a deployment back from claims until ``until`` (a launch backoff)."""
    await conn.execute(
        deployments.update().where(deployments.c.id == deployment_id).values(dispatch_lease_until=until)
    )


# --- object retention -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KeptObjects:
    """A deployment whose objects (bundle, logs) are due for deletion."""

    id: uuid.UUID
    org_id: str
    bundle_key: str
    logs_key: str | None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.bundle_key,) if self.logs_key is None else (self.bundle_key, self.logs_key)


def _state_change(table: sa.FromClause) -> sa.ColumnElement[bool]:
    """Deployments that changed the infrastructure successfully (as ``last_in_env`` with
    ``succeeded_state_change``)."""
    return sa.and_(
        table.c.status == Status.SUCCEEDED,
        table.c.plan_only.is_(False),
        table.c.mode.in_(["deploy", "rollback"]),
    )


def _objects_due(cutoff: datetime) -> sa.ColumnElement[bool]:
    """Final deployments whose objects are kept, finished before ``cutoff`` or of a deleted environment.

    Never an executing deployment (its runner may still fetch the bundle or upload logs), nor, while its
    environment exists, the environment's newest successful state change: deleting the environment runs a
    destroy with that deployment's code (``dispatch.creation.create_destroy``).
    """
    env_gone = ~sa.exists().where(envs.c.uuid == deployments.c.env_uuid)
    newer = deployments.alias("newer")
    current_code = sa.and_(
        _state_change(deployments),
        ~sa.exists().where(
            newer.c.env_uuid == deployments.c.env_uuid,
            _state_change(newer),
            newer.c.created_at > deployments.c.created_at,
        ),
    )
    finished_before = sa.or_(
        deployments.c.completed_at < cutoff,
        sa.and_(deployments.c.completed_at.is_(None), deployments.c.updated_at < cutoff),
    )
    return sa.and_(
        deployments.c.objects_deleted_at.is_(None),
        deployments.c.status != Status.EXECUTING,
        sa.or_(env_gone, sa.and_(finished_before, sa.not_(current_code))),
    )


async def has_objects_due(conn: AsyncConnection, *, cutoff: datetime) -> bool:
    """A cheap read before ``objects_due``: is there anything to delete?"""
    found = await conn.execute(sa.select(deployments.c.id).where(_objects_due(cutoff)).limit(1))
    return found.first() is not None


async def objects_due(
    conn: AsyncConnection, *, cutoff: datetime, limit: int, after: uuid.UUID | None = None
) -> list[KeptObjects]:
    """Up to ``limit`` deployments whose objects are due for deletion, by id after ``after``. Nothing is
    locked: deleting objects twice is harmless, and ``mark_objects_deleted`` records each deployment once."""
    stmt = sa.select(
        deployments.c.id, deployments.c.org_id, deployments.c.bundle_key, deployments.c.logs_key
    ).where(_objects_due(cutoff))
    if after is not None:
        stmt = stmt.where(deployments.c.id > after)
    rows = (await conn.execute(stmt.order_by(deployments.c.id).limit(limit))).all()
    return [KeptObjects(id=r.id, org_id=r.org_id, bundle_key=r.bundle_key, logs_key=r.logs_key) for r in rows]


async def mark_objects_deleted(conn: AsyncConnection, deployment_id: uuid.UUID, *, now: datetime) -> bool:
    """Record that the deployment's objects are gone (the logs key is let go of: ``has_logs`` turns
    false); False if another replica recorded it first."""
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id, deployments.c.objects_deleted_at.is_(None))
        .values(objects_deleted_at=now, logs_key=None, logs_size=None)
    )
    return result.rowcount > 0


def _outputs_due(cutoff: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(deployments.c.outputs.is_not(None), deployments.c.completed_at < cutoff)


async def has_outputs_due(conn: AsyncConnection, *, cutoff: datetime) -> bool:
    """A cheap read before ``delete_outputs``: does a deployment finished before ``cutoff`` keep outputs?"""
    found = await conn.execute(sa.select(deployments.c.id).where(_outputs_due(cutoff)).limit(1))
    return found.first() is not None


async def delete_outputs(conn: AsyncConnection, *, cutoff: datetime) -> int:
    """Delete the encrypted outputs of the deployments finished before ``cutoff``; how many."""
    result = await conn.execute(deployments.update().where(_outputs_due(cutoff)).values(outputs=None))
    return result.rowcount


async def objects_deleted_at(conn: AsyncConnection, org_id: str, deployment_id: uuid.UUID) -> datetime | None:
    """When the deployment's objects were deleted by the retention worker; None while they are kept."""
    return (
        await conn.execute(
            sa.select(deployments.c.objects_deleted_at).where(
                deployments.c.org_id == org_id, deployments.c.id == deployment_id
            )
        )
    ).scalar_one_or_none()


# --- metrics ------------------------------------------------------------------------------------------


async def executing_by_runner_type(conn: AsyncConnection) -> dict[str, int]:
    """How many deployments execute now, by the type of their runner (``unknown``: the runner is gone)."""
    c = deployments.c
    kind = sa.func.coalesce(runners.c.type, "unknown")
    stmt = (
        sa.select(kind, sa.func.count())
        .select_from(
            deployments.outerjoin(runners, sa.and_(runners.c.org_id == c.org_id, runners.c.id == c.runner_id))
        )
        .where(c.status == Status.EXECUTING)
        .group_by(kind)
    )
    return {str(name): int(count) for name, count in (await conn.execute(stmt)).all()}


async def runner_type(conn: AsyncConnection, org_id: str, runner_id: str) -> str | None:
    """The type of a runner, if it exists."""
    stmt = sa.select(runners.c.type).where(runners.c.org_id == org_id, runners.c.id == runner_id)
    found = (await conn.execute(stmt)).scalar_one_or_none()
    return None if found is None else str(found)
