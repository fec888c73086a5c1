"""The live log's chunks (issue 22): a deployment's encrypted log chunks by sequence number, and what a
follower polls (``progress``, ``progress_many``).

Rows hold the age ciphertext as bytes, never plaintext; they are deleted with their deployment's other
logs (``delete_for``, by the retention worker) or with its row.

The statements run for every chunk and every follower (``insert_many``, ``page``, ``progress*``) are built
once, with bound parameters: building and keying SQLAlchemy's statement each time cost ten times its
execution.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.errors import NotFoundError
from orchestrator.store.rows import insert_if_absent
from orchestrator.store.schema import deployment_log_chunks, deployment_phases, deployments

_c = deployment_log_chunks.c
_d = deployments.c
_p = deployment_phases.c


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


@dataclass(frozen=True, kw_only=True, slots=True)
class NewChunk:
    """A chunk to store (``insert_many``)."""

    deployment_id: uuid.UUID
    org_id: str
    seq: int
    phase: str
    ciphertext: bytes
    received_at: datetime


async def insert_many(conn: AsyncConnection, chunks: Sequence[NewChunk]) -> set[tuple[uuid.UUID, int]]:
    """Store ``chunks`` in one statement, each unless its deployment has a chunk of its number already
    (``ON CONFLICT DO NOTHING``, no savepoint); the (deployment, seq) of those stored now. Of two chunks of
    one number in ``chunks``, the first is stored. NotFoundError when a chunk's deployment is gone (the
    statement stored none)."""
    if not chunks:
        return set()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = (
        dialect.insert(deployment_log_chunks)
        .values(
            [
                {
                    "deployment_id": chunk.deployment_id,
                    "seq": chunk.seq,
                    "org_id": chunk.org_id,
                    "phase": chunk.phase,
                    "received_at": chunk.received_at,
                    "size": len(chunk.ciphertext),
                    "ciphertext": chunk.ciphertext,
                }
                for chunk in chunks
            ]
        )
        .on_conflict_do_nothing(index_elements=["deployment_id", "seq"])
        .returning(_c.deployment_id, _c.seq)
    )
    try:
        return {(row.deployment_id, row.seq) for row in await conn.execute(stmt)}
    except sqlalchemy.exc.IntegrityError as exc:  # the only constraint left: the deployment's key
        gone = ", ".join(sorted({f"'{chunk.deployment_id}'" for chunk in chunks}))
        raise NotFoundError(f"deployment {gone} not found: its chunks cannot be stored") from exc


async def ciphertext_of(conn: AsyncConnection, deployment_id: uuid.UUID, seq: int) -> bytes | None:
    """The stored ciphertext of chunk ``seq``, if there is one."""
    stmt = sa.select(_c.ciphertext).where(_c.deployment_id == deployment_id, _c.seq == seq)
    found = (await conn.execute(stmt)).scalar_one_or_none()
    return None if found is None else bytes(found)


_PAGE_SIZES = (
    sa.select(_c.seq, _c.size)
    .where(_c.deployment_id == sa.bindparam("deployment_id"), _c.seq > sa.bindparam("after"))
    .order_by(_c.seq)
    .limit(sa.bindparam("limit", type_=sa.Integer()))
)
_PAGE = (
    sa.select(_c.seq, _c.phase, _c.received_at, _c.ciphertext)
    .where(
        _c.deployment_id == sa.bindparam("deployment_id"),
        _c.seq > sa.bindparam("after"),
        _c.seq <= sa.bindparam("last"),
    )
    .order_by(_c.seq)
)


async def page(
    conn: AsyncConnection, deployment_id: uuid.UUID, *, after: int, limit: int, max_bytes: int
) -> list[Chunk]:
    """The chunks after ``after``, in order: at most ``limit`` of them, and no more than ``max_bytes`` of
    ciphertext (but always the first one). Two reads: the sizes first, then only the ciphertext answered,
    so that a page never holds more than its bound in memory."""
    sizes = (
        await conn.execute(_PAGE_SIZES, {"deployment_id": deployment_id, "after": after, "limit": limit})
    ).all()
    if not sizes:
        return []
    last, total = sizes[0].seq, 0
    for row in sizes:
        total += row.size
        if total > max_bytes and row.seq != sizes[0].seq:
            break
        last = row.seq
    rows = (await conn.execute(_PAGE, {"deployment_id": deployment_id, "after": after, "last": last})).all()
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


def _progress_statement(where: sa.ColumnElement[bool]) -> sa.Select[tuple[object, ...]]:
    of_chunks = _c.deployment_id == _d.id
    return sa.select(
        _d.id,
        _d.status,
        _d.status_message,
        _d.completed_at,
        _d.updated_at,
        _d.logs_key,
        _d.objects_deleted_at,
        _d.launched_at,
        _d.encrypted_logs_recipient,
        sa.select(sa.func.coalesce(sa.func.max(_c.seq), 0))
        .where(of_chunks)
        .scalar_subquery()
        .label("last_seq"),
        # max() keeps the column's type: a UTC timestamp on both databases.
        sa.select(sa.func.max(_c.received_at)).where(of_chunks).scalar_subquery().label("last_received_at"),
        sa.select(sa.func.count())
        .select_from(deployment_phases)
        .where(_p.deployment_id == _d.id)
        .scalar_subquery()
        .label("phases"),
    ).where(where)


_PROGRESS = _progress_statement(
    sa.and_(_d.org_id == sa.bindparam("org_id"), _d.id == sa.bindparam("deployment_id"))
)
_PROGRESS_MANY = _progress_statement(_d.id.in_(sa.bindparam("deployment_ids", expanding=True)))
#: Deployments read by one statement of ``progress_many`` (bound parameters stay few).
PROGRESS_BATCH = 500


def _progress(row: sa.Row[tuple[object, ...]]) -> Progress:
    values = row._mapping
    launched = values["launched_at"] is not None
    return Progress(
        status=values["status"],
        status_message=values["status_message"],
        completed_at=values["completed_at"],
        updated_at=values["updated_at"],
        logs_key=values["logs_key"],
        whole_log_expected=launched and values["encrypted_logs_recipient"] is not None,
        objects_deleted_at=values["objects_deleted_at"],
        last_seq=int(values["last_seq"]),
        last_received_at=values["last_received_at"],
        phases=int(values["phases"]),
    )


async def progress(conn: AsyncConnection, org_id: str, deployment_id: uuid.UUID) -> Progress | None:
    """Where the deployment's live log stands; None when the organization has no such deployment."""
    row = (await conn.execute(_PROGRESS, {"org_id": org_id, "deployment_id": deployment_id})).first()
    return None if row is None else _progress(row)


async def progress_many(
    conn: AsyncConnection, deployment_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, Progress]:
    """Where the live log of each of ``deployment_ids`` stands (of any organization: the caller checked
    access), a statement per ``PROGRESS_BATCH`` of them; a deployment that is gone is left out."""
    wanted = list(deployment_ids)
    found: dict[uuid.UUID, Progress] = {}
    for start in range(0, len(wanted), PROGRESS_BATCH):
        batch = wanted[start : start + PROGRESS_BATCH]
        for row in await conn.execute(_PROGRESS_MANY, {"deployment_ids": batch}):
            found[row.id] = _progress(row)
    return found
