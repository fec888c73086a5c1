"""Reading and writing rows: a row as the domain dataclass of its table, the row of an id in an
organization (read, or updated), the timestamps of a new row, an insert that answers 409 on a taken key,
an insert that tells whether its key was free (in a savepoint, or one statement that skips a taken primary
key), the first values of a column."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.store.errors import conflict_on_integrity

T = TypeVar("T")

Row = sa.Row[tuple[object, ...]]


def _as(cls: type[T], values: Mapping[Any, Any], computed: Mapping[str, Any]) -> T:
    names = (f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    return cls(**{name: computed[name] if name in computed else values[name] for name in names})


def entity(cls: type[T], row: Row, **computed: Any) -> T:
    """``cls`` (a dataclass) with each field from the column of its name, or from ``computed``; columns
    that are not fields (sealed secrets, token hashes) are left out."""
    return _as(cls, row._mapping, computed)


def created_now() -> dict[str, datetime]:
    """``created_at`` and ``updated_at`` of a row inserted now."""
    now = datetime.now(UTC)
    return {"created_at": now, "updated_at": now}


async def insert_row(
    conn: AsyncConnection, table: sa.Table, values: dict[str, Any], cls: type[T], *, conflict: str
) -> T:
    """Insert ``values`` (ConflictError ``conflict`` when a unique key is taken); the row as ``cls``."""
    with conflict_on_integrity(conflict):
        await conn.execute(table.insert().values(values))
    return _as(cls, values, {})


async def inserted(conn: AsyncConnection, insert: sa.Insert) -> bool:
    """Run ``insert`` in a savepoint; False when a unique key is taken (nothing inserted, the
    transaction goes on)."""
    try:
        async with conn.begin_nested():
            await conn.execute(insert)
    except sqlalchemy.exc.IntegrityError:
        return False
    return True


async def insert_if_absent(conn: AsyncConnection, table: sa.Table, values: dict[str, Any]) -> bool:
    """Insert ``values`` unless a row of the same primary key exists; whether it was inserted. One statement
    (``ON CONFLICT DO NOTHING``), no savepoint: a clash leaves the transaction usable on PostgreSQL too."""
    keys = [column.name for column in table.primary_key.columns]
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table).values(values).on_conflict_do_nothing(index_elements=keys)
    return (await conn.execute(stmt)).rowcount > 0


async def org_row(conn: AsyncConnection, table: sa.Table, org_id: str, object_id: object) -> Row | None:
    """The row of ``object_id`` in organization ``org_id`` (a table keyed by ``org_id`` and ``id``)."""
    stmt = table.select().where(table.c.org_id == org_id, table.c.id == object_id)
    return (await conn.execute(stmt)).first()


async def org_entity(
    conn: AsyncConnection, table: sa.Table, cls: type[T], org_id: str, object_id: object
) -> T | None:
    """The row of ``object_id`` in organization ``org_id`` as ``cls`` (see ``entity``); None when there is
    none."""
    row = await org_row(conn, table, org_id, object_id)
    return entity(cls, row) if row else None


async def update_org_row(
    conn: AsyncConnection, table: sa.Table, org_id: str, object_id: object, values: Mapping[str, object]
) -> None:
    """Set ``values``, and ``updated_at`` to now, on the row of ``object_id`` in organization ``org_id``."""
    await conn.execute(
        table.update()
        .where(table.c.org_id == org_id, table.c.id == object_id)
        .values(**values, updated_at=datetime.now(UTC))
    )


async def first_values(
    conn: AsyncConnection, column: sa.ColumnElement[T], *where: sa.ColumnElement[bool], limit: int
) -> list[T]:
    """The first ``limit`` values of ``column`` (in its order) in the rows ``where`` selects."""
    stmt = sa.select(column).where(*where).order_by(column).limit(limit)
    return list((await conn.execute(stmt)).scalars().all())
