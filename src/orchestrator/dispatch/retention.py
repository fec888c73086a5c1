"""Retention of deployment objects: bundles and logs are deleted from the object store
``PO_OBJECT_RETENTION_DAYS`` after their deployment finished, and once their environment is deleted; the
live log's chunks (database rows) with them, never earlier.

Every replica runs the worker (every ``PO_CLEANUP_INTERVAL_SECONDS``). A round reads a batch of due
deployments, deletes their objects (no transaction is open meanwhile: object stores are remote, and on
SQLite a write transaction would hold the one writer), then records ``objects_deleted_at`` per deployment
in a short transaction. Replicas may delete the same objects (harmless: deleting a missing object is no
error), but each deployment is recorded once; a crash between the deletes and the record only means the
objects are deleted again next time. Executing deployments are never touched, nor the code a destroy of
a still existing environment needs (its newest successful change); the rows stay, and the logs API then
answers 410, naming the retention.

Each round also deletes the encrypted outputs of deployments finished more than
``PO_OUTPUTS_RETENTION_SECONDS`` ago (upstream keeps them 5 minutes); the outputs API refuses them from
that moment on (404 "deployment outputs are no longer available"), whether or not a round has run.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator import metrics
from orchestrator.blobs import BlobStore
from orchestrator.errors import OrchestratorError
from orchestrator.notify import sleep_unless_stopped
from orchestrator.store import db
from orchestrator.store import deployments as store
from orchestrator.store import log_chunks as chunk_store

log = structlog.get_logger(__name__)

#: The first round waits this long at most after start-up (jittered), not a whole interval.
FIRST_ROUND_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True)
class Deleted:
    """A deployment whose objects a round deleted."""

    deployment_id: uuid.UUID
    keys: tuple[str, ...]


@dataclass(eq=False, repr=False, kw_only=True)
class RetentionWorker:
    engine: AsyncEngine
    blobs: BlobStore
    retention: timedelta
    interval_seconds: float
    #: None: outputs are kept (tests of the objects alone).
    outputs_retention: timedelta | None = None
    batch_size: int = 50

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and the loop goes on."""
        # Outputs are due minutes after their deployment: rounds come at least that often (a round with
        # nothing to do reads two rows at most).
        interval = self.interval_seconds
        if self.outputs_retention is not None:
            interval = min(interval, self.outputs_retention.total_seconds())
        delay = random.uniform(0.5, 1.0) * min(interval, FIRST_ROUND_SECONDS)
        while not await sleep_unless_stopped(stop, delay):
            try:
                deleted = await self.run_once()
            except Exception:
                log.exception("object retention round failed")
            else:
                if deleted:
                    log.info("deployment objects deleted", deployments=len(deleted))
            delay = interval

    async def run_once(self, now: datetime | None = None) -> list[Deleted]:
        """Delete the objects of every deployment due at ``now`` (default: the current time); what was
        deleted. A batch whose objects could not all be deleted ends the round (tried again next round)."""
        now = now or datetime.now(UTC)
        await self.delete_outputs(now)
        cutoff = now - self.retention
        # A cheap read first: a round with nothing to do takes no write transaction.
        async with db.readonly(self.engine).connect() as conn:
            if not await store.has_objects_due(conn, cutoff=cutoff):
                return []
        done: list[Deleted] = []
        after: uuid.UUID | None = None
        while True:
            async with db.readonly(self.engine).connect() as conn:
                due = await store.objects_due(conn, cutoff=cutoff, limit=self.batch_size, after=after)
            for item in due:
                if await self._delete(item, now):
                    done.append(Deleted(deployment_id=item.id, keys=item.keys))
            if len(due) < self.batch_size:
                return done
            after = due[-1].id

    async def delete_outputs(self, now: datetime) -> int:
        """Delete the encrypted outputs past their retention at ``now``; how many deployments had some."""
        if self.outputs_retention is None:
            return 0
        cutoff = now - self.outputs_retention
        async with db.readonly(self.engine).connect() as conn:
            if not await store.has_outputs_due(conn, cutoff=cutoff):
                return 0
        async with self.engine.begin() as conn:
            count = await store.delete_outputs(conn, cutoff=cutoff)
        metrics.RETENTION_DELETED.labels("outputs").inc(count)
        if count:
            log.info("deployment outputs deleted after their retention", deployments=count)
        return count

    async def _delete(self, item: store.KeptObjects, now: datetime) -> bool:
        """Delete one deployment's objects and record it; False if that failed (tried again next round)
        or another replica recorded it first."""
        try:
            for key in item.keys:
                await self.blobs.delete(key)
                metrics.RETENTION_DELETED.labels("object").inc()
        except OrchestratorError as exc:
            log.warning("deleting deployment objects failed", deployment_id=str(item.id), error=str(exc))
            return False
        async with self.engine.begin() as conn:
            marked = await store.mark_objects_deleted(conn, item.id, now=now)
            # The live log goes with the whole log: its chunks, in the same transaction.
            chunks = await chunk_store.delete_for(conn, item.id)
        if chunks:
            metrics.RETENTION_DELETED.labels("log_chunks").inc(chunks)
        return marked
