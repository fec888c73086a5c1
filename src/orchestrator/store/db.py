"""Engine creation: the one place that knows SQLite from PostgreSQL connection details."""

from __future__ import annotations

import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

READONLY = "po_readonly"
#: SQLite takes one writer at a time: writers queue for the one pooled connection (in order, without
#: SQLite's busy-wait sleeps), readers use an engine of their own.
_SQLITE_READERS: weakref.WeakKeyDictionary[AsyncEngine, AsyncEngine] = weakref.WeakKeyDictionary()


def readonly(engine: AsyncEngine) -> AsyncEngine:
    """The engine for transactions that only read.

    PostgreSQL: the same engine. SQLite: an engine of its own whose transactions begin DEFERRED, so readers
    never queue behind writers (WAL); the writer engine's transactions begin IMMEDIATE, taking the write
    lock at once (no lock-upgrade deadlocks), on its single connection.
    """
    reader = _SQLITE_READERS.get(engine)
    if reader is None:
        if engine.dialect.name != "sqlite":
            return engine
        reader = _sqlite_engine(engine.url.render_as_string(hide_password=False), pool_size=10)
        _SQLITE_READERS[engine] = reader
    return reader.execution_options(**{READONLY: True})


async def dispose(engine: AsyncEngine) -> None:
    """Close the engine's connections, and those of its reader engine."""
    reader = _SQLITE_READERS.pop(engine, None)
    if reader is not None:
        await reader.dispose()
    await engine.dispose()


def is_sqlite(url: str) -> bool:
    return sa.make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine; on SQLite the writers' engine (one connection; see :func:`readonly`)."""
    if is_sqlite(url):
        return _sqlite_engine(url, pool_size=1)
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _sqlite_engine(url: str, *, pool_size: int) -> AsyncEngine:
    """SQLite with foreign keys, WAL and a busy timeout on every connection."""
    engine = create_async_engine(
        url, connect_args={"timeout": 30}, pool_size=pool_size, max_overflow=0, pool_timeout=60
    )

    @sa.event.listens_for(engine.sync_engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        # aiosqlite's adapter would otherwise open a transaction on its own; we issue BEGIN ourselves
        # so that writers take the lock at the start of the transaction (no upgrade deadlocks).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _sqlite_begin(conn: sa.Connection) -> None:
        # Readers take no lock (WAL); writers take the write lock up front (see readonly()).
        readonly = conn.get_execution_options().get(READONLY, False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine
