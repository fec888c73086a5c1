"""The Alembic migrations replay to exactly the schema the code declares."""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.store import db, migrate
from orchestrator.store.schema import metadata


def _diff(connection: sa.Connection) -> list[object]:
    context = MigrationContext.configure(connection)
    with warnings.catch_warnings():
        # SQLite cannot reflect expression indexes; the next test checks that one by behaviour.
        warnings.filterwarnings("ignore", message=".*expression-based index.*")
        return list(compare_metadata(context, metadata))


async def test_migrations__match_schema(database_url: str) -> None:
    engine = db.create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            diff = await conn.run_sync(_diff)
    finally:
        await engine.dispose()

    assert [] == diff


async def test_migrations__rerun_is_a_noop_and_rule_uniqueness_holds_with_nulls(database_url: str) -> None:
    engine = db.create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("INSERT INTO orgs VALUES ('o', :u, 'active', 'x', :t, :t)"), _org_params()
            )
            await conn.execute(
                sa.text(
                    "INSERT INTO runners (org_id, id, type, configuration, state_type, state_configuration,"
                    " created_at, updated_at) VALUES ('o', 'r', 'vm', '{}', 'orchestrator', '{}', :t, :t)"
                ),
                {"t": _org_params()["t"]},
            )
        inserted = 0
        # Both databases take a UUID as 32 hex digits.
        for rule_id in ("00000000000000000000000000000001", "00000000000000000000000000000002"):
            try:
                async with engine.begin() as conn:
                    await conn.execute(
                        sa.text(
                            "INSERT INTO runner_rules (org_id, id, runner_id, created_at)"
                            " VALUES ('o', :id, 'r', :t)"
                        ),
                        {"id": rule_id, "t": _org_params()["t"]},
                    )
                inserted += 1
            except sa.exc.IntegrityError:
                pass
    finally:
        await engine.dispose()

    assert 1 == inserted


def _org_params() -> dict[str, object]:
    import uuid
    from datetime import UTC, datetime

    return {"u": uuid.uuid4().hex, "t": datetime(2026, 1, 1, tzinfo=UTC)}
