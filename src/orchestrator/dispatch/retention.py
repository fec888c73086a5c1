"""Retention of deployment objects: bundles and logs are deleted from the object store
``PO_OBJECT_RETENTION_DAYS`` after their deployment finished, and once their environment is deleted.

Every replica runs the worker (every ``PO_CLEANUP_INTERVAL_SECONDS``). A round claims a batch of due
deployments in one transaction (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so replicas take different rows;
SQLite: the writer transaction is exclusive), deletes their objects and records ``objects_deleted_at`` in
that same transaction. A crash between the deletes and the commit only means the objects are deleted
again next time; deleting a missing object is no error. Executing deployments are never touched, and the
rows stay: the logs API then answers 410, naming the retention.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.blobs import BlobStore
from orchestrator.errors import OrchestratorError
from orchestrator.store import db
from orchestrator.store import deployments as store

log = structlog.get_logger(__name__)

#: The first round waits this long at most after start-up (jittered), not a whole interval.
FIRST_ROUND_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True)
class Deleted:
    """A deployment whose objects a round deleted."""

    deployment_id: uuid.UUID
    keys: tuple[str, ...]


class RetentionWorker:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        blobs: BlobStore,
        retention: timedelta,
        interval_seconds: float,
        batch_size: int = 50,
    ) -> None:
        self.engine = engine
        self.blobs = blobs
        self.retention = retention
        self.interval_seconds = interval_seconds
        self.batch_size = batch_size

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and the loop goes on."""
        delay = random.uniform(0.5, 1.0) * min(self.interval_seconds, FIRST_ROUND_SECONDS)
        while not await _stopped(stop, delay):
            try:
                deleted = await self.run_once()
            except Exception:
                log.exception("object retention round failed")
            else:
                if deleted:
                    log.info("deployment objects deleted", deployments=len(deleted))
            delay = self.interval_seconds

    async def run_once(self, now: datetime | None = None) -> list[Deleted]:
        """Delete the objects of every deployment due at ``now`` (default: the current time); what was
        deleted. A batch whose objects could not all be deleted ends the round (tried again next round)."""
        now = now or datetime.now(UTC)
        cutoff = now - self.retention
        # A cheap read first: a round with nothing to do takes no write transaction.
        async with db.readonly(self.engine).connect() as conn:
            if not await store.has_objects_due(conn, cutoff=cutoff):
                return []
        done: list[Deleted] = []
        while True:
            batch, claimed, complete = await self._batch(cutoff, now)
            done.extend(batch)
            # Fewer than a batch claimed: nothing more is due (or other replicas hold the rest).
            if not complete or claimed < self.batch_size:
                return done

    async def _batch(self, cutoff: datetime, now: datetime) -> tuple[list[Deleted], int, bool]:
        deleted: list[Deleted] = []
        complete = True
        async with self.engine.begin() as conn:
            due = await store.claim_objects_due(conn, cutoff=cutoff, limit=self.batch_size)
            for item in due:
                try:
                    for key in item.keys:
                        await self.blobs.delete(key)
                except OrchestratorError as exc:
                    # Kept on record as not deleted: the next round tries again.
                    log.warning(
                        "deleting deployment objects failed", deployment_id=str(item.id), error=str(exc)
                    )
                    complete = False
                    continue
                deleted.append(Deleted(deployment_id=item.id, keys=item.keys))
            await store.mark_objects_deleted(conn, [d.deployment_id for d in deleted], now=now)
        return deleted, len(due), complete


async def _stopped(stop: asyncio.Event, delay: float) -> bool:
    """Wait ``delay`` seconds or until ``stop`` is set; whether it is."""
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
    return stop.is_set()
