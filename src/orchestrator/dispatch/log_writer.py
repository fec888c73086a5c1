"""The live log's chunk writer (issue 22): one per server process, it stores the chunks that runners
upload to this process, those that arrive together in one transaction.

An upload hands its chunk to :meth:`ChunkWriter.store` and waits: a writer takes every chunk waiting when
it is free (at most ``max_chunks`` and ``max_bytes`` of ciphertext at a time; ``concurrency`` writers at
once) and stores them with one
transaction (``live_logs.receive_chunks``: one insert; a read of the latest phases and an insert of the
phases they change only for chunks of another phase than the writer last committed for their deployment),
instead of a transaction of four round trips per chunk. A chunk alone is written at
once: batches form only while the writer is busy (on SQLite, waiting for the one writer connection).

Nothing is acknowledged before it is committed: ``store`` returns after the transaction holding the chunk
committed, and the gateway answers 202 only then. A process that dies with chunks waiting (or in a
transaction) answers none of them; their runners send them again (to this process restarted, or to
another replica), and a chunk stored once is a repeat (202, stored once) from then on.

A batch that fails with anything but an unavailable database is written again one chunk at a time, so that
one chunk's fault (its deployment deleted meanwhile) is its upload's answer alone. After a commit the
writer tells ``on_stored`` (the followers' hub) which chunks were stored, before their uploads return.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestrator import metrics
from orchestrator.dispatch import live_logs
from orchestrator.errors import DatabaseUnavailableError, ServiceUnavailableError

log = structlog.get_logger(__name__)

#: The most chunks, and ciphertext, one transaction stores.
MAX_BATCH_CHUNKS = 256
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Deployments whose latest phase the writer remembers (the oldest are forgotten first).
KNOWN_PHASES = 10_000
#: Chunk transactions at once on PostgreSQL (SQLite: one, its one writer connection).
POSTGRESQL_WRITERS = 4


def concurrency_for(engine: AsyncEngine) -> int:
    """How many chunk transactions the writer runs at once on ``engine``'s database."""
    return 1 if engine.dialect.name == "sqlite" else POSTGRESQL_WRITERS


@dataclass(frozen=True, slots=True)
class _Waiting:
    upload: live_logs.ChunkUpload
    answer: asyncio.Future[bool]


