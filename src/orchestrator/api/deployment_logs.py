"""A deployment's live log (issue 22): its encrypted chunks as a JSON page, or followed as server-sent events
(``protocol.log_stream``).

The server only ever holds ciphertext: followers decrypt with their own key. A page holds at most
``MAX_LIMIT`` chunks and ``MAX_PAGE_BYTES`` of ciphertext; a follower makes the server hold at most one
follow page (``FOLLOW_PAGE_CHUNKS``, ``FOLLOW_PAGE_BYTES``) at a time, and no database connection while it
waits. Followers are woken in process when a chunk is stored here, and the process's hub
(``dispatch.log_followers``) looks at the database every ``log_followers.POLL_SECONDS`` for all of them
(chunks other replicas stored, the end).
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from orchestrator import metrics
from orchestrator.api.context import READ, Principal
from orchestrator.api.deployments import PhaseOut, logs_removed
from orchestrator.dispatch import live_logs
from orchestrator.errors import InvalidInputError, NotFoundError
from orchestrator.protocol import log_stream
from orchestrator.store import log_chunks as chunk_store
from orchestrator.store import phases as phase_store
from orchestrator.web.services import Services, services

router = APIRouter(tags=["Deployment"])

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: The most ciphertext one page holds (it always holds one chunk).
MAX_PAGE_BYTES = 8 * 1024 * 1024
#: A follower reads at most this many chunks, and this much ciphertext, at a time.
FOLLOW_PAGE_CHUNKS = 32
FOLLOW_PAGE_BYTES = 1024 * 1024
#: A follower idle this long is sent a comment line, so that proxies keep the connection.
KEEP_ALIVE_SECONDS = 15.0
#: The largest chunk number (the gateway's).
MAX_SEQ = 2**31 - 1
EVENT_STREAM = "text/event-stream"
#: One server-sent event of a follow (OpenAPI 3.1: the schema of an event stream describes each event).
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {
            "type": "string",
            "enum": [
                log_stream.SSE_PHASE,
                log_stream.SSE_CHUNK,
                log_stream.SSE_WHOLE_LOG,
                log_stream.SSE_END,
            ],
        },
        "data": {
            "type": "string",
            "description": "JSON: a chunk as in the page's `items` (chunk), `{phase, started_at}` (phase), "
            "`{ciphertext}` (log), `{status, status_message, last_seq}` (end).",
        },
        "id": {"type": "string", "description": "A chunk event's `seq`."},
    },
}


class LogChunkOut(BaseModel):
    """A stored chunk (``protocol.log_stream.LogChunk``): ciphertext only."""

    seq: int
    phase: str = Field(examples=["init", "plan", "apply", "destroy", "reporting"])
    received_at: datetime
    ciphertext: str = Field(
        description="The age ciphertext, in standard base64, as the runner sent it: it decrypts on its own "
        "with the deployment's logs identity to a JSON object {v, deployment_id, seq, phase, text}."
    )

    @classmethod
    def of(cls, chunk: chunk_store.Chunk) -> LogChunkOut:
        return cls(
            seq=chunk.seq,
            phase=chunk.phase,
            received_at=chunk.received_at,
            ciphertext=base64.b64encode(chunk.ciphertext).decode("ascii"),
        )


class LogPageOut(BaseModel):
    items: list[LogChunkOut]
    last_seq: int = Field(
        description="The highest chunk number stored so far (0: none). Items up to it but after this page's "
        "last item are fetched with `after` = that item's `seq`."
    )
    complete: bool = Field(
        description="The deployment ended and no chunk can come any more (`last_seq` is the last one)."
    )
    status: str = Field(examples=["executing", "succeeded", "failed", "cancelled"])
    whole_log: bool = Field(
        description="The runner also put its whole log, at the end: `actions/get-logs` answers it."
    )


def _start(after: int, last_event_id: str | None) -> int:
    """Where to resume: after ``Last-Event-ID`` when given (a reconnecting follower), else ``after``."""
    if last_event_id is None or not last_event_id.strip():
        return after
    value = last_event_id.strip()
    if not value.isdigit() or int(value) > MAX_SEQ:
        raise InvalidInputError(
            f"Last-Event-ID: {value[:40]!r} is not a chunk number (the id of the last chunk event received)"
        )
    return int(value)


@router.get(
    "/orgs/{org_id}/deployments/{deployment_id}/logs",
    response_model=LogPageOut,
    responses={
        200: {
            "description": "The chunks after `after` (JSON); or, with `follow=true` or `Accept: "
            "text/event-stream`, server-sent events: `chunk` (id: its `seq`; data: a chunk as in `items`), "
            "`phase` (data: `{phase, started_at}`; every phase at the start, then each new one), `log` "
            "(data: `{ciphertext}`: the whole log of a deployment whose runner streamed no chunk), `end` "
            "(data: `{status, status_message, last_seq}`; then the stream closes), and a `: keep-alive` "
            "comment every 15 s. A reconnecting follower sends `Last-Event-ID` (or `after`) and gets only "
            "later chunks. The stream also closes without `end` when the server stops: reconnect.",
            "content": {EVENT_STREAM: {"schema": EVENT_SCHEMA}},
        },
        410: {"description": "The logs were removed after the retention period."},
    },
)
async def get_log_chunks(
    org_id: str,
    deployment_id: uuid.UUID,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="Only the chunks after this number (0: from the first).")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many chunks (a page).")] = (
        DEFAULT_LIMIT
    ),
    follow: Annotated[
        bool, Query(description="Server-sent events: the chunks as they arrive, until the deployment ends.")
    ] = False,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", description="Following: resume after this chunk (overrides `after`)."),
    ] = None,
    _: Principal = READ,
    svc: Services = Depends(services),
) -> Response:
    """The deployment's live log: its runner's encrypted log chunks, in order (same access as
    `actions/get-logs`)."""
    start = _start(after, last_event_id)
    async with svc.reader.connect() as conn:
        progress = await chunk_store.progress(conn, org_id, deployment_id)
        if progress is None:
            raise NotFoundError(f"deployment '{deployment_id}' not found")
        if progress.objects_deleted_at is not None:
            raise logs_removed(svc, deployment_id, progress.objects_deleted_at)
        if follow or EVENT_STREAM in (accept or ""):
            return StreamingResponse(
                _follow(svc, org_id, deployment_id, start, progress),
                media_type=EVENT_STREAM,
                headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            )
        chunks = await chunk_store.page(
            conn, deployment_id, after=start, limit=limit, max_bytes=MAX_PAGE_BYTES
        )
    page = LogPageOut(
        items=[LogChunkOut.of(chunk) for chunk in chunks],
        last_seq=progress.last_seq,
        complete=live_logs.follow_ended(progress, now=datetime.now(UTC)),
        status=progress.status,
        whole_log=progress.has_whole_log,
    )
    return JSONResponse(page.model_dump(mode="json"), headers={"Cache-Control": "no-store"})


def _event(name: str, data: dict[str, Any] | BaseModel, *, event_id: int | None = None) -> bytes:
    payload = (
        data.model_dump_json() if isinstance(data, BaseModel) else json.dumps(data, separators=(",", ":"))
    )
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {payload}\n\n".encode()


async def _follow(
    svc: Services, org_id: str, deployment_id: uuid.UUID, after: int, progress: chunk_store.Progress
) -> AsyncIterator[bytes]:
    """The events of one follower (see ``get_log_chunks``), from ``progress`` (read by the request). The
    process's hub (``dispatch.log_followers``) tells it where the log stands and wakes it when that moves;
    it reads only the phases and chunks it has not sent."""
    loop = asyncio.get_running_loop()
    metrics.LOG_FOLLOWERS.inc()
    try:
        with svc.log_followers.watch(deployment_id, progress) as watch:
            cursor, phases_sent, last_write = after, 0, loop.time()
            while True:
                known = watch.progress
                if known is None:
                    return
                phases, chunks = await _unsent(
                    svc, deployment_id, known, cursor=cursor, phases_sent=phases_sent
                )
                for start in phases[phases_sent:]:
                    yield _event(log_stream.SSE_PHASE, PhaseOut.of(start))
                    last_write = loop.time()
                phases_sent = max(phases_sent, len(phases))
                for chunk in chunks:
                    yield _event(log_stream.SSE_CHUNK, LogChunkOut.of(chunk), event_id=chunk.seq)
                    cursor, last_write = chunk.seq, loop.time()
                more = bool(chunks) and cursor < known.last_seq
                del chunks  # one page at a time
                if more:
                    continue  # more pages stored: read on at once
                if live_logs.follow_ended(known, now=datetime.now(UTC)):
                    # The hub's view may be a poll behind: the end is decided on a read of our own.
                    async with svc.reader.connect() as conn:
                        latest = await chunk_store.progress(conn, org_id, deployment_id)
                    watch.update(latest)
                    if latest is None:
                        return
                    if latest.last_seq > cursor or latest.phases > phases_sent:
                        continue
                    if live_logs.follow_ended(latest, now=datetime.now(UTC)):
                        async for event in _ending(svc, latest):
                            yield event
                        return
                if svc.notifier.closed:
                    return  # the server stops: the follower reconnects (to another replica)
                idle = loop.time() - last_write
                woken = await watch.wait(max(0.0, KEEP_ALIVE_SECONDS - idle))
                if not woken and loop.time() - last_write >= KEEP_ALIVE_SECONDS:
                    yield b": keep-alive\n\n"
                    last_write = loop.time()
    finally:
        metrics.LOG_FOLLOWERS.dec()


async def _unsent(
    svc: Services, deployment_id: uuid.UUID, known: chunk_store.Progress, *, cursor: int, phases_sent: int
) -> tuple[list[phase_store.PhaseStart], list[chunk_store.Chunk]]:
    """The phases (all of them, when there is one not sent) and the page of chunks after ``cursor`` that
    ``known`` says are stored: the hub's, when it keeps all of them, else read; no read when there is
    nothing new."""
    phases: list[phase_store.PhaseStart] = []
    chunks: list[chunk_store.Chunk] = []
    recent = svc.log_followers.recent(deployment_id, cursor) if known.last_seq > cursor else None
    read_chunks = known.last_seq > cursor and recent is None
    if known.phases > phases_sent or read_chunks:
        async with svc.reader.connect() as conn:
            if known.phases > phases_sent:
                phases = await phase_store.of(conn, deployment_id)
            if read_chunks:
                chunks = await chunk_store.page(
                    conn, deployment_id, after=cursor, limit=FOLLOW_PAGE_CHUNKS, max_bytes=FOLLOW_PAGE_BYTES
                )
    return phases, recent or chunks


async def _ending(svc: Services, progress: chunk_store.Progress) -> AsyncIterator[bytes]:
    """The last events: the whole log of a deployment that streamed no chunk, then ``end``."""
    if progress.last_seq == 0 and progress.logs_key is not None:
        data = await svc.blobs.get(progress.logs_key)
        if data is not None:
            yield _event(log_stream.SSE_WHOLE_LOG, {"ciphertext": data.decode("ascii", errors="replace")})
    yield _event(
        log_stream.SSE_END,
        {"status": progress.status, "status_message": progress.status_message, "last_seq": progress.last_seq},
    )
