"""The live log stream (issue 22): the run's log, cut into chunks, encrypted, sent to the gateway in order.

The wire contract is ``protocol.log_stream``. Here:

- :class:`Chunker` (pure) cuts the log's lines (redacted: ``LogBuffer`` hands them over) into chunks: a
  chunk is due ``FIRST_LINE_SECONDS`` after its first line but no sooner than ``FLUSH_SECONDS`` after the
  chunk before it was cut (the first line after a quiet second goes out within a quarter of a second, a
  steady log is still cut once a second), cut when its text would pass ``MAX_CHUNK_TEXT_BYTES``
  (or, JSON-escaped in the chunk, :data:`MAX_CHUNK_ESCAPED_BYTES`, so that no upload passes the gateway's
  limit), and at every phase change. The first line of a phase goes out at once (the gateway learns the
  phase when it starts). A line too long for one chunk is split: its pieces end their chunks without a
  newline, the next chunk goes on with it. Past ``max_bytes`` of text (``RUNNER_LOG_STREAM_MAX_BYTES``) a
  last chunk says the stream was truncated; the whole log, uploaded at the end, has its own 10 MiB cap.
- :class:`LogStream` encrypts each chunk to the deployment's logs recipient as it is cut and queues it; one
  thread sends the queue in order, each chunk tried until the gateway stored it (202), never skipped, never
  sent again once stored. The queue keeps :data:`QUEUE_MEMORY_BYTES` of ciphertext in memory; more (the
  gateway is down, or slower than the log) waits, still encrypted, in an unlinked file in ``TMPDIR`` (the
  run's work directory under the local, ssh, agent and managed launchers), sent from there in order. A
  time cut waits while chunks wait for delivery: they are cut by size then, fewer and larger.
- Answers: 404 or 405 to the first chunk (upstream's gateway has no such route) turn streaming off for the
  run, with one log line; 404 later, 410 (the deployment ended), a rejected token or any other final failure
  stop it too; 409 (other bytes stored for that number) and 413 are logged and the next chunk goes on.
- :meth:`LogStream.finish`, before the results: the last chunk is cut and the queue delivered, waiting as
  long as a chunk is stored at least every ``drain_seconds``; the chunks left are then given up (the whole
  log still follows). A gateway never reached stops the stream as it fails every request (its first
  contact window, ``runner.gateway_client``); each attempt waits at most :data:`ATTEMPT_SECONDS`.

Locks: ``LogBuffer`` calls :meth:`LogStream.line` under its own lock, so nothing here writes a log line
while holding the stream's lock (the sender logs with no lock held; what happens under a producer's call is
noted and logged later).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from orchestrator.client.errors import ClientError
from orchestrator.client.http import Backoff
from orchestrator.protocol.log_stream import (
    FLUSH_SECONDS,
    MAX_CHUNK_TEXT_BYTES,
    MAX_CHUNK_UPLOAD_BYTES,
    Phase,
    encrypt_chunk,
)
from orchestrator.runner.gateway_client import GatewayClient
from orchestrator.runner.logs import LogBuffer, RunnerLogger, format_size

#: What a chunk's text may take JSON-escaped (quotes and control characters grow) so that its upload stays
#: under ``MAX_CHUNK_UPLOAD_BYTES``: base64 makes 4 of 3 bytes; 2 KiB for the JSON around the text and
#: age's header and tags.
MAX_CHUNK_ESCAPED_BYTES: Final = MAX_CHUNK_UPLOAD_BYTES * 3 // 4 - 2048
#: Ciphertext of undelivered chunks kept in memory; more waits in the spill file.
QUEUE_MEMORY_BYTES: Final = 1 << 20
#: The longest one chunk upload waits for its answer before it is tried again.
ATTEMPT_SECONDS: Final = 10.0
#: The shortest wait of an attempt while the queue drains at the end.
MIN_ATTEMPT_SECONDS: Final = 0.5
#: The sender thread's name.
THREAD_NAME: Final = "po-log-stream"
#: A chunk is due this long after its first line, when the chunk before it was cut ``FLUSH_SECONDS`` ago
#: or more (seconds): lines after a quiet while reach followers sooner, at no more chunks than before.
FIRST_LINE_SECONDS: Final = 0.25


@dataclass(frozen=True, slots=True)
class Piece:
    """A cut chunk before it is numbered and encrypted."""

    phase: Phase
    text: str


class Chunker:
    """Cuts lines into chunks (see the module docstring); not thread-safe: :class:`LogStream` locks.

    ``add`` and ``set_phase`` return the chunks they cut; ``due_at`` is when the pending chunk is due (a time
    cut, on the caller's clock): ``first_line_seconds`` after its first line, but not before
    ``flush_seconds`` after the last cut (``cut(now)``); ``None`` while none is pending.
    """

    def __init__(
        self,
        *,
        max_bytes: int,
        phase: Phase = Phase.INIT,
        flush_seconds: float = FLUSH_SECONDS,
        first_line_seconds: float = FIRST_LINE_SECONDS,
        max_text_bytes: int = MAX_CHUNK_TEXT_BYTES,
        max_escaped_bytes: int = MAX_CHUNK_ESCAPED_BYTES,
    ) -> None:
        self.phase = phase
        self.max_bytes = max_bytes
        #: Text bytes taken into the stream so far.
        self.streamed_bytes = 0
        self.truncated = False
        self.due_at: float | None = None
        self._flush_seconds = flush_seconds
        self._first_line_seconds = min(first_line_seconds, flush_seconds)
        #: When the last chunk was cut (None: none yet, or not told).
        self._last_cut: float | None = None
        self._max_text = max_text_bytes
        self._max_escaped = max_escaped_bytes
        self._lines: list[str] = []
        self._text_bytes = 0
        self._escaped_bytes = 0
        #: The next line is the first of its phase: its chunk is due at once.
        self._fresh = True
        self._switch: tuple[Callable[[str], bool], Phase] | None = None

    def add(self, line: str, now: float) -> list[Piece]:
        """Take one line (ending in a newline)."""
        if self.truncated:
            return []
        size = _text_size(line)
        if self.streamed_bytes + size > self.max_bytes:
            self.truncated = True
            cap = format_size(self.max_bytes)
            notice = f"[po-runner] log stream truncated at {cap}: later lines are not streamed\n"
            return [*self.cut(now), Piece(self.phase, notice)]
        self.streamed_bytes += size
        escaped = _escaped_size(line)
        cut: list[Piece] = []
        if self._lines and (
            self._text_bytes + size > self._max_text or self._escaped_bytes + escaped > self._max_escaped
        ):
            cut.extend(self.cut(now))
        if size <= self._max_text and escaped <= self._max_escaped:
            self._append(line, size, escaped, now)
        else:
            *full, last = _split(line, self._max_text, self._max_escaped)
            cut.extend(Piece(self.phase, piece) for piece in full)
            self._fresh = False
            self._append(last, _text_size(last), _escaped_size(last), now)
        if self._switch is not None and self._switch[0](line):
            _, phase = self._switch
            self._switch = None
            cut.extend(self.set_phase(phase))
        return cut

    def set_phase(self, phase: Phase) -> list[Piece]:
        """A new phase: the pending chunk (of the phase before) is cut."""
        if phase == self.phase:
            return []
        cut = self.cut()
        self.phase = phase
        self._fresh = True
        return cut

    def switch_after(self, predicate: Callable[[str], bool], phase: Phase) -> None:
        """Change to ``phase`` after the first line ``predicate`` is true of (that line ends the phase
        before); once."""
        self._switch = (predicate, phase)

    def cut(self, now: float | None = None) -> list[Piece]:
        """The pending chunk, if any; ``now``: when (the next chunk is due ``flush_seconds`` after it at the
        soonest)."""
        if not self._lines:
            return []
        self._last_cut = now
        piece = Piece(self.phase, "".join(self._lines))
        self._lines.clear()
        self._text_bytes = self._escaped_bytes = 0
        self.due_at = None
        return [piece]

    def _append(self, line: str, size: int, escaped: int, now: float) -> None:
        if not self._lines:
            if self._fresh:
                self.due_at = now
            else:
                due = now + self._first_line_seconds
                if self._last_cut is not None:
                    due = max(due, self._last_cut + self._flush_seconds)
                self.due_at = due
            self._fresh = False
        self._lines.append(line)
        self._text_bytes += size
        self._escaped_bytes += escaped


def _text_size(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))


def _escaped_size(text: str) -> int:
    """Bytes of ``text`` as a JSON string's content (as pydantic writes it: UTF-8, not ASCII-escaped)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", errors="replace")) - 2


def _split(line: str, max_text: int, max_escaped: int) -> list[str]:
    """``line`` in pieces that each fit one chunk (the longest prefixes that fit; a binary search)."""

    def fits(piece: str) -> bool:
        return _text_size(piece) <= max_text and _escaped_size(piece) <= max_escaped

    pieces: list[str] = []
    rest = line
    while not fits(rest):
        low, high = 1, min(len(rest), max_text)
        while low < high:
            middle = (low + high + 1) // 2
            if fits(rest[:middle]):
                low = middle
            else:
                high = middle - 1
        pieces.append(rest[:low])
        rest = rest[low:]
    pieces.append(rest)
    return pieces


@dataclass(slots=True)
class _Queued:
    """A numbered, encrypted chunk waiting for delivery: in memory (``data``) or in the spill file."""

    seq: int
    phase: Phase
    size: int
    data: bytes | None
    offset: int = 0


class _SpillFile:
    """Undelivered chunks past the memory bound: an unlinked file, appended to, read at offsets."""

    def __init__(self, directory: str | None) -> None:
        self._file = tempfile.TemporaryFile(prefix=".po-log-stream-", dir=directory)
        self._fd = self._file.fileno()
        self.end = 0

    def append(self, data: bytes) -> int:
        offset, view, written = self.end, memoryview(data), 0
        while written < len(data):
            written += os.pwrite(self._fd, view[written:], offset + written)
        self.end += len(data)
        return offset

    def read(self, offset: int, size: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < size:
            part = os.pread(self._fd, size - got, offset + got)
            if not part:
                raise OSError(f"the log stream's spill file ends before {offset + size}")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def reset(self) -> None:
        os.ftruncate(self._fd, 0)
        self.end = 0

    def close(self) -> None:
        self._file.close()


class Stream:
    """No live log stream (no logs recipient, or streaming turned off): every call does nothing."""

    def set_phase(self, phase: Phase) -> None:
        """The run enters ``phase``."""

    def switch_after(self, predicate: Callable[[str], bool], phase: Phase) -> None:
        """The run enters ``phase`` after the first line ``predicate`` is true of."""

    def finish(self, *, drain_seconds: float) -> None:
        """Before the results: the last chunk cut and the queue delivered (bounded)."""

    def close(self) -> None:
        """The end of the run: nothing of the stream (its thread, its file) is left."""


#: What the sender makes of a chunk: the gateway's status, or why it gave up on the chunk and the stream.
_Outcome = int | str
_ABANDONED: Final = "abandoned"


class LogStream(Stream):
    """The stream of one deployment's log (see the module docstring). :meth:`open` starts it; whatever
    happens, :meth:`close` ends it (its thread joined, its spill file gone)."""

    def __init__(
        self,
        *,
        gateway: GatewayClient,
        env_uuid: str,
        deployment_id: str,
        recipient: str,
        log: RunnerLogger,
        max_bytes: int,
        backoff: Backoff,
        spill_dir: str | None = None,
        memory_bytes: int = QUEUE_MEMORY_BYTES,
        attempt_seconds: float = ATTEMPT_SECONDS,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self._gateway = gateway
        self._env_uuid = env_uuid
        self._deployment_id = deployment_id
        self._recipient = recipient
        self._log = log
        self._backoff = backoff
        self._spill_dir = spill_dir
        self._memory_limit = memory_bytes
        self._attempt_seconds = attempt_seconds
        self._cond = threading.Condition()
        self._chunker = Chunker(max_bytes=max_bytes, flush_seconds=flush_seconds)
        self._queue: deque[_Queued] = deque()
        self._memory_bytes = 0
        self._spill: _SpillFile | None = None
        self._spilled_waiting = 0
        self._next_seq = 1
        self._sink: LogBuffer | None = None
        self._closing = False
        self._abandoned = False
        self._off = False
        self._done = False
        self._drain_seconds = 0.0
        self._drain_deadline: float | None = None
        self._notes: list[tuple[str, dict[str, object]]] = []
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        #: What happened, for the run's last line and for tests.
        self.stored_chunks = 0
        self.last_stored_seq = 0
        self.spilled_chunks = 0
        self.peak_memory_bytes = 0

    # The producers' side: any thread writing a log line, the main thread for phases and the end.

    def open(self, sink: LogBuffer) -> None:
        """Start: the lines ``sink`` kept so far, then every line it gets, until :meth:`finish`."""
        self._sink = sink
        self._thread.start()
        sink.attach(self.line)

    def line(self, text: str) -> None:
        """One log line, redacted, ending in a newline (``LogBuffer``'s listener, under its lock)."""
        with self._cond:
            if self._closing or self._off:
                return
            was_due = self._chunker.due_at
            pieces = self._chunker.add(text, time.monotonic())
            self._enqueue(pieces)
            if pieces or (was_due is None and self._chunker.due_at is not None):
                self._cond.notify_all()

    def set_phase(self, phase: Phase) -> None:
        with self._cond:
            if self._closing or self._off:
                return
            self._enqueue(self._chunker.set_phase(phase))
            self._cond.notify_all()

    def switch_after(self, predicate: Callable[[str], bool], phase: Phase) -> None:
        with self._cond:
            self._chunker.switch_after(predicate, phase)

    def finish(self, *, drain_seconds: float) -> None:
        """Cut the last chunk and wait until the queue is delivered, as long as a chunk is stored at least
        every ``drain_seconds``; then give up on the rest (its attempt in flight ends within that time)."""
        self._detach()
        undelivered: tuple[int, int] | None = None
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._enqueue(self._chunker.cut())
            self._drain_seconds = drain_seconds
            self._drain_deadline = time.monotonic() + drain_seconds
            self._cond.notify_all()
            while not self._done:
                remaining = self._drain_deadline - time.monotonic()
                if remaining <= 0:
                    self._abandoned = True
                    self._cond.notify_all()
                    if self._queue:
                        undelivered = (len(self._queue), self._queue[0].seq)
                    break
                self._cond.wait(remaining)
        self._flush_notes()
        if undelivered is not None:
            count, first = undelivered
            self._log.warning(
                "log stream: chunks not delivered; the whole log is uploaded all the same",
                chunks=count,
                first_seq=first,
                drain_seconds=drain_seconds,
            )

    def close(self) -> None:
        self._detach()
        with self._cond:
            self._closing = self._abandoned = True
            self._cond.notify_all()
        if self._thread.is_alive():
            # Its attempt in flight waits at most attempt_seconds (less while draining).
            self._thread.join(self._attempt_seconds + 1)
        with self._cond:
            if not self._thread.is_alive() and self._spill is not None:
                self._spill.close()
                self._spill = None
        self._flush_notes()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _detach(self) -> None:
        # Not under self._cond: LogBuffer calls line() under its lock.
        if self._sink is not None:
            self._sink.detach()
            self._sink = None

    def _enqueue(self, pieces: list[Piece]) -> None:
        """Number, encrypt and queue ``pieces`` (under the lock)."""
        for piece in pieces:
            if self._off:
                return
            seq = self._next_seq
            try:
                data = self._encrypt(seq, piece)
            except Exception as exc:  # pyrage, pydantic: the whole log still has every line
                self._turn_off()
                self._notes.append(
                    ("log stream: a chunk could not be encrypted; streaming stopped", {"reason": str(exc)})
                )
                return
            self._next_seq += 1
            if self._memory_bytes + len(data) <= self._memory_limit:
                self._keep(_Queued(seq, piece.phase, len(data), data))
                continue
            try:
                if self._spill is None:
                    self._spill = _SpillFile(self._spill_dir)
                offset = self._spill.append(data)
            except OSError as exc:
                # Nowhere to wait: this number says so instead, and nothing more is streamed.
                self._chunker.truncated = True
                self._chunker.cut()
                notice = f"[po-runner] log stream truncated: undelivered chunks could not be kept ({exc})\n"
                self._keep(_Queued(seq, piece.phase, 0, self._encrypt(seq, Piece(piece.phase, notice))))
                self._notes.append(
                    (
                        "log stream: undelivered chunks could not be kept; the stream ends here",
                        {"reason": str(exc)},
                    )
                )
                return
            self._queue.append(_Queued(seq, piece.phase, len(data), None, offset))
            self._spilled_waiting += 1
            self.spilled_chunks += 1

    def _encrypt(self, seq: int, piece: Piece) -> bytes:
        ciphertext = encrypt_chunk(self._deployment_id, seq, piece.phase, piece.text, self._recipient)
        return ciphertext.encode("ascii")

    def _keep(self, queued: _Queued) -> None:
        assert queued.data is not None
        queued.size = len(queued.data)
        self._queue.append(queued)
        self._memory_bytes += queued.size
        self.peak_memory_bytes = max(self.peak_memory_bytes, self._memory_bytes)

    def _turn_off(self) -> None:
        """No more streaming (under the lock): the queue and the pending lines dropped."""
        self._off = True
        self._queue.clear()
        self._memory_bytes = self._spilled_waiting = 0
        self._chunker.cut()
        self._cond.notify_all()

    # The sender thread.

    def _run(self) -> None:
        try:
            while True:
                self._flush_notes()
                queued = self._next()
                if queued is None:
                    return
                data = queued.data
                if data is None:
                    assert self._spill is not None
                    try:
                        data = self._spill.read(queued.offset, queued.size)
                    except OSError as exc:
                        self._stop(
                            "log stream: a chunk could not be read back; streaming stopped", reason=str(exc)
                        )
                        return
                outcome = self._deliver(queued, data)
                if not self._settle(queued, outcome):
                    return
        except Exception:  # A bug here must not take the run down: the whole log is still uploaded.
            self._stop("log stream: unexpected error; streaming stopped", exc_info=True)
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()
            self._flush_notes()

    def _next(self) -> _Queued | None:
        """The chunk to send next (cutting the pending chunk when due and nothing else waits), or None: the
        stream is over."""
        with self._cond:
            while True:
                if self._abandoned or self._off:
                    return None
                if self._queue:
                    return self._queue[0]
                due, now = self._chunker.due_at, time.monotonic()
                if due is not None and (self._closing or now >= due):
                    self._enqueue(self._chunker.cut(now))
                    continue
                if self._closing:
                    return None
                self._cond.wait(None if due is None else due - now)

    def _deliver(self, queued: _Queued, data: bytes) -> _Outcome:
        """Send one chunk until the gateway answers it (or the stream is given up)."""
        attempt = 0
        outage = False
        while True:
            with self._cond:
                if self._abandoned:
                    return _ABANDONED
                timeout = self._attempt_seconds
                if self._drain_deadline is not None:
                    timeout = min(timeout, max(MIN_ATTEMPT_SECONDS, self._drain_deadline - time.monotonic()))
            try:
                status = self._gateway.put_log_chunk(
                    self._env_uuid,
                    self._deployment_id,
                    queued.seq,
                    queued.phase,
                    data,
                    timeout_seconds=timeout,
                )
            except ClientError as exc:
                if not exc.retryable:
                    return (
                        f"log stream: the runner gateway refused a chunk; streaming stopped ({exc.message})"
                    )
                if not outage:
                    outage = True
                    self._log.warning(
                        "log stream: the runner gateway is unavailable; the chunks wait and are sent again",
                        seq=queued.seq,
                        reason=exc.message,
                    )
                attempt += 1
                with self._cond:
                    self._cond.wait_for(lambda: self._abandoned, self._backoff.delay(attempt))
                continue
            if outage:
                self._log.info(
                    "log stream: the runner gateway took the chunk again",
                    seq=queued.seq,
                    attempts=attempt + 1,
                )
            return status

    def _settle(self, queued: _Queued, outcome: _Outcome) -> bool:
        """What the answer means for the queue; False: the stream is over."""
        if outcome == _ABANDONED:
            return False
        if isinstance(outcome, str):
            self._stop(outcome)
            return False
        if outcome in (404, 405) and self.stored_chunks == 0 and queued.seq == 1:
            self._stop(
                f"the runner gateway does not take live log chunks ({outcome}): streaming is off for this "
                "run; the whole log is uploaded at the end",
                level="info",
            )
            return False
        if outcome in (404, 405, 410):
            reason = (
                "the deployment has ended" if outcome == 410 else "the gateway no longer takes its chunks"
            )
            self._stop(f"log stream: {reason} ({outcome}); streaming stopped", seq=queued.seq)
            return False
        with self._cond:
            self._queue.popleft()
            if queued.data is None:
                self._spilled_waiting -= 1
                if self._spilled_waiting == 0 and self._spill is not None:
                    self._spill.reset()
            else:
                self._memory_bytes -= queued.size
            if outcome == 202:
                self.stored_chunks += 1
                self.last_stored_seq = queued.seq
                if self._drain_deadline is not None:
                    self._drain_deadline = time.monotonic() + self._drain_seconds
            self._cond.notify_all()
        if outcome == 409:
            self._log.warning(
                "log stream: the gateway holds other bytes for this chunk (409)", seq=queued.seq
            )
        elif outcome == 413:
            self._log.warning("log stream: the gateway refused this chunk as too large (413)", seq=queued.seq)
        return True

    def _stop(self, event: str, *, level: str = "warning", **kw: object) -> None:
        with self._cond:
            self._turn_off()
        if level == "info":
            self._log.info(event, **kw)
        else:
            self._log.warning(event, **kw)

    def _flush_notes(self) -> None:
        with self._cond:
            notes, self._notes = self._notes, []
        for event, kw in notes:
            self._log.warning(event, **kw)