class ChunkWriter:
    """See the module docstring. ``concurrency``: transactions at once (1 on SQLite, whose writer is one
    connection; more on PostgreSQL, where a transaction's round trips would otherwise set the pace).
    :meth:`close` stores what waits and ends the writer's transactions."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        on_stored: Callable[[Sequence[live_logs.StoredChunk]], None] | None = None,
        max_chunks: int = MAX_BATCH_CHUNKS,
        max_bytes: int = MAX_BATCH_BYTES,
        concurrency: int = 1,
    ) -> None:
        self._engine = engine
        self._on_stored = on_stored
        self._max_chunks = max_chunks
        self._max_bytes = max_bytes
        self._waiting: deque[_Waiting] = deque()
        self._concurrency = concurrency
        self._tasks: set[asyncio.Task[None]] = set()
        #: The deployments of the chunks being stored now (by how many of them).
        self._writing: Counter[uuid.UUID] = Counter()
        self._closed = False
        #: The latest phase of the deployments whose chunks were stored here, as committed: a chunk of that
        #: phase reads no phase (``live_logs.receive_chunks``).
        self._phases: dict[uuid.UUID, str] = {}
        #: Transactions committed and chunks they stored (for tests and the benchmark's notes).
        self.batches = 0
        self.largest_batch = 0

    @property
    def concurrency(self) -> int:
        """Transactions at once."""
        return self._concurrency

    async def store(self, upload: live_logs.ChunkUpload) -> bool:
        """Store ``upload`` (with the chunks waiting beside it); True if stored now, False for a repeat of
        the stored bytes. Raises what ``live_logs.receive_chunks`` answers for it (ConflictError,
        GoneError), or what the transaction raised (DatabaseUnavailableError: the runner sends it again).
        Returns only once the chunk is committed."""
        if self._closed:
            raise ServiceUnavailableError("the server is stopping: send the chunk again")
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(upload, answer))
        if len(self._tasks) < self._concurrency:
            task = asyncio.create_task(self._run(), name="log-chunk-writer")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A cancelled upload (its runner hung up) cancels its answer; the chunk may be stored all the same,
        # which its retry finds (a repeat).
        return await answer

    async def close(self) -> None:
        """Store what waits, then end the writer's transactions; later uploads are refused (503)."""
        self._closed = True
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        """Write batches while chunks wait; then end (``store`` starts a writer again)."""
        try:
            while batch := self._take():
                try:
                    await self._write(batch)
                finally:
                    self._done(batch)
        finally:
            # At once, not in a done callback: an upload that comes next must start a writer.
            self._tasks.discard(asyncio.current_task())
            if self._waiting and not self._tasks:
                # Cancelled (the loop ends) or a bug, and no other writer: no upload waits for an answer
                # that will never come.
                for waiting in self._waiting:
                    if not waiting.answer.done():
                        waiting.answer.set_exception(
                            ServiceUnavailableError("the chunk was not stored: send it again")
                        )
                self._waiting.clear()

    def _take(self) -> list[_Waiting]:
        """The chunks waiting, first come first, up to the bounds (always one); those whose upload gave
        up are left out, and those of a deployment another writer is storing wait for it (one runner's
        chunks are stored in order, and its phases too)."""
        batch: list[_Waiting] = []
        held: list[_Waiting] = []
        size = 0
        while self._waiting and len(batch) < self._max_chunks:
            waiting = self._waiting.popleft()
            if waiting.answer.done():
                continue
            if waiting.upload.deployment.id in self._writing:
                held.append(waiting)
                continue
            if batch and size + len(waiting.upload.ciphertext) > self._max_bytes:
                self._waiting.appendleft(waiting)
                break
            size += len(waiting.upload.ciphertext)
            batch.append(waiting)
        self._waiting.extendleft(reversed(held))
        for waiting in batch:
            self._writing[waiting.upload.deployment.id] += 1
        return batch

    def _done(self, batch: list[_Waiting]) -> None:
        for waiting in batch:
            deployment_id = waiting.upload.deployment.id
            self._writing[deployment_id] -= 1
            if self._writing[deployment_id] <= 0:
                del self._writing[deployment_id]

    async def _write(self, batch: list[_Waiting]) -> None:
        started = time.monotonic()
        uploads = [w.upload for w in batch]
        try:
            async with self._transaction(uploads) as conn:
                received = await live_logs.receive_chunks(conn, uploads, known_phases=self._phases)
        except DatabaseUnavailableError as exc:
            self._answer_all(batch, exc)
            return
        except Exception as exc:
            if len(batch) > 1:
                # One chunk's fault must not be the others': each alone.
                for waiting in batch:
                    await self._write([waiting])
                return
            self._answer_all(batch, exc)
            return
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        metrics.LOG_CHUNK_WRITE_DURATION.observe(time.monotonic() - started)
        metrics.LOG_CHUNK_BATCH_SIZE.observe(len(batch))
        self._remember(received.latest_phases)
        if received.stored and self._on_stored is not None:
            try:
                self._on_stored(received.stored)
            except Exception:  # the chunks are stored: followers find them at their next look
                log.exception("log_chunk_followers_not_told")
        for waiting, outcome in zip(batch, received.outcomes, strict=True):
            if waiting.answer.done():
                continue
            if isinstance(outcome, bool):
                waiting.answer.set_result(outcome)
            else:
                waiting.answer.set_exception(outcome)

    @asynccontextmanager
    async def _transaction(self, uploads: list[live_logs.ChunkUpload]) -> AsyncIterator[AsyncConnection]:
        """A transaction for ``uploads``; on PostgreSQL none when they need one statement only (an insert,
        committed on its own: no ``BEGIN`` and ``COMMIT`` round trips), which is the case of every batch of
        chunks of a running deployment whose phase is the one last committed here."""
        if self._engine.dialect.name == "sqlite" or live_logs.needs_transaction(uploads, self._phases):
            async with self._engine.begin() as conn:
                yield conn
            return
        async with self._engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    def _remember(self, phases: dict[uuid.UUID, str]) -> None:
        for deployment_id, phase in phases.items():
            self._phases.pop(deployment_id, None)
            self._phases[deployment_id] = phase
        while len(self._phases) > KNOWN_PHASES:
            del self._phases[next(iter(self._phases))]

    @staticmethod
    def _answer_all(batch: list[_Waiting], exc: BaseException) -> None:
        for waiting in batch:
            if not waiting.answer.done():
                waiting.answer.set_exception(exc)
