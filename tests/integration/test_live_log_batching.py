"""The live log under many streams (issue 22), on both databases: chunks uploaded together are stored in one
transaction and none is answered before it is committed (``dispatch.log_writer``); one poll per server
process tells all its followers where their logs stand, and a chunk stored here wakes them at once
(``dispatch.log_followers``); followers of another replica get its chunks.

Several executing deployments (one environment each) are written to the store; the test plays their
runners (chunks encrypted to each deployment's logs recipient, ``PUT`` with its token) and follows them
through a real HTTP server in the test's event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.protocol import log_stream
from orchestrator.protocol import results as protocol
from orchestrator.protocol.log_stream import Phase
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store.schema import deployment_log_chunks, deployments
from tests.support.deployments import insert_deployment
from tests.support.live_chunks import EVENT_WAIT_SECONDS, Follower, Live
from tests.support.live_server import serve_in_loop
from tests.support.orgs import Org
from tests.support.runners import RUNNER

#: Deployments streaming at once.
STREAMS = 8


@pytest.fixture
async def streams(app: FastAPI, org: Org) -> AsyncIterator[list[Live]]:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    await org.platform.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    made = []
    for n in range(STREAMS):
        env = (
            await org.admin.post(
                f"{base}/projects/shop/envs", json={"id": f"dev{n}", "env_type_id": "development"}
            )
        ).json()
        live = Live(app, org, env, await insert_deployment(app, org.id, env, status="executing"))
        await live.set_row(encrypted_logs_recipient=live.recipient, logs_key=None)
        made.append(live)
    yield made
    for live in made:
        await live.gateway.aclose()


@pytest.fixture
async def follow(app: FastAPI, org: Org) -> AsyncIterator[Any]:
    """``await follow(live)``: a follower of ``live``'s deployment (viewer), through a real HTTP server."""
    async with serve_in_loop(app) as url:
        token = org.clients["viewer"].headers["Authorization"]
        client = httpx.AsyncClient(base_url=url, headers={"Authorization": token}, timeout=EVENT_WAIT_SECONDS)
        tasks: list[asyncio.Task[None]] = []
        responses: list[httpx.Response] = []

        async def start(live: Live) -> Follower:
            request = client.build_request("GET", live.logs_url(), params={"follow": "true"})
            response = await client.send(request, stream=True)
            assert 200 == response.status_code
            responses.append(response)
            follower = Follower(response)
            tasks.append(asyncio.create_task(follower.read()))
            return follower

        yield start
        for task in tasks:
            task.cancel()
        for response in responses:
            await response.aclose()
        await client.aclose()


@asynccontextmanager
async def _writer_blocked(app: FastAPI) -> AsyncIterator[AsyncConnection]:
    """A transaction that keeps the chunk writer from committing until it ends: on SQLite it holds the one
    writer connection, on PostgreSQL a lock on the chunks' table that every insert waits for."""
    engine = app.state.services.engine
    async with engine.begin() as conn:
        if engine.dialect.name != "sqlite":
            await conn.execute(sa.text("LOCK TABLE deployment_log_chunks IN EXCLUSIVE MODE"))
        yield conn


async def _stored(app: FastAPI) -> set[tuple[str, int]]:
    async with app.state.services.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(deployment_log_chunks.c.deployment_id, deployment_log_chunks.c.seq)
        )
        return {(str(row.deployment_id), row.seq) for row in rows}


async def test_writer__chunks_that_wait_together_are_stored_in_one_transaction_answered_once_committed(
    app: FastAPI, streams: list[Live]
) -> None:
    writer = app.state.services.log_writer
    before = writer.batches
    async with _writer_blocked(app):
        uploads = [
            asyncio.create_task(live.put(1, f"line of {n}\n", Phase.INIT)) for n, live in enumerate(streams)
        ]
        await asyncio.sleep(0.5)  # every upload has reached the writer (or would have been answered)
        answered_while_blocked = [task for task in uploads if task.done()]
        stored_while_blocked = (
            await _stored(app) if app.state.services.engine.dialect.name != "sqlite" else set()
        )
    answers = await asyncio.gather(*uploads)

    assert [] == answered_while_blocked, "a chunk is never answered before its transaction committed"
    assert set() == stored_while_blocked
    assert [202] * STREAMS == [answer.status_code for answer in answers]
    assert {(live.deployment_id, 1) for live in streams} == await _stored(app)
    # The first uploads' transactions waited (one on SQLite, a few at once on PostgreSQL); the others,
    # which came while they waited, went together.
    assert writer.batches - before <= writer.concurrency + 1 < STREAMS
    pages = [(await live.page()).json() for live in streams]
    assert [[f"line of {n}\n"] for n in range(STREAMS)] == [
        [live.decrypt(item).text for item in page["items"]] for live, page in zip(streams, pages, strict=True)
    ]


