"""Schema migrations with Alembic, run programmatically (no alembic.ini needed)."""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any fixed number: serializes concurrent `migrate` runs of several replicas on one PostgreSQL.
_ADVISORY_LOCK_ID = 0x504F_4D49


def alembic_config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: sa.Connection, revision: str) -> None:
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK_ID})")
    command.upgrade(alembic_config(connection), revision)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database schema to ``revision``; safe to run concurrently."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade, revision)


@functools.cache
def head_revisions() -> frozenset[str]:
    """The revisions this code's migrations end at (read from the migration scripts once)."""
    return frozenset(ScriptDirectory.from_config(alembic_config()).get_heads())


def _current_revisions(connection: sa.Connection) -> frozenset[str]:
    return frozenset(MigrationContext.configure(connection).get_current_heads())


async def current_revisions(conn: AsyncConnection) -> frozenset[str]:
    """The revisions the database's schema is at (empty: never migrated)."""
    return await conn.run_sync(_current_revisions)
