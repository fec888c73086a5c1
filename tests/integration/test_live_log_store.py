"""The live log's rows (``store.log_chunks``, ``store.phases``) on both databases: chunks stored once per
number, pages bounded by count and bytes, where a log stands, phases appended on change only."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.store import db, migrate, phases
from orchestrator.store import log_chunks as chunks
from orchestrator.store.schema import deployments, orgs

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    made = db.create_engine(database_url)
    await migrate.upgrade(made)
    yield made
    await db.dispose(made)


async def _deployment(engine: AsyncEngine, org_id: str = "o", *, status: str = "executing") -> uuid.UUID:
    deployment_id = uuid.uuid4()
    async with engine.begin() as conn:
        if (await conn.execute(orgs.select().where(orgs.c.id == org_id))).first() is None:
            await conn.execute(
                orgs.insert().values(
                    id=org_id,
                    uuid=uuid.uuid4(),
                    status="active",
                    created_by="t",
                    created_at=NOW,
                    updated_at=NOW,
                )
            )
        await conn.execute(
            deployments.insert().values(
                id=deployment_id,
                org_id=org_id,
                project_id="p",
                env_id="e",
                env_uuid=uuid.uuid4(),
                runner_id="r",
                mode="deploy",
                plan_only=False,
                status=status,
                status_message="Deploying...",
                manifest={},
                tf="",
                graph=[],
                bundle_key="b",
                runner_log_level="info",
                request_digest="0" * 64,
                created_by="t",
                created_at=NOW,
                updated_at=NOW,
                metrics={},
                dispatch_state="launched",
                dispatch_attempts=1,
                timeout_at=NOW + timedelta(hours=1),
            )
        )
    return deployment_id


async def _put(engine: AsyncEngine, deployment_id: uuid.UUID, seq: int, data: bytes, **kw: object) -> bool:
    async with engine.begin() as conn:
        return await chunks.insert(
            conn,
            deployment_id=deployment_id,
            org_id="o",
            seq=seq,
            phase=str(kw.get("phase", "plan")),
            ciphertext=data,
            now=kw.get("now", NOW),  # type: ignore[arg-type]
        )


async def test_chunks__stored_once_per_number_as_bytes(engine: AsyncEngine) -> None:
    deployment_id = await _deployment(engine)
    other = await _deployment(engine)

    first = await _put(engine, deployment_id, 1, b"\x00first\xff")
    again = await _put(engine, deployment_id, 1, b"other bytes")
    elsewhere = await _put(engine, other, 1, b"another deployment's")
    async with engine.connect() as conn:
        stored = await chunks.ciphertext_of(conn, deployment_id, 1)
        missing = await chunks.ciphertext_of(conn, deployment_id, 2)

    assert (True, False, True) == (first, again, elsewhere)
    assert (b"\x00first\xff", None) == (stored, missing)


async def test_chunks__a_page_is_bounded_by_count_and_bytes_but_holds_one_chunk(engine: AsyncEngine) -> None:
    deployment_id = await _deployment(engine)
    for seq in range(1, 8):
        await _put(engine, deployment_id, seq, bytes([seq]) * 100, phase="apply" if seq > 4 else "plan")

    async with engine.connect() as conn:
        by_count = await chunks.page(conn, deployment_id, after=2, limit=3, max_bytes=10_000)
        by_bytes = await chunks.page(conn, deployment_id, after=0, limit=100, max_bytes=250)
        one_over = await chunks.page(conn, deployment_id, after=0, limit=100, max_bytes=10)
        past_the_end = await chunks.page(conn, deployment_id, after=7, limit=100, max_bytes=10_000)

    assert [3, 4, 5] == [c.seq for c in by_count]
    assert ["plan", "plan", "apply"] == [c.phase for c in by_count]
    assert bytes([5]) * 100 == by_count[2].ciphertext
    assert [1, 2] == [c.seq for c in by_bytes]
    assert [1] == [c.seq for c in one_over]
    assert [] == past_the_end
    assert all(c.received_at == NOW for c in by_count)


async def test_chunks__progress_tells_a_follower_where_the_log_stands(engine: AsyncEngine) -> None:
    deployment_id = await _deployment(engine)
    async with engine.connect() as conn:
        empty = await chunks.progress(conn, "o", deployment_id)
        foreign = await chunks.progress(conn, "other-org", deployment_id)
    later = NOW + timedelta(seconds=3)
    await _put(engine, deployment_id, 1, b"a")
    await _put(engine, deployment_id, 2, b"b", now=later)
    async with engine.begin() as conn:
        await phases.append(conn, deployment_id=deployment_id, org_id="o", phase="queued", now=NOW)
        await phases.append(conn, deployment_id=deployment_id, org_id="o", phase="plan", now=later)
    async with engine.connect() as conn:
        found = await chunks.progress(conn, "o", deployment_id)

    assert empty is not None
    assert (0, None, 0, False) == (empty.last_seq, empty.last_received_at, empty.phases, empty.has_whole_log)
    assert foreign is None
    assert found is not None
    assert (2, later, 2) == (found.last_seq, found.last_received_at, found.phases)
    assert ("executing", None) == (found.status, found.objects_deleted_at)
    assert found.last_received_at is not None and found.last_received_at.tzinfo is not None


async def test_chunks__deleted_for_one_deployment_only(engine: AsyncEngine) -> None:
    deployment_id, other = await _deployment(engine), await _deployment(engine)
    for seq in (1, 2):
        await _put(engine, deployment_id, seq, b"x")
    await _put(engine, other, 1, b"y")

    async with engine.begin() as conn:
        deleted = await chunks.delete_for(conn, deployment_id)
    async with engine.connect() as conn:
        left = await chunks.page(conn, deployment_id, after=0, limit=10, max_bytes=100)
        kept = await chunks.page(conn, other, after=0, limit=10, max_bytes=100)

    assert (2, [], [1]) == (deleted, left, [c.seq for c in kept])


async def test_phases__appended_on_change_only_and_read_in_order(engine: AsyncEngine) -> None:
    deployment_id, other = await _deployment(engine), await _deployment(engine)
    recorded = []
    async with engine.begin() as conn:
        for minute, phase in enumerate(["queued", "launching", "launching", "init", "plan", "plan", "apply"]):
            recorded.append(
                await phases.append(
                    conn,
                    deployment_id=deployment_id,
                    org_id="o",
                    phase=phase,
                    now=NOW + timedelta(minutes=minute),
                )
            )
        await phases.append(conn, deployment_id=other, org_id="o", phase="queued", now=NOW)
    async with engine.connect() as conn:
        found = await phases.of(conn, deployment_id)
        latest = await phases.latest(conn, deployment_id)
        many = await phases.of_many(conn, [deployment_id, other, uuid.uuid4()])
        none = await phases.latest(conn, uuid.uuid4())

    assert [True, True, False, True, True, False, True] == recorded
    assert ["queued", "launching", "init", "plan", "apply"] == [p.phase for p in found]
    assert [NOW + timedelta(minutes=m) for m in (0, 1, 3, 4, 6)] == [p.started_at for p in found]
    assert ("apply", None) == (latest, none)
    assert {deployment_id: found, other: [phases.PhaseStart(phase="queued", started_at=NOW)]} == many


async def test_rows__go_with_their_deployment(engine: AsyncEngine) -> None:
    deployment_id = await _deployment(engine)
    await _put(engine, deployment_id, 1, b"x")
    async with engine.begin() as conn:
        await phases.append(conn, deployment_id=deployment_id, org_id="o", phase="queued", now=NOW)
        await conn.execute(deployments.delete().where(deployments.c.id == deployment_id))
    async with engine.connect() as conn:
        left = await chunks.page(conn, deployment_id, after=0, limit=10, max_bytes=100)
        found = await phases.of(conn, deployment_id)

    assert ([], []) == (left, found)
