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

from orchestrator.errors import ConfigurationError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any fixed number: serializes concurrent `migrate` runs of several replicas on one PostgreSQL.
_ADVISORY_LOCK_ID = 0x504F_4D49


def alembic_config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


class SchemaTooNewError(ConfigurationError):
    """The database's schema is newer than this orchestrator's migrations."""


def known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this build's migration scripts."""
    return revision in _known_revisions()


@functools.cache
def _known_revisions() -> frozenset[str]:
    return frozenset(
        script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
    )


def head() -> str:
    """This build's head revision, as one string (several heads joined by commas)."""
    return ", ".join(sorted(head_revisions()))


def refuse_unknown(current: frozenset[str]) -> None:
    """Raise SchemaTooNewError if a revision of ``current`` is not one of this build's: the database was
    migrated by a newer orchestrator, which this one must neither migrate downward nor write to."""
    unknown = sorted(revision for revision in current if not known_revision(revision))
    if unknown:
        raise SchemaTooNewError(
            f"the database's schema is at revision {', '.join(unknown)}, newer than this orchestrator's "
            f"{head()} (head); run a newer orchestrator, or restore a backup"
        )


def _upgrade(connection: sa.Connection, revision: str) -> None:
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_ADVISORY_LOCK_ID})")
    refuse_unknown(_current_revisions(connection))
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
