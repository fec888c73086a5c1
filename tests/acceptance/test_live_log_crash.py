"""A server killed while log chunks wait to be stored (issue 22), on both databases: no chunk it acknowledged
(202) is lost, and the runner's stream sends the others again to the restarted server: in the end every
chunk is stored once, in order.

A real ``orchestrator serve`` (``kill -9``, then started again on its port) and the runner's own
``LogStream`` and ``GatewayClient``. The deployment runs on an agent runner whose agent never comes, so it
stays executing; the test writes the run's log lines. The chunk writer is held up by a transaction of the
test's own (SQLite: the write lock; PostgreSQL: a lock on the chunks' table), so that chunks are waiting in
the server when it is killed.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from orchestrator.client.gateway import RunnerGateway
from orchestrator.client.http import Backoff
from orchestrator.protocol import age, log_stream
from orchestrator.runner import logs
from orchestrator.runner.gateway_client import GatewayClient
from orchestrator.runner.log_stream import LogStream
from orchestrator.store import db
from orchestrator.store.schema import deployment_log_chunks
from tests.support.held_deployment import agent_stack, create_held_deployment
from tests.support.outages import ServerProcess, wait_for

pytestmark = pytest.mark.slow

WAIT_SECONDS = 60


@contextmanager
def writer_held(database_url: str) -> Iterator[None]:
    """A transaction in a thread of its own, open for the block: every chunk insert waits for it."""
    acquired, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    async def hold() -> None:
        engine = db.create_engine(database_url)
        try:
            async with engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, the write lock
                if engine.dialect.name != "sqlite":
                    await conn.execute(sa.text("LOCK TABLE deployment_log_chunks IN EXCLUSIVE MODE"))
                acquired.set()
                await asyncio.to_thread(release.wait)
        finally:
            await db.dispose(engine)

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:  # reported to the test
            failure.append(exc)
            acquired.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert acquired.wait(WAIT_SECONDS)
    assert not failure, failure
    try:
        yield
    finally:
        release.set()
        thread.join(WAIT_SECONDS)


def stored_chunks(database_url: str, deployment_id: str) -> list[tuple[int, bytes]]:
    async def read() -> list[tuple[int, bytes]]:
        engine = db.create_engine(database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(
                    sa.select(deployment_log_chunks.c.seq, deployment_log_chunks.c.ciphertext)
                    .where(deployment_log_chunks.c.deployment_id == uuid.UUID(deployment_id))
                    .order_by(deployment_log_chunks.c.seq)
                )
                return [(row.seq, bytes(row.ciphertext)) for row in rows]
        finally:
            await db.dispose(engine)

    return asyncio.run(read())


def test_sigkill_with_chunks_waiting__acknowledged_ones_are_stored_the_runner_sends_the_rest_again(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path / "data")
    server.start()
    identity, recipient = age.generate_identity()
    stack = agent_stack(server.url, tmp_path)
    stream: LogStream | None = None
    gateway: GatewayClient | None = None
    try:
        held = create_held_deployment(stack, server.data_dir, recipient)
        deployment_id, env_uuid, token = held.deployment_id, held.env_uuid, held.token
        sink = logs.LogBuffer(max_bytes=1 << 20)
        gateway = GatewayClient(
            gateway=RunnerGateway(url=server.url, org_id=stack.org, runner_id="local", timeout_seconds=5),
            token=SecretStr(token),
        )
        stream = LogStream(
            gateway=gateway,
            env_uuid=env_uuid,
            deployment_id=deployment_id,
            recipient=recipient,
            log=logs.make_logger(logs.LogBuffer(max_bytes=1 << 20), level="info"),
            max_bytes=1 << 30,
            backoff=Backoff(first_seconds=0.2, max_seconds=1.0),
            flush_seconds=0.2,
        )
        stream.open(sink)
        lines = [f"before the kill {n}" for n in range(3)]
        for line in lines:
            sink.write_line(line)
            time.sleep(0.3)  # a chunk each, or so
        assert wait_for(
            lambda: stream is not None and stream.last_stored_seq >= 2, WAIT_SECONDS, "chunks stored"
        )
        with writer_held(database_url):
            for n in range(3):
                lines.append(f"while the writer is held {n}")
                sink.write_line(lines[-1])
                time.sleep(0.3)
            acknowledged = stream.last_stored_seq
            server.kill()
            acknowledged_at_kill = stream.last_stored_seq
        after_kill = stored_chunks(database_url, deployment_id)
        server.start()
        lines.append("after the restart")
        sink.write_line(lines[-1])
        stream.finish(drain_seconds=WAIT_SECONDS)
        stored = stored_chunks(database_url, deployment_id)
        delivered, last_stored = stream.stored_chunks, stream.last_stored_seq
    finally:
        if stream is not None:
            stream.close()
        if gateway is not None:
            gateway.close()
        stack.client.close()
        server.stop()

    # Nothing was acknowledged while the writer was held, and what was acknowledged before is stored. (A
    # chunk can be stored and not acknowledged: on PostgreSQL the killed server's insert, waiting for the
    # lock, may still commit once it is released; sent again, it is a repeat.)
    assert acknowledged == acknowledged_at_kill
    after_kill_seqs = [seq for seq, _ in after_kill]
    assert list(range(1, acknowledged + 1)) == after_kill_seqs[:acknowledged]
    assert list(range(1, len(after_kill_seqs) + 1)) == after_kill_seqs
    # The chunks waiting in the killed server were sent again; every chunk is stored once, in order.
    assert last_stored > acknowledged
    assert list(range(1, last_stored + 1)) == [seq for seq, _ in stored]
    assert last_stored == delivered
    texts = [
        log_stream.decrypt_chunk(
            base64.b64encode(data).decode(), identity, deployment_id=deployment_id, seq=seq
        ).text
        for seq, data in stored
    ]
    assert "".join(f"{line}\n" for line in lines) == "".join(texts)
