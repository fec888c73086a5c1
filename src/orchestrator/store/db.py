"""Engine creation: the one place that knows SQLite from PostgreSQL connection details.

It is also the edge where the drivers' errors are translated (see :func:`_translate_errors`): a database
that cannot be reached or written raises ``DatabaseUnavailableError`` (answered 503, retried by the
dispatcher), and text the database cannot hold (NUL, lone surrogates) ``InvalidInputError``; the API refuses
such text before it gets here, this is the backstop.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from orchestrator.errors import DatabaseUnavailableError, InvalidInputError

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
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
    _translate_errors(engine)
    return engine


#: PostgreSQL SQLSTATE classes of a server that cannot serve now: connection exception, insufficient
#: resources (disk full, too many connections), operator intervention (shutdown, starting up), system
#: error, invalid authorization (the credentials were changed).
_UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "53", "57", "58"})
_UNAVAILABLE_SQLSTATES = frozenset({"25006"})  # read-only SQL transaction: a hot standby
#: SQLite's messages for a database file that cannot be opened or written now.
_SQLITE_UNAVAILABLE = (
    "unable to open database file",
    "readonly database",
    "database or disk is full",
    "disk i/o error",
    "database is locked",
)


def _unavailable_reason(exc: BaseException) -> str | None:
    """Why the database cannot serve, if ``exc`` says so (a short text without addresses or secrets)."""
    if isinstance(exc, OSError):  # includes TimeoutError
        reason = os.strerror(exc.errno) if isinstance(exc.errno, int) and exc.errno > 0 else None
        return f"cannot connect ({reason or type(exc).__name__})"
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(sqlstate, str) and (
        sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or sqlstate in _UNAVAILABLE_SQLSTATES
    ):
        return first_line
    if type(exc).__module__.startswith("sqlite3") and any(
        text in first_line.lower() for text in _SQLITE_UNAVAILABLE
    ):
        return first_line
    return None


def _bad_text(exc: BaseException) -> bool:
    """The database refused a text value it cannot hold: NUL on PostgreSQL, lone surrogates anywhere."""
    text = str(exc)
    return (
        getattr(exc, "sqlstate", None) == "22021"  # character_not_in_repertoire: a NUL
        or 'encoding "UTF8": 0x00' in text
        or "surrogates not allowed" in text
    )


def _translate_errors(engine: AsyncEngine) -> None:
    @sa.event.listens_for(engine.sync_engine, "do_connect")
    def _connect(dialect: sa.Dialect, _record: Any, cargs: Any, cparams: Any) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except Exception as exc:
            reason = _unavailable_reason(exc)
            if reason is None:
                raise
            raise DatabaseUnavailableError(f"database unavailable: {reason}") from exc

    @sa.event.listens_for(engine.sync_engine, "handle_error")
    def _handle_error(context: ExceptionContext) -> None:
        if context.is_pre_ping:
            return  # the pool reconnects on its own after a failed ping
        original = context.original_exception
        reason = _unavailable_reason(original)
        if reason is None and context.is_disconnect:
            reason = "the connection was lost"
        if reason is not None:
            raise DatabaseUnavailableError(f"database unavailable: {reason}") from original
        if _bad_text(original):
            raise InvalidInputError("text must not contain NUL characters or lone surrogates") from original


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

    _translate_errors(engine)
    return engine
