"""Following a deployment's live log: ``GET .../logs?follow=true`` (server-sent events), each chunk
decrypted here with the deployment's logs key, handed on in order, once.

The server sends ``chunk`` events (a ``LogChunk``: seq, phase, ciphertext), ``phase`` events, a ``log``
event for a deployment whose runner put only the whole log, and ``end`` (status, status message, last
seq), then closes the stream. A connection that drops (or stays silent past three keep-alives) is opened
again after the last chunk seen (``Last-Event-ID``), so no chunk is lost or printed twice; a chunk number
that skips some is reported as a gap (those chunks never reached the server).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.client.api import ApiClient, ApiConnectionError, JsonObject
from orchestrator.protocol import age

#: Consecutive failed connections before following gives up (with the waits below: about a minute).
RECONNECT_ATTEMPTS = 8
RECONNECT_FIRST_DELAY_SECONDS = 0.5
RECONNECT_MAX_DELAY_SECONDS = 10.0


class FollowError(Exception):
    """Following the log failed: the key does not open it, or the server stayed unreachable."""


@dataclass(frozen=True, kw_only=True)
class End:
    """How the followed deployment ended (the ``end`` event)."""

    status: str
    status_message: str
    last_seq: int


@dataclass
class LogFollower:
    """Follows one deployment's log; ``run()`` returns once it ends.

    ``on_text(text, phase)``: decrypted log text (whole lines), in order, each chunk once;
    ``on_phase(phase, started_at)``: a phase began; ``on_gap(first, last)``: chunks first..last never
    came; ``on_reconnect(reason)``: the stream is being opened again.
    """

    client: ApiClient
    org: str
    deployment_id: str
    identity: str
    on_text: Callable[[str, str | None], None]
    on_phase: Callable[[str, str | None], None] = lambda _phase, _at: None
    on_gap: Callable[[int, int], None] = lambda _first, _last: None
    on_reconnect: Callable[[str], None] = lambda _reason: None
    sleep: Callable[[float], None] = time.sleep
    #: The last chunk handed on (0: none yet); a reconnection resumes after it.
    last_seq: int = 0
    phases: list[tuple[str, str | None]] = field(default_factory=list)

    def run(self) -> End:
        failures = 0
        while True:
            try:
                for event in self.client.follow_deployment_logs(
                    self.org, self.deployment_id, after=self.last_seq
                ):
                    failures = 0
                    end = self._handle(event.event, event.data)
                    if end is not None:
                        return end
                reason = "the server closed the log stream before its end"
            except ApiConnectionError as exc:
                reason = exc.message
            failures += 1
            if failures > RECONNECT_ATTEMPTS:
                raise FollowError(f"{reason}; gave up after {RECONNECT_ATTEMPTS} tries")
            self.on_reconnect(reason)
            self.sleep(min(RECONNECT_FIRST_DELAY_SECONDS * 2 ** (failures - 1), RECONNECT_MAX_DELAY_SECONDS))

    def _handle(self, kind: str, data: str) -> End | None:
        from orchestrator.protocol import log_stream

        payload = _json(data)
        if kind == log_stream.SSE_CHUNK:
            self._chunk(payload)
        elif kind == log_stream.SSE_PHASE:
            started_at = payload.get("started_at")
            start = (str(payload.get("phase")), started_at if isinstance(started_at, str) else None)
            if start not in self.phases:  # a resumed stream sends every phase again
                self.phases.append(start)
                self.on_phase(*start)
        elif kind == log_stream.SSE_WHOLE_LOG:
            try:
                text = age.decrypt_b64(str(payload.get("ciphertext") or "").strip(), self.identity)
            except age.AgeDecryptError as exc:
                raise FollowError(self._wrong_key()) from exc
            self.on_text(text.decode("utf-8", errors="replace"), None)
        elif kind == log_stream.SSE_END:
            last_seq = int(payload.get("last_seq") or 0)
            if last_seq > self.last_seq:
                self.on_gap(self.last_seq + 1, last_seq)
            return End(
                status=str(payload.get("status")),
                status_message=str(payload.get("status_message") or ""),
                last_seq=last_seq,
            )
        return None

    def _chunk(self, payload: JsonObject) -> None:
        from orchestrator.protocol import log_stream

        seq = int(payload.get("seq") or 0)
        if seq <= self.last_seq:
            return  # seen already (a resumed stream repeating itself): never handed on twice
        if seq > self.last_seq + 1:
            self.on_gap(self.last_seq + 1, seq - 1)
        ciphertext = str(payload.get("ciphertext") or "")
        try:
            chunk = log_stream.decrypt_chunk(
                ciphertext, self.identity, deployment_id=self.deployment_id, seq=seq
            )
        except age.AgeDecryptError as exc:
            try:
                age.decrypt_b64(ciphertext, self.identity)
            except age.AgeDecryptError:
                raise FollowError(self._wrong_key()) from exc
            raise FollowError(
                f"the logs of deployment {self.deployment_id} cannot be trusted: {exc}"
            ) from exc
        self.last_seq = seq
        self.on_text(chunk.text, chunk.phase.value)

    def _wrong_key(self) -> str:
        return (
            f"the logs of deployment {self.deployment_id} do not decrypt with this key: it is not the logs "
            "key of this deployment"
        )


def _json(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
