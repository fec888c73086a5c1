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


async def test_migration_0013__state_versions_written_before_get_who_wrote_them(database_url: str) -> None:
    """0013 describes the state versions kept before: who wrote them (their deployment's creator) in SQL;
    serial, lineage and resources stay NULL (the documents are sealed; the API reads them when answering)."""
    import uuid
    from datetime import UTC, datetime

    from alembic import command

    from orchestrator.store.schema import deployments

    def downgrade(connection: sa.Connection) -> None:
        command.downgrade(migrate.alembic_config(connection), "0012")

    engine = db.create_engine(database_url)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    deployment_id, env_uuid = uuid.uuid4(), uuid.uuid4()
    try:
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.run_sync(downgrade)
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("INSERT INTO orgs VALUES ('o', :u, 'active', 'x', :t, :t)"), _org_params()
            )
            await conn.execute(
                deployments.insert().values(
                    id=deployment_id,
                    org_id="o",
                    project_id="p",
                    env_id="e",
                    env_uuid=env_uuid,
                    runner_id="r",
                    mode="deploy",
                    plan_only=False,
                    status="succeeded",
                    status_message="",
                    manifest={},
                    tf="",
                    graph=[],
                    bundle_key="b",
                    runner_log_level="info",
                    request_digest="0" * 64,
                    created_by="token-1",
                    created_at=now,
                    updated_at=now,
                    metrics={},
                    dispatch_state="done",
                    dispatch_attempts=1,
                    timeout_at=now,
                )
            )
            for version, written_by in ((1, deployment_id), (2, None)):
                await conn.execute(
                    sa.text(
                        "INSERT INTO tf_states (env_uuid, version, org_id, data, md5, size, deployment_id,"
                        " created_at) VALUES (:env, :version, 'o', 'sealed', :md5, 6, :deployment, :t)"
                    ).bindparams(
                        sa.bindparam("env", type_=sa.Uuid()), sa.bindparam("deployment", type_=sa.Uuid())
                    ),
                    {
                        "env": env_uuid,
                        "version": version,
                        "md5": "0" * 32,
                        "deployment": written_by,
                        "t": now,
                    },
                )
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT version, created_by, kind, serial, lineage, resources FROM tf_states"
                        " ORDER BY version"
                    )
                )
            ).all()
    finally:
        await engine.dispose()

    assert [(1, "token-1", "terraform", None, None, None), (2, None, "terraform", None, None, None)] == [
        tuple(row) for row in rows
    ]


async def test_migration_0014__deployments_kept_get_the_phases_their_rows_tell(database_url: str) -> None:
    """0014 adds the live log (chunks, phases); the deployments kept so far get ``queued`` when created and
    ``launching`` when launched, if they were; a downgrade drops both tables again."""
    import uuid
    from datetime import UTC, datetime, timedelta

    from alembic import command

    from orchestrator.store.schema import deployments

    def downgrade(connection: sa.Connection) -> None:
        command.downgrade(migrate.alembic_config(connection), "0013")

    engine = db.create_engine(database_url)
    created = datetime(2026, 1, 1, tzinfo=UTC)
    launched = created + timedelta(seconds=3)
    ran, never = uuid.uuid4(), uuid.uuid4()
    try:
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.run_sync(downgrade)
            tables = await conn.run_sync(lambda sync: set(sa.inspect(sync).get_table_names()))
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("INSERT INTO orgs VALUES ('o', :u, 'active', 'x', :t, :t)"), _org_params()
            )
            for deployment_id, launched_at in ((ran, launched), (never, None)):
                await conn.execute(
                    deployments.insert().values(
                        id=deployment_id,
                        org_id="o",
                        project_id="p",
                        env_id="e",
                        env_uuid=uuid.uuid4(),
                        runner_id="r",
                        mode="deploy",
                        plan_only=False,
                        status="failed",
                        status_message="",
                        manifest={},
                        tf="",
                        graph=[],
                        bundle_key="b",
                        runner_log_level="info",
                        request_digest="0" * 64,
                        created_by="token-1",
                        created_at=created,
                        updated_at=created,
                        launched_at=launched_at,
                        metrics={},
                        dispatch_state="done",
                        dispatch_attempts=1,
                        timeout_at=created,
                    )
                )
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT deployment_id, position, org_id, phase FROM deployment_phases"
                        " ORDER BY phase DESC, position"
                    )
                )
            ).all()
            from orchestrator.store import phases

            ran_phases = await phases.of(conn, ran)
    finally:
        await engine.dispose()

    assert not {"deployment_log_chunks", "deployment_phases"} & tables
    assert sorted([(ran.hex, 1, "queued"), (never.hex, 1, "queued"), (ran.hex, 2, "launching")]) == sorted(
        (uuid.UUID(str(row[0])).hex, row[1], row[3]) for row in rows
    )
    assert [("queued", created), ("launching", launched)] == [(p.phase, p.started_at) for p in ran_phases]
