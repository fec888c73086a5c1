"""A runner gateway for the runner's live log stream, written from the contract (``protocol.log_stream``):
``PUT .../log-chunks/{seq}`` answers 202 (stored; 202 again for the same bytes), 409 (other bytes for a
stored ``seq``), 413, 404 and 410, and the deployment routes a whole run needs (``GET .../bundle``,
``PUT .../logs``, ``POST .../results``). A raw ASGI app, served for real (``serve_in_thread``), with the
faults the tests switch on: answers held back (503), a chunk stored and its answer lost (the connection
dropped), no answer at all (a black hole), no such route (404 or 405, as upstream's gateway), the
deployment ended (410).

``events`` lists, in the order they happened, each chunk's first store, the whole log and the results;
``puts`` every chunk ``PUT`` as ``(seq, status)`` (``None``: the connection was dropped).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import Receive, Scope, Send

from orchestrator.protocol import age
from orchestrator.protocol.log_stream import (
    MAX_CHUNK_UPLOAD_BYTES,
    PHASE_HEADER,
    RUNNER_PHASES,
    ChunkPlaintext,
    decrypt_chunk,
)
from orchestrator.protocol.results import DEPLOYMENT_TOKEN_HEADER

_CHUNK = re.compile(r"/deployments/(?P<deployment>[^/]+)/log-chunks/(?P<seq>[0-9]+)$")


class ConnectionDropped(Exception):  # noqa: N818 (what happened, not an error of the test)
    """Raised after the response started: the connection closes without an answer."""


@dataclass
class StoredChunk:
    seq: int
    phase: str
    body: bytes


@dataclass
class ChunkGateway:
    """The gateway (see the module docstring); ``token`` is the only deployment token it takes."""

    token: str
    bundle: bytes = b""
    #: The next N chunk PUTs are answered 503.
    unavailable: int = 0
    #: While set, every chunk PUT is answered 503 (the gateway is down).
    down: threading.Event = field(default_factory=threading.Event)
    #: The next N chunks stored lose their answer (the connection drops after the store).
    lose_answers: int = 0
    #: While set, chunk PUTs get no answer until ``release`` is set (a black-holed gateway).
    black_hole: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    #: Chunk PUTs are answered this (404 or 405: a gateway without the route).
    no_route: int | None = None
    #: Chunks past this seq are answered 410 (the deployment ended).
    gone_after: int | None = None
    #: Called with each chunk as it is first stored (in the server's thread).
    on_store: Callable[[StoredChunk], None] | None = None
    #: Keep the chunks' bodies (off for very large logs: ``on_store`` sees them).
    keep_bodies: bool = True
    chunks: dict[int, StoredChunk] = field(default_factory=dict)
    digests: dict[int, bytes] = field(default_factory=dict)
    events: list[tuple[str, int | None]] = field(default_factory=list)
    puts: list[tuple[int, int | None]] = field(default_factory=list)
    whole_log: bytes | None = None
    results: dict[str, object] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def stored_seqs(self) -> list[int]:
        return [seq for kind, seq in self.events if kind == "chunk" and seq is not None]

    def decrypted(self, identity: str, deployment_id: str) -> list[ChunkPlaintext]:
        """Every stored chunk in ``seq`` order, decrypted (each checked: that chunk of that deployment)."""
        return [
            decrypt_chunk(self.chunks[seq].body, identity, deployment_id=deployment_id, seq=seq)
            for seq in sorted(self.chunks)
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert scope["type"] == "http"
        method, path = scope["method"], scope["path"]
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        body = await _body(receive)
        if path == "/healthz":
            await _answer(send, 200)
        elif headers.get(DEPLOYMENT_TOKEN_HEADER.lower()) != self.token:
            await _answer(send, 401, {"error": "API-401", "message": "the deployment token is not valid"})
        elif method == "PUT" and (match := _CHUNK.search(path)):
            await self._chunk(int(match["seq"]), headers.get(PHASE_HEADER.lower(), ""), body, send)
        elif method == "GET" and path.endswith("/bundle"):
            await _answer(send, 200, self.bundle, content_type="application/gzip")
        elif method == "PUT" and path.endswith("/logs"):
            with self._lock:
                self.whole_log = body
                self.events.append(("logs", None))
            await _answer(send, 202)
        elif method == "POST" and path.endswith("/results"):
            with self._lock:
                self.results = json.loads(body)
                self.events.append(("results", None))
            await _answer(send, 202)
        else:
            await _answer(send, 404, {"error": "API-404", "message": f"no route {method} {path}"})

    async def _chunk(self, seq: int, phase: str, body: bytes, send: Send) -> None:
        if self.black_hole.is_set():
            with self._lock:
                self.puts.append((seq, None))
            await asyncio.to_thread(self.release.wait, 60)
            await _answer(send, 503)
            return
        status, drop, stored = self._take(seq, phase, body)
        with self._lock:
            self.puts.append((seq, None if drop else status))
        if stored is not None and self.on_store is not None:
            self.on_store(stored)
        if drop:
            await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"9")]})
            raise ConnectionDropped(f"chunk {seq}: stored, the answer lost by the test")
        await _answer(send, status)

    def _take(self, seq: int, phase: str, body: bytes) -> tuple[int, bool, StoredChunk | None]:
        """The answer to a chunk PUT, whether its connection drops, and the chunk if first stored now."""
        with self._lock:
            if self.no_route is not None:
                return self.no_route, False, None
            if self.down.is_set() or self.unavailable > 0:
                self.unavailable = max(0, self.unavailable - 1)
                return 503, False, None
            if self.gone_after is not None and seq > self.gone_after:
                return 410, False, None
            if len(body) > MAX_CHUNK_UPLOAD_BYTES:
                return 413, False, None
            if phase not in {runner_phase.value for runner_phase in RUNNER_PHASES}:
                return 400, False, None
            digest = hashlib.sha256(body).digest()
            if seq in self.digests:
                return (202 if self.digests[seq] == digest else 409), False, None
            self.digests[seq] = digest
            stored = StoredChunk(seq, phase, body if self.keep_bodies else b"")
            self.chunks[seq] = stored
            self.events.append(("chunk", seq))
            drop = self.lose_answers > 0
            self.lose_answers = max(0, self.lose_answers - 1)
            return 202, drop, StoredChunk(seq, phase, body)

    def preload(self, seq: int, body: bytes) -> None:
        """Other bytes stored for ``seq`` already (the runner's own will be answered 409)."""
        with self._lock:
            self.digests[seq] = hashlib.sha256(body).digest()


async def _body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _answer(
    send: Send, status: int, body: object = b"", *, content_type: str = "application/json"
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def chunk_lines(chunks: list[ChunkPlaintext]) -> list[str]:
    """The log lines the chunks hold, in order (a line split across chunks joined again)."""
    return "".join(chunk.text for chunk in chunks).splitlines()


def decrypt_whole_log(whole_log: bytes | None, identity: str) -> str:
    assert whole_log is not None, "no whole log was put"
    return age.decrypt_b64(whole_log, identity).decode()
