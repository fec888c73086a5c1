"""Where each followed live log stands, for all the followers of one server process (issue 22).

A follower (``api.deployment_logs``) does not read its deployment's progress itself: the hub keeps the
``store.log_chunks.Progress`` of every deployment followed here and wakes its followers (the notifier's
``live_logs.follow_key``) when it moves:

- at once when this process stores a chunk (``stored``, told by ``log_writer.ChunkWriter`` after the
  commit): no database read;
- at one poll for all, every ``poll_seconds`` while anyone follows: one statement reads the progress of
  every followed deployment (chunks other replicas stored, the deployment's end, its whole log); followers
  of a deployment whose progress changed are woken, and those of an ended deployment at every poll (their
  follow ends some seconds after the end: ``live_logs.follow_ended``);
- ``refresh`` polls at once (this process stored the results or the whole log).

The chunks this process stored last are kept for its followers (``recent``: a deployment's last
``RECENT_CHUNKS``, ``RECENT_BYTES`` of ciphertext in all): a follower that is one or a few chunks behind
takes them from there instead of reading them back; any other reads its page from the database.

Progress only grows: what a poll read before a chunk committed here never takes the chunk back
(``last_seq``, ``last_received_at`` and ``phases`` are the larger of the two). The poll runs in a task of
its own while anyone follows, and ends with the last follower or when the notifier closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from types import TracebackType

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.dispatch import live_logs
from orchestrator.domain.deployments import is_final
from orchestrator.notify import Notifier, Subscription
from orchestrator.store import log_chunks as chunk_store

log = structlog.get_logger(__name__)

#: How often the hub reads where every followed log stands (chunks of other replicas, the end).
POLL_SECONDS = 0.5
#: The chunks stored here last, kept for the followers of each deployment ...
RECENT_CHUNKS = 4
#: ... and the most ciphertext kept so for all of them (past it, followers read their chunks back).
RECENT_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(slots=True)
class _Entry:
    progress: chunk_store.Progress | None
    followers: int = 0
    #: The last chunks stored here, by seq, in order.
    recent: dict[int, chunk_store.Chunk] = dataclasses.field(default_factory=dict)


def merged(known: chunk_store.Progress, read: chunk_store.Progress) -> chunk_store.Progress:
    """``read`` (a poll), but never behind ``known`` in what only grows: the last chunk, when it came, the
    phases."""
    last_received = known.last_received_at
    if read.last_received_at is not None and (last_received is None or read.last_received_at > last_received):
        last_received = read.last_received_at
    return dataclasses.replace(
        read,
        last_seq=max(known.last_seq, read.last_seq),
        last_received_at=last_received,
        phases=max(known.phases, read.phases),
    )


class FollowHub:
    """See the module docstring."""

    def __init__(
        self, reader: AsyncEngine, notifier: Notifier, *, poll_seconds: float = POLL_SECONDS
    ) -> None:
        self._reader = reader
        self._notifier = notifier
        self._poll_seconds = poll_seconds
        self._entries: dict[uuid.UUID, _Entry] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._recent_bytes = 0
        #: Polls made (for tests: one per interval for all followers, not one per follower), and chunks
        #: handed to followers from ``recent`` (not read back).
        self.polls = 0
        self.recent_served = 0

    def watch(self, deployment_id: uuid.UUID, progress: chunk_store.Progress) -> Watch:
        """Follow ``deployment_id``, whose progress the caller just read; a context manager."""
        entry = self._entries.get(deployment_id)
        if entry is None:
            entry = self._entries[deployment_id] = _Entry(progress)
        else:
            entry.progress = progress if entry.progress is None else merged(entry.progress, progress)
        entry.followers += 1
        subscription = self._notifier.subscribe([live_logs.follow_key(deployment_id)])
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="log-followers-poll")
        return Watch(self, deployment_id, subscription)

    @property
    def followed(self) -> int:
        """Deployments followed here now."""
        return len(self._entries)

    def progress(self, deployment_id: uuid.UUID) -> chunk_store.Progress | None:
        """Where the followed deployment's log stands; None once it is gone."""
        entry = self._entries.get(deployment_id)
        return None if entry is None else entry.progress

    def recent(self, deployment_id: uuid.UUID, after: int) -> list[chunk_store.Chunk] | None:
        """The chunks after ``after`` up to the last one stored, if all of them are kept here; else None."""
        entry = self._entries.get(deployment_id)
        if entry is None or entry.progress is None or not entry.recent:
            return None
        wanted = range(after + 1, entry.progress.last_seq + 1)
        if not wanted or any(seq not in entry.recent for seq in wanted):
            return None
        self.recent_served += len(wanted)
        return [entry.recent[seq] for seq in wanted]

    def update(self, deployment_id: uuid.UUID, progress: chunk_store.Progress | None) -> None:
        """A follower read ``progress`` itself (None: the deployment is gone)."""
        entry = self._entries.get(deployment_id)
        if entry is None:
            return
        if progress is None or entry.progress is None:
            entry.progress = progress
        else:
            entry.progress = merged(entry.progress, progress)

    def stored(self, chunks: Sequence[live_logs.StoredChunk]) -> None:
        """This process committed ``chunks``: their followers here read them now."""
        moved: set[uuid.UUID] = set()
        for chunk in chunks:
            moved.add(chunk.deployment_id)
            entry = self._entries.get(chunk.deployment_id)
            if entry is None or entry.progress is None:
                continue
            known = entry.progress
            last_received = known.last_received_at
            if last_received is None or chunk.received_at > last_received:
                last_received = chunk.received_at
            entry.progress = dataclasses.replace(
                known,
                last_seq=max(known.last_seq, chunk.seq),
                last_received_at=last_received,
                phases=known.phases + chunk.phases_added,
            )
            self._keep(entry, chunk)
        for deployment_id in moved:
            self._notifier.notify(live_logs.follow_key(deployment_id))

    def refresh(self, deployment_id: uuid.UUID) -> None:
        """Something of the deployment changed here (its results, its whole log): poll now."""
        if deployment_id in self._entries:
            self._wake.set()

    async def close(self) -> None:
        """The server stops (its notifier is closed, followers end): end the poll."""
        self._entries.clear()
        self._wake.set()
        if self._task is not None:
            await self._task

    def _keep(self, entry: _Entry, chunk: live_logs.StoredChunk) -> None:
        """Keep ``chunk`` for the followers (its deployment's last ``RECENT_CHUNKS``, within
        ``RECENT_BYTES`` for all)."""
        entry.recent[chunk.seq] = chunk_store.Chunk(
            seq=chunk.seq, phase=chunk.phase, received_at=chunk.received_at, ciphertext=chunk.ciphertext
        )
        self._recent_bytes += len(chunk.ciphertext)
        while len(entry.recent) > RECENT_CHUNKS or (self._recent_bytes > RECENT_BYTES and entry.recent):
            self._forget(entry, min(entry.recent))

    def _forget(self, entry: _Entry, seq: int) -> None:
        self._recent_bytes -= len(entry.recent.pop(seq).ciphertext)

    def _release(self, deployment_id: uuid.UUID) -> None:
        entry = self._entries.get(deployment_id)
        if entry is None:
            return
        entry.followers -= 1
        if entry.followers <= 0:
            for seq in list(entry.recent):
                self._forget(entry, seq)
            del self._entries[deployment_id]

    async def _run(self) -> None:
        while self._entries and not self._notifier.closed:
            try:
                await asyncio.wait_for(self._wake.wait(), self._poll_seconds)
            except TimeoutError:
                pass
            self._wake.clear()
            if not self._entries or self._notifier.closed:
                break
            try:
                await self._poll()
            except Exception as exc:  # the database may be back at the next poll; followers wait meanwhile
                log.warning("log_followers_poll_failed", reason=str(exc))

    async def _poll(self) -> None:
        followed = list(self._entries)
        async with self._reader.connect() as conn:
            found = await chunk_store.progress_many(conn, followed)
        self.polls += 1
        for deployment_id in followed:
            entry = self._entries.get(deployment_id)
            if entry is None or entry.progress is None:
                continue
            read = found.get(deployment_id)
            before = entry.progress
            entry.progress = None if read is None else merged(before, read)
            if entry.progress != before or entry.progress is None or is_final(entry.progress.status):
                self._notifier.notify(live_logs.follow_key(deployment_id))


class Watch:
    """One follower's view of its deployment (``FollowHub.watch``)."""

    def __init__(self, hub: FollowHub, deployment_id: uuid.UUID, subscription: Subscription) -> None:
        self._hub = hub
        self._deployment_id = deployment_id
        self._subscription = subscription

    @property
    def progress(self) -> chunk_store.Progress | None:
        """Where the log stands as the hub knows it; None once the deployment is gone."""
        return self._hub.progress(self._deployment_id)

    def update(self, progress: chunk_store.Progress | None) -> None:
        self._hub.update(self._deployment_id, progress)

    async def wait(self, seconds: float) -> bool:
        """True when the hub woke this follower (or the notifier closed) within ``seconds``."""
        return await self._subscription.wait(seconds)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._subscription.__exit__(kind, value, traceback)
        self._hub._release(self._deployment_id)
