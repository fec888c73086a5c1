"""The live log's chunk writer (issue 22): one per server process, it stores the chunks that runners
upload to this process, those that arrive together in one transaction.

An upload hands its chunk to :meth:`ChunkWriter.store` and waits: the writer takes every chunk waiting when
it is free (at most ``max_chunks`` and ``max_bytes`` of ciphertext at a time) and stores them with one
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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator import metrics
from orchestrator.dispatch import live_logs
from orchestrator.errors import DatabaseUnavailableError, ServiceUnavailableError

log = structlog.get_logger(__name__)

#: The most chunks, and ciphertext, one transaction stores.
MAX_BATCH_CHUNKS = 256
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Deployments whose latest phase the writer remembers (the oldest are forgotten first).
KNOWN_PHASES = 10_000


@dataclass(frozen=True, slots=True)
class _Waiting:
    upload: live_logs.ChunkUpload
    answer: asyncio.Future[bool]


class ChunkWriter:
    """See the module docstring. :meth:`close` stores what waits and ends the writer's task."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        on_stored: Callable[[Sequence[live_logs.StoredChunk]], None] | None = None,
        max_chunks: int = MAX_BATCH_CHUNKS,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self._engine = engine
        self._on_stored = on_stored
        self._max_chunks = max_chunks
        self._max_bytes = max_bytes
        self._waiting: deque[_Waiting] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: The latest phase of the deployments whose chunks were stored here, as committed: a chunk of that
        #: phase reads no phase (``live_logs.receive_chunks``).
        self._phases: dict[uuid.UUID, str] = {}
        #: Transactions committed and chunks they stored (for tests and the benchmark's notes).
        self.batches = 0
        self.largest_batch = 0

    async def store(self, upload: live_logs.ChunkUpload) -> bool:
        """Store ``upload`` (with the chunks waiting beside it); True if stored now, False for a repeat of
        the stored bytes. Raises what ``live_logs.receive_chunks`` answers for it (ConflictError,
        GoneError), or what the transaction raised (DatabaseUnavailableError: the runner sends it again).
        Returns only once the chunk is committed."""
        if self._closed:
            raise ServiceUnavailableError("the server is stopping: send the chunk again")
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(upload, answer))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="log-chunk-writer")
        self._wake.set()
        # A cancelled upload (its runner hung up) cancels its answer; the chunk may be stored all the same,
        # which its retry finds (a repeat).
        return await answer

    async def close(self) -> None:
        """Store what waits, then end the writer's task; later uploads are refused (503)."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        try:
            while True:
                batch = self._take()
                if batch:
                    await self._write(batch)
                    continue
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            # Cancelled (the loop ends) or a bug: no upload waits for an answer that will never come.
            for waiting in self._waiting:
                if not waiting.answer.done():
                    waiting.answer.set_exception(
                        ServiceUnavailableError("the chunk was not stored: send it again")
                    )
            self._waiting.clear()

    def _take(self) -> list[_Waiting]:
        """The chunks waiting, first come first, up to the bounds (always one); those whose upload gave
        up are left out."""
        batch: list[_Waiting] = []
        size = 0
        while self._waiting and len(batch) < self._max_chunks:
            waiting = self._waiting[0]
            if waiting.answer.done():
                self._waiting.popleft()
                continue
            size += len(waiting.upload.ciphertext)
            if batch and size > self._max_bytes:
                break
            batch.append(self._waiting.popleft())
        return batch

    async def _write(self, batch: list[_Waiting]) -> None:
        started = time.monotonic()
        try:
            async with self._engine.begin() as conn:
                received = await live_logs.receive_chunks(
                    conn, [w.upload for w in batch], known_phases=self._phases
                )
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