async def test_writer__in_one_batch_repeats_conflicts_and_phases_are_each_uploads_own(
    app: FastAPI, streams: list[Live]
) -> None:
    first, second = streams[0], streams[1]
    body = first.body(1, "stored once\n", Phase.INIT)
    async with _writer_blocked(app):
        uploads = [
            asyncio.create_task(first.put(1, body=body, phase=Phase.INIT)),
            asyncio.create_task(first.put(1, body=body, phase=Phase.INIT)),  # a retry beside it
            asyncio.create_task(first.put(1, "other bytes\n", Phase.INIT)),
        ]
        # Chunk 2 queued after chunk 1, as a runner sends them (a request's way through the middleware
        # to the writer's queue may overtake another's on a loaded machine).
        await asyncio.sleep(0.5)
        uploads += [
            asyncio.create_task(first.put(2, "planning\n", Phase.PLAN)),
            asyncio.create_task(first.put(3, "still planning\n", Phase.PLAN)),
            asyncio.create_task(second.put(1, "the second\n", Phase.APPLY)),
        ]
        await asyncio.sleep(0.5)
    answers = [await task for task in uploads]
    phases = [
        [
            p["phase"]
            for p in (
                await live.org.clients["viewer"].get(f"/orgs/{live.org.id}/deployments/{live.deployment_id}")
            ).json()["phases"]
        ]
        for live in (first, second)
    ]

    items = (await first.page()).json()["items"]
    assert [1, 2, 3] == [item["seq"] for item in items]
    # Whichever bytes of chunk 1 came first are stored; the same bytes again are a repeat, the others 409.
    same = items[0]["ciphertext"] == body
    assert [202 if same else 409] * 2 + [409 if same else 202] == [a.status_code for a in answers[:3]]
    assert "stored with other bytes" in answers[2 if same else 0].json()["message"]
    assert [202, 202, 202] == [answer.status_code for answer in answers[3:]]
    assert [["init", "plan"], ["apply"]] == phases


async def test_followers__one_poll_for_all_a_local_chunk_wakes_its_followers_without_one(
    app: FastAPI, streams: list[Live], follow: Any
) -> None:
    hub = app.state.services.log_followers
    followers = [await follow(live) for live in streams]
    for _ in range(int(EVENT_WAIT_SECONDS / 0.05)):  # every follower connected and waiting
        if hub.followed == STREAMS:
            break
        await asyncio.sleep(0.05)
    assert STREAMS == hub.followed
    polls, served = hub.polls, hub.recent_served
    await asyncio.sleep(1.2)  # a few poll intervals with every follower waiting
    idle_polls = hub.polls - polls

    for seq in (1, 2, 3):
        await asyncio.gather(*(live.put(seq, f"{live.deployment_id} {seq}\n") for live in streams))
        for follower in followers:
            await follower.until(lambda f, seq=seq: f.chunks()[-1:] == [seq])

    # One poll per interval for all eight followers (not one per follower): a few, never eight per interval.
    assert 1 <= idle_polls <= 4
    # The chunks stored here reached their followers from the hub, not read back (each at most once).
    assert 0 < hub.recent_served - served <= 3 * STREAMS
    for live, follower in zip(streams, followers, strict=True):
        assert [1, 2, 3] == follower.chunks()
        texts = [live.decrypt(e.data).text for e in follower.named(log_stream.SSE_CHUNK)]
        assert [f"{live.deployment_id} {seq}\n" for seq in (1, 2, 3)] == texts


async def test_followers__of_another_replica_get_its_chunks_and_the_end(
    app: FastAPI, streams: list[Live], follow: Any, settings: ServerSettings
) -> None:
    """Replicas share only the database: the other replica's writer stores the chunks, this replica's hub
    finds them at its next poll and wakes every follower of them."""
    followers = [await follow(live) for live in streams[:4]]
    other = create_app(settings)
    async with other.router.lifespan_context(other):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=other), base_url="http://b"
        ) as replica:

            async def put(live: Live, seq: int) -> int:
                answer = await replica.put(
                    live.path(seq),
                    content=live.body(seq, f"from the other replica {seq}\n"),
                    headers={protocol.DEPLOYMENT_TOKEN_HEADER: live.token(), log_stream.PHASE_HEADER: "plan"},
                )
                return answer.status_code

            statuses = await asyncio.gather(*(put(live, seq) for live in streams[:4] for seq in (1, 2)))
            for follower in followers:
                await follower.until(lambda f: f.chunks() == [1, 2])
            for live in streams[:4]:
                await live.whole_log("...")
                ended = await replica.post(
                    protocol.results_path(live.org.id, "vm1", live.deployment_id),
                    json={"status": "success"},
                    headers={protocol.DEPLOYMENT_TOKEN_HEADER: live.token()},
                )
                assert 202 == ended.status_code, ended.text
            for follower in followers:
                await follower.until(lambda f: f.closed)

    assert [202] * 8 == statuses
    for live, follower in zip(streams[:4], followers, strict=True):
        texts = [live.decrypt(e.data).text for e in follower.named(log_stream.SSE_CHUNK)]
        assert ["from the other replica 1\n", "from the other replica 2\n"] == texts
        assert log_stream.SSE_END == follower.events[-1].name
        assert {"status": "succeeded", "last_seq": 2} == {
            k: follower.events[-1].data[k] for k in ("status", "last_seq")
        }


async def test_writer__a_chunk_of_a_deployment_gone_meanwhile_fails_alone(
    app: FastAPI, streams: list[Live]
) -> None:
    """A batch that fails is written again one chunk at a time: the other chunks of the batch are stored, and
    the chunk of a deployment deleted after its upload was authorized is answered 404, not 500."""
    gone, kept = streams[0], streams[1]
    async with _writer_blocked(app) as conn:
        uploads = [
            asyncio.create_task(kept.put(1, "kept\n")),
            asyncio.create_task(gone.put(1, "gone\n")),
            asyncio.create_task(kept.put(2, "kept too\n")),
        ]
        await asyncio.sleep(0.5)  # authorized, and waiting for the writer
        await conn.execute(deployments.delete().where(deployments.c.id == uuid.UUID(gone.deployment_id)))
    answers = [await task for task in uploads]

    assert [202, 404, 202] == [answer.status_code for answer in answers]
    assert f"deployment '{gone.deployment_id}'" in answers[1].json()["message"]
    assert {(kept.deployment_id, 1), (kept.deployment_id, 2)} == await _stored(app)
