"""The live log's chunks (issue 22): a deployment's encrypted log chunks by sequence number, and what a
follower polls (``progress``).

Rows hold the age ciphertext as bytes, never plaintext; they are deleted with their deployment's other
logs (``delete_for``, by the retention worker) or with its row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.rows import insert_if_absent
from orchestrator.store.schema import deployment_log_chunks, deployment_phases, deployments

_c = deployment_log_chunks.c


@dataclass(frozen=True, kw_only=True)
class Chunk:
    seq: int
    phase: str
    received_at: datetime
    #: The age ciphertext (raw bytes).
    ciphertext: bytes


async def insert(
    conn: AsyncConnection,
    *,
    deployment_id: uuid.UUID,
    org_id: str,
    seq: int,
    phase: str,
    ciphertext: bytes,
    now: datetime,
) -> bool:
    """Store chunk ``seq`` of the deployment; False (nothing changed) if it has a chunk ``seq`` already."""
    return await insert_if_absent(
        conn,
        deployment_log_chunks,
        {
            "deployment_id": deployment_id,
            "seq": seq,
            "org_id": org_id,
            "phase": phase,
            "received_at": now,
            "size": len(ciphertext),
            "ciphertext": ciphertext,
        },
    )


async def ciphertext_of(conn: AsyncConnection, deployment_id: uuid.UUID, seq: int) -> bytes | None:
    """The stored ciphertext of chunk ``seq``, if there is one."""
    stmt = sa.select(_c.ciphertext).where(_c.deployment_id == deployment_id, _c.seq == seq)
    found = (await conn.execute(stmt)).scalar_one_or_none()
    return None if found is None else bytes(found)


async def page(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, after: int, limit: int, max_bytes: int
) -> list[Chunk]:
    """The chunks after ``after``, in order: at most ``limit`` of them, and no more than ``max_bytes`` of
    ciphertext (but always the first one). Two reads: the sizes first, then only the ciphertext answered,
    so that a page never holds more than its bound in memory."""
    sizes = (
        await conn.execute(
            sa.select(_c.seq, _c.size)
            .where(_c.deployment_id == deployment_id, _c.seq > after)
            .order_by(_c.seq)
            .limit(limit)
        )
    ).all()
    if not sizes:
        return []
    last, total = sizes[0].seq, 0
    for row in sizes:
        total += row.size
        if total > max_bytes and row.seq != sizes[0].seq:
            break
        last = row.seq
    rows = (
        await conn.execute(
            sa.select(_c.seq, _c.phase, _c.received_at, _c.ciphertext)
            .where(_c.deployment_id == deployment_id, _c.seq > after, _c.seq <= last)
            .order_by(_c.seq)
        )
    ).all()
    return [
        Chunk(seq=r.seq, phase=r.phase, received_at=r.received_at, ciphertext=bytes(r.ciphertext))
        for r in rows
    ]


async def delete_for(conn: AsyncConnection, deployment_id: uuid.UUID) -> int:
    """Delete the deployment's chunks; how many there were."""
    result = await conn.execute(deployment_log_chunks.delete().where(_c.deployment_id == deployment_id))
    return result.rowcount


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Where a deployment's live log stands: what a follower polls (one statement)."""

    status: str
    status_message: str
    completed_at: datetime | None
    updated_at: datetime
    #: The object key of the whole log, once stored (``PUT .../logs``, at the end).
    logs_key: str | None
    #: A whole log may come: the deployment was launched, with a logs recipient.
    whole_log_expected: bool
    #: When the retention worker deleted its logs (None: kept).
    objects_deleted_at: datetime | None
    #: The highest stored chunk's seq (0: none), and when the newest chunk arrived.
    last_seq: int
    last_received_at: datetime | None
    #: How many phases are recorded.
    phases: int

    @property
    def has_whole_log(self) -> bool:
        return self.logs_key is not None


async def progress(conn: AsyncConnection, org_id: str, deployment_id: uuid.UUID) -> Progress | None:
    """Where the deployment's live log stands; None when the organization has no such deployment."""
    d, p = deployments.c, deployment_phases.c
    of_chunks = _c.deployment_id == deployment_id
    stmt = sa.select(
        d.status,
        d.status_message,
        d.completed_at,
        d.updated_at,
        d.logs_key,
        d.objects_deleted_at,
        d.launched_at,
        d.encrypted_logs_recipient,
        sa.select(sa.func.coalesce(sa.func.max(_c.seq), 0))
        .where(of_chunks)
        .scalar_subquery()
        .label("last_seq"),
        # max() keeps the column's type: a UTC timestamp on both databases.
        sa.select(sa.func.max(_c.received_at)).where(of_chunks).scalar_subquery().label("last_received_at"),
        sa.select(sa.func.count())
        .select_from(deployment_phases)
        .where(p.deployment_id == deployment_id)
        .scalar_subquery()
        .label("phases"),
    ).where(d.org_id == org_id, d.id == deployment_id)
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    return Progress(
        status=row.status,
        status_message=row.status_message,
        completed_at=row.completed_at,
        updated_at=row.updated_at,
        logs_key=row.logs_key,
        whole_log_expected=row.launched_at is not None and row.encrypted_logs_recipient is not None,
        objects_deleted_at=row.objects_deleted_at,
        last_seq=int(row.last_seq),
        last_received_at=row.last_received_at,
        phases=int(row.phases),
    )
