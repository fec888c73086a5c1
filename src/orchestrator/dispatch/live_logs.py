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
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.deployments import Deployment, is_final
from orchestrator.errors import ConflictError, GoneError, OrchestratorError
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


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkUpload:
    """A runner's chunk, authorized, to store (``receive_chunks``)."""

    deployment: Deployment
    seq: int
    phase: Phase
    #: The age ciphertext (raw bytes).
    ciphertext: bytes
    received_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredChunk:
    """A chunk stored now (what followers are told once it is committed)."""

    deployment_id: uuid.UUID
    seq: int
    phase: str
    received_at: datetime
    #: The age ciphertext, as stored.
    ciphertext: bytes
    #: Phases this chunk recorded (0 or 1).
    phases_added: int


#: What ``receive_chunks`` makes of an upload: True stored now, False a repeat of the stored bytes, or the
#: error to answer (ConflictError, GoneError).
Outcome = bool | OrchestratorError


@dataclass(frozen=True, kw_only=True, slots=True)
class Received:
    """What ``receive_chunks`` did: each upload's outcome (in order), the chunks stored now, and the latest
    phase of each deployment they belong to (for the caller's ``known_phases`` once committed)."""

    outcomes: list[Outcome]
    stored: list[StoredChunk]
    latest_phases: dict[uuid.UUID, str]


def needs_transaction(uploads: Sequence[ChunkUpload], known_phases: Mapping[uuid.UUID, str]) -> bool:
    """Whether ``receive_chunks`` may run more than its insert for ``uploads``: a chunk of an ended
    deployment (its logs may be gone), or of another phase than ``known_phases`` says (a phase may be
    recorded with it, atomically). Otherwise it writes with one statement."""
    return any(
        is_final(upload.deployment.status) or known_phases.get(upload.deployment.id) != upload.phase.value
        for upload in uploads
    )


async def receive_chunks(
    conn: AsyncConnection,
    uploads: Sequence[ChunkUpload],
    *,
    known_phases: Mapping[uuid.UUID, str] | None = None,
) -> Received:
    """Store the runners' chunks ``uploads`` (of any deployments) in the caller's transaction: one insert
    for all and, for the deployments whose chunks may change their phase, one read of their latest phases and
    one insert of the phases that change. Per upload, its outcome (in order): True if stored now, False for
    a repeat of the stored bytes, ConflictError for other bytes under a stored ``seq``, GoneError once its
    deployment takes no chunks (``ensure_open``, or its logs were removed).

    ``known_phases``: the latest phase of deployments as the caller last committed it. A chunk naming that
    phase changes nothing and reads nothing (a runner's phases only move forward: init, plan, apply or
    destroy, reporting); any other is checked against the database."""
    outcomes: list[Outcome | None] = [None] * len(uploads)
    removed: dict[uuid.UUID, datetime | None] = {}
    candidates: list[int] = []
    for index, upload in enumerate(uploads):
        deployment = upload.deployment
        try:
            ensure_open(deployment, now=upload.received_at)
        except GoneError as exc:
            outcomes[index] = exc
            continue
        if is_final(deployment.status):
            # Within the grace, but the retention may have removed its logs already (its environment is
            # gone): a chunk stored now would outlive them.
            if deployment.id not in removed:
                removed[deployment.id] = await deployment_store.objects_deleted_at(
                    conn, deployment.org_id, deployment.id
                )
            when = removed[deployment.id]
            if when is not None:
                outcomes[index] = GoneError(
                    f"the logs of deployment '{deployment.id}' were removed on {when.isoformat()}: it takes "
                    "no chunks any more"
                )
                continue
        candidates.append(index)
    inserted = await chunk_store.insert_many(
        conn,
        [
            chunk_store.NewChunk(
                deployment_id=uploads[i].deployment.id,
                org_id=uploads[i].deployment.org_id,
                seq=uploads[i].seq,
                phase=uploads[i].phase.value,
                ciphertext=uploads[i].ciphertext,
                received_at=uploads[i].received_at,
            )
            for i in candidates
        ],
    )
    fresh: list[ChunkUpload] = []
    for index in candidates:
        upload = uploads[index]
        key = (upload.deployment.id, upload.seq)
        if key in inserted:
            inserted.discard(key)  # a second upload of the number in this batch is a repeat
            outcomes[index] = True
            fresh.append(upload)
            continue
        existing = await chunk_store.ciphertext_of(conn, upload.deployment.id, upload.seq)
        if existing is not None and hmac.compare_digest(existing, upload.ciphertext):
            outcomes[index] = False
        else:
            outcomes[index] = ConflictError(
                f"log chunk {upload.seq} of deployment '{upload.deployment.id}' is stored with other bytes; "
                "chunks are written once (send the next chunk with the next number)"
            )
    added, latest = await _record_phases(conn, fresh, known_phases or {})
    stored = [
        StoredChunk(
            deployment_id=upload.deployment.id,
            seq=upload.seq,
            phase=upload.phase.value,
            received_at=upload.received_at,
            ciphertext=upload.ciphertext,
            phases_added=int((upload.deployment.id, upload.seq) in added),
        )
        for upload in fresh
    ]
    return Received(
        outcomes=[outcome for outcome in outcomes if outcome is not None], stored=stored, latest_phases=latest
    )


async def _record_phases(
    conn: AsyncConnection, fresh: Sequence[ChunkUpload], known: Mapping[uuid.UUID, str]
) -> tuple[set[tuple[uuid.UUID, int]], dict[uuid.UUID, str]]:
    """The phases the chunks stored now change (in each deployment's chunk order): appended when they differ
    from the latest; the (deployment, seq) of the chunks that recorded one, and each deployment's latest
    phase."""
    latest_phase = {upload.deployment.id: upload.phase.value for upload in fresh}
    changing = sorted(
        {upload.deployment.id for upload in fresh if known.get(upload.deployment.id) != upload.phase.value}
    )
    if not changing:
        return set(), latest_phase
    latest = await phase_store.latest_many(conn, changing)
    rows: list[phase_store.NewPhase] = []
    by_position: dict[tuple[uuid.UUID, int], int] = {}
    for upload in sorted(fresh, key=lambda u: (u.deployment.id, u.seq)):
        deployment_id = upload.deployment.id
        if deployment_id not in changing:
            continue
        position, phase = latest.get(deployment_id, (0, None))
        if phase == upload.phase.value:
            continue
        position += 1
        latest[deployment_id] = (position, upload.phase.value)
        by_position[(deployment_id, position)] = upload.seq
        rows.append(
            phase_store.NewPhase(
                deployment_id=deployment_id,
                position=position,
                org_id=upload.deployment.org_id,
                phase=upload.phase.value,
                started_at=upload.received_at,
            )
        )
    recorded = await phase_store.insert_many(conn, rows)
    # A phase another append won is the latest all the same: the next chunk checks it again.
    for deployment_id, _position in set(by_position) - recorded:
        latest_phase.pop(deployment_id, None)
    return {(key[0], by_position[key]) for key in recorded}, latest_phase


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
