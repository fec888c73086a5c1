"""Keyset pagination shared by every list query."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.errors import InvalidInputError

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Page(Generic[T]):
    items: list[T]
    #: The sort key of the last item when more items follow, else None.
    next_key: tuple[str, ...] | None


def paged(
    stmt: sa.Select[Any],
    key_columns: Sequence[sa.ColumnElement[Any]],
    after: tuple[Any, ...] | None,
    limit: int,
) -> sa.Select[Any]:
    """Order by the key columns, start after ``after`` and fetch one row more than ``limit``."""
    if after is not None:
        if len(after) != len(key_columns):
            raise InvalidInputError("page: invalid page token")
        bound = [sa.literal(value, column.type) for column, value in zip(key_columns, after, strict=True)]
        stmt = stmt.where(sa.tuple_(*key_columns) > sa.tuple_(*bound))
    return stmt.order_by(*key_columns).limit(limit + 1)


def newest_first(
    stmt: sa.Select[Any],
    created_at: sa.ColumnElement[datetime],
    row_id: sa.ColumnElement[uuid.UUID],
    after: tuple[str, ...] | None,
    limit: int,
) -> sa.Select[Any]:
    """Keyset on (created_at, id), descending: start after ``after`` (an ISO time and a UUID, as
    :func:`newest_key` gives them) and fetch one row more than ``limit``."""
    if after is not None:
        try:
            created, last_id = datetime.fromisoformat(after[0]), uuid.UUID(after[1])
        except (ValueError, IndexError) as exc:
            raise InvalidInputError("page: invalid page token") from exc
        stmt = stmt.where(sa.or_(created_at < created, sa.and_(created_at == created, row_id < last_id)))
    return stmt.order_by(created_at.desc(), row_id.desc()).limit(limit + 1)


def newest_key(item: Any) -> tuple[str, str]:
    """The page key of an item listed :func:`newest_first`."""
    return (item.created_at.isoformat(), str(item.id))


def to_page(items: list[T], limit: int, key: Any) -> Page[T]:
    if len(items) > limit:
        items = items[:limit]
        return Page(items=items, next_key=tuple(str(v) for v in key(items[-1])))
    return Page(items=items, next_key=None)


async def fetch_page(
    conn: AsyncConnection,
    stmt: sa.Select[Any],
    key_columns: Sequence[sa.ColumnElement[Any]],
    after: tuple[Any, ...] | None,
    limit: int,
    item: Callable[[sa.Row[Any]], T],
) -> Page[T]:
    """The rows of ``stmt`` after ``after`` in the order of the key columns (:func:`paged`), each as
    ``item``; the next page starts after the last row's key columns."""
    rows = (await conn.execute(paged(stmt, key_columns, after, limit))).all()
    page = to_page(rows, limit, lambda row: tuple(row._mapping[column] for column in key_columns))
    return Page(items=[item(row) for row in page.items], next_key=page.next_key)
