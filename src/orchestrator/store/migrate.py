"""Schema migrations with Alembic, run programmatically (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine

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
