"""The live log (issue 22): the encrypted chunks a runner sends while its deployment runs, and the phases a
deployment goes through.

A chunk is stored once per sequence number: the same bytes again (a retry whose answer was lost) change
nothing, other bytes are a 409, and none is taken once the deployment ended more than
``CHUNK_GRACE_SECONDS`` ago (410). A stored chunk naming another phase than the deployment's latest
records that phase. The orchestrator records ``queued`` (created) and ``launching`` (the dispatcher
launches its runner, its agent command is created, a managed runner claims it) itself, in the
transaction that makes the change.

When a follow ends (``follow_ended``): the deployment is final and either its whole log is stored (a runner
puts it after its last chunk), or no chunk came for
``QUIET_SECONDS`` since it ended, or ``CHUNK_GRACE_SECONDS`` passed. A deployment that streamed no chunk
but may get a whole log (launched, with a logs recipient: an upstream runner puts the whole log only,
perhaps after its results) is waited for ``WHOLE_LOG_WAIT_SECONDS``.
"""

from __future__ import annotations

import hmac
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.deployments import Deployment, is_final
from orchestrator.errors import ConflictError, GoneError
from orchestrator.protocol.log_stream import CHUNK_GRACE_SECONDS, Phase
from orchestrator.store import deployments as deployment_store
from orchestrator.store import log_chunks as chunk_store
from orchestrator.store import phases as phase_store

#: A final deployment's follow ends after this long without a new chunk.
QUIET_SECONDS = 2.0
#: ... or this long when it streamed no chunk at all (its whole log may follow its results).
WHOLE_LOG_WAIT_SECONDS = 10.0


def follow_key(deployment_id: object) -> str:
    """The ``Notifier`` key of a deployment's followers: told of each chunk stored and of its whole log."""
    return f"logs:{deployment_id}"


def ensure_open(deployment: Deployment, *, now: datetime) -> None:
    """GoneError if the deployment takes no chunk any more: it ended more than ``CHUNK_GRACE_SECONDS`` ago."""
    if not is_final(deployment.status):
        return
    ended = deployment.completed_at or deployment.updated_at
    if now > ended + timedelta(seconds=CHUNK_GRACE_SECONDS):
        raise GoneError(
            f"deployment '{deployment.id}' {deployment.status} at {ended.isoformat(timespec='seconds')}: its "
            f"live log takes chunks until {CHUNK_GRACE_SECONDS:g} s after it ended"
        )


async def receive_chunk(
    conn: AsyncConnection, deployment: Deployment, *, seq: int, phase: Phase, ciphertext: bytes, now: datetime
) -> bool:
    """Store the runner's chunk ``seq`` (age ciphertext); True if stored now, False for a repeat of the
    stored bytes. ConflictError for other bytes under a stored ``seq``; GoneError once the deployment takes
    no chunks (``ensure_open``)."""
    ensure_open(deployment, now=now)
    if is_final(deployment.status):
        # Within the grace, but the retention may have removed its logs already (its environment is gone):
        # a chunk stored now would outlive them.
        removed = await deployment_store.objects_deleted_at(conn, deployment.org_id, deployment.id)
        if removed is not None:
            raise GoneError(
                f"the logs of deployment '{deployment.id}' were removed on {removed.isoformat()}: it takes "
                "no chunks any more"
            )
    stored = await chunk_store.insert(
        conn,
        deployment_id=deployment.id,
        org_id=deployment.org_id,
        seq=seq,
        phase=phase.value,
        ciphertext=ciphertext,
        now=now,
    )
    if not stored:
        existing = await chunk_store.ciphertext_of(conn, deployment.id, seq)
        if existing is not None and hmac.compare_digest(existing, ciphertext):
            return False
        raise ConflictError(
            f"log chunk {seq} of deployment '{deployment.id}' is stored with other bytes; chunks are written "
            "once (send the next chunk with the next number)"
        )
    await phase_store.append(
        conn, deployment_id=deployment.id, org_id=deployment.org_id, phase=phase.value, now=now
    )
    return True


async def record_phase(conn: AsyncConnection, deployment: Deployment, phase: Phase, *, now: datetime) -> bool:
    """Record that the deployment entered ``phase`` (unless that is its latest phase already)."""
    return await phase_store.append(
        conn, deployment_id=deployment.id, org_id=deployment.org_id, phase=phase.value, now=now
    )


def follow_ended(progress: chunk_store.Progress, *, now: datetime) -> bool:
    """Whether no chunk can come any more: see the module docstring."""
    if not is_final(progress.status):
        return False
    if progress.has_whole_log or progress.objects_deleted_at is not None:
        return True
    ended = progress.completed_at or progress.updated_at
    if now > ended + timedelta(seconds=CHUNK_GRACE_SECONDS):
        return True
    wait = WHOLE_LOG_WAIT_SECONDS if progress.whole_log_expected and not progress.last_seq else QUIET_SECONDS
    last = max(ended, progress.last_received_at) if progress.last_received_at is not None else ended
    return now >= last + timedelta(seconds=wait)
