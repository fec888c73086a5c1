"""Engine creation: the one place that knows SQLite from PostgreSQL connection details."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

READONLY = "po_readonly"


def readonly(engine: AsyncEngine) -> AsyncEngine:
    """The same engine (and pool) for transactions that only read.

    On SQLite their transactions begin DEFERRED, so readers never queue behind writers; every other
    transaction begins IMMEDIATE, taking the write lock at once (no lock-upgrade deadlocks).
    """
    return engine.execution_options(**{READONLY: True})


def is_sqlite(url: str) -> bool:
    return sa.make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine; SQLite gets foreign keys, WAL and a busy timeout on every connection."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": 30})

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
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
