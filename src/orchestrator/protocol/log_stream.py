"""The live log stream: a runner's log sent in encrypted chunks while the deployment runs (issue 22).

Ours, not upstream's: upstream's runner ``PUT``s the whole log once at the end (``results.logs_path``),
and that keeps working unchanged. Our runner streams chunks as well, and still puts the whole log.

Wire contract (every part is a compatibility promise, like the rest of ``protocol``):

- **Phases** (not secret): ``queued`` → ``launching`` → ``init`` → ``plan`` → ``apply`` or ``destroy`` →
  ``reporting``. The orchestrator records ``queued`` (created) and ``launching`` (the dispatcher or an agent
  command starts a run); the runner's chunks carry the others.
- **A chunk** is up to ``MAX_CHUNK_TEXT_BYTES`` of log text (whole lines, UTF-8), cut every
  ``FLUSH_SECONDS`` (the first line after a quiet while sooner) or when that size is reached, whichever
  comes first, and at every phase change. A line
  longer than a chunk is split: its pieces end their chunks without a newline and the next chunk goes on
  with it (the chunks' texts, joined in order, are the log). Its
  plaintext is the JSON object ``ChunkPlaintext`` (sequence number, phase and deployment id inside the
  ciphertext, so a chunk cannot be replayed into another deployment or reordered unseen), age-encrypted
  to the deployment's ``encrypted_logs_recipient``: every chunk decrypts on its own.
- **Upload**: ``PUT chunk_path(..., seq)`` with ``X-Deployment-Token``, header ``X-Log-Phase: <phase>``
  (the phase in clear, for the phase history), body: the age ciphertext in standard base64
  (``text/plain``). Sequence numbers start at 1 and rise by one. Answers: ``202`` stored; ``202`` again
  for the same ``seq`` with the same bytes (a retry: stored once); ``409`` for a ``seq`` already stored
  with other bytes; ``413`` over ``MAX_CHUNK_UPLOAD_BYTES``; ``400`` for a token that is not the
  deployment's (as every gateway route answers it), ``404`` for a deployment of another runner or
  environment; ``400`` naming ``X-Log-Phase`` for a phase not in ``RUNNER_PHASES``, or the body for one
  that is not base64 of an age file; ``410`` once the deployment has ended and ``CHUNK_GRACE_SECONDS``
  passed. A runner retries a
  chunk until it is stored, in order, and never sends chunk ``n + 1`` before ``n`` is stored.
- **Reading** (the API, ``GET /orgs/{org}/deployments/{id}/logs``): ``LogChunk`` items, ciphertext as
  stored; ``?after=<seq>`` resumes; ``?follow=true`` answers ``text/event-stream`` (see ``SSE_*``). A page
  holds at most ``limit`` chunks and a bounded size of ciphertext: its ``last_seq`` is the highest number
  stored, so a reader fetches on with ``after`` = its last item's ``seq`` while that is below ``last_seq``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.protocol import age
from orchestrator.protocol.results import GATEWAY_BASE_PATH, _segment, runner_path

#: A steady log is cut into a chunk this often (seconds); the runner sends a line after a quiet while sooner.
FLUSH_SECONDS: Final = 1.0
#: ... or when its text reaches this size (bytes of UTF-8 plaintext).
MAX_CHUNK_TEXT_BYTES: Final = 64 * 1024
#: The largest chunk upload the gateway reads: a full chunk's ciphertext in base64, with room to spare.
MAX_CHUNK_UPLOAD_BYTES: Final = 128 * 1024
#: After the deployment ended, chunks still in flight are accepted this long.
CHUNK_GRACE_SECONDS: Final = 300.0
#: The header naming the chunk's phase in clear.
PHASE_HEADER: Final = "X-Log-Phase"
#: Version of ``ChunkPlaintext``.
CHUNK_FORMAT: Final = 1

#: Server-sent events of ``GET .../logs?follow=true``. Each event's ``id`` is the chunk's ``seq``
#: (a follower reconnects with ``Last-Event-ID`` or ``?after=``).
#: ``chunk``: data is a ``LogChunk`` as JSON.
SSE_CHUNK: Final = "chunk"
#: ``phase``: data is ``{"phase": ..., "started_at": ...}`` (a phase began).
SSE_PHASE: Final = "phase"
#: ``log``: data is ``{"ciphertext": ...}``, the whole log an upstream runner put at the end (it streamed
#: no chunks): base64 age ciphertext, as ``get-logs`` gives it.
SSE_WHOLE_LOG: Final = "log"
#: ``end``: data is ``{"status": ..., "status_message": ..., "last_seq": ...}``; the stream closes after it.
SSE_END: Final = "end"


class Phase(StrEnum):
    QUEUED = "queued"
    LAUNCHING = "launching"
    INIT = "init"
    PLAN = "plan"
    APPLY = "apply"
    DESTROY = "destroy"
    REPORTING = "reporting"


#: The phases a runner may name in ``PHASE_HEADER`` (the orchestrator records the others itself).
RUNNER_PHASES: Final = frozenset({Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.DESTROY, Phase.REPORTING})


class ChunkPlaintext(BaseModel):
    """What one chunk's ciphertext decrypts to."""

    model_config = ConfigDict(extra="ignore")

    v: int = CHUNK_FORMAT
    deployment_id: str
    seq: int = Field(ge=1)
    phase: Phase
    #: Whole lines, each ending in a newline: the runner's JSON lines and Terraform's ``-json`` lines; but
    #: a line too long for one chunk is split, its pieces ending their chunks without a newline.
    text: str


class LogChunk(BaseModel):
    """A stored chunk as the API hands it out: ciphertext only."""

    model_config = ConfigDict(extra="ignore")

    seq: int
    phase: Phase
    received_at: str
    #: The age ciphertext in standard base64, as the runner sent it.
    ciphertext: str


def encrypt_chunk(deployment_id: str, seq: int, phase: Phase, text: str, recipient: str) -> str:
    """The base64 age ciphertext of one chunk (the upload body)."""
    plain = ChunkPlaintext(deployment_id=deployment_id, seq=seq, phase=phase, text=text)
    return age.encrypt_b64(plain.model_dump_json().encode(), recipient)


def decrypt_chunk(ciphertext: str | bytes, identity: str, *, deployment_id: str, seq: int) -> ChunkPlaintext:
    """One chunk's plaintext; ``AgeDecryptError`` if it does not decrypt with ``identity`` or is not the chunk
    ``seq`` of ``deployment_id`` (moved from elsewhere)."""
    plain = age.decrypt_b64(ciphertext, identity)
    try:
        chunk = ChunkPlaintext.model_validate(json.loads(plain))
    except ValueError as exc:
        raise age.AgeDecryptError(f"log chunk {seq} is not a log chunk") from exc
    if chunk.deployment_id != deployment_id or chunk.seq != seq:
        raise age.AgeDecryptError(
            f"log chunk {seq} holds chunk {chunk.seq} of deployment {chunk.deployment_id}: it was moved"
        )
    return chunk


def chunk_path(
    org_id: str,
    runner_id: str,
    env_uuid: str,
    deployment_id: str,
    seq: int,
    *,
    base_path: str = GATEWAY_BASE_PATH,
) -> str:
    """``PUT``: chunk ``seq`` of the deployment's live log (``X-Deployment-Token``, ``X-Log-Phase``)."""
    runner = runner_path(org_id, runner_id, base_path=base_path)
    return (
        f"{runner}/environments/{_segment(env_uuid)}/deployments/{_segment(deployment_id)}/log-chunks/{seq}"
    )
