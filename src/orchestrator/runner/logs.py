"""The runner's log: every runner log line and IaC output line, echoed and kept (capped) for upload.

Upstream keeps the first 10 MiB; so do we. The cap counts UTF-8 bytes of the plain text; a notice
"log truncated at <cap>" is always kept within it, so the uploaded text says it is incomplete.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, TextIO

import structlog
from structlog.typing import FilteringBoundLogger

REDACTED = "[REDACTED]"
#: Secrets shorter than this are not redacted (they would blank out ordinary words).
_MIN_SECRET_LENGTH = 6


def format_size(num_bytes: int) -> str:
    """``10485760`` → ``"10 MiB"``, ``4096`` → ``"4 KiB"``, ``1500`` → ``"1500 bytes"``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= size and num_bytes % size == 0:
            return f"{num_bytes // size} {unit}"
    return f"{num_bytes} bytes"


class LogBuffer:
    """Thread-safe line sink: redacts secrets, echoes to ``echo``, keeps up to ``max_bytes`` for upload."""

    def __init__(self, *, max_bytes: int, echo: TextIO | None = None, secrets: Iterable[str] = ()) -> None:
        self.max_bytes = max_bytes
        self._echo = echo
        self._secrets = [s for s in secrets if len(s) >= _MIN_SECRET_LENGTH]
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._size = 0
        self._notice = f"[po-runner] log truncated at {format_size(max_bytes)}\n".encode()
        self.truncated = False

    def write_line(self, line: str) -> None:
        """Add one line (a trailing newline is added)."""
        text = self._redact(line.rstrip("\n")) + "\n"
        with self._lock:
            self._echo_text(text)
            self._keep(text.encode("utf-8", errors="replace"))

    def getvalue(self) -> bytes:
        """The kept text, ending with the truncation notice when the cap was hit."""
        with self._lock:
            return b"".join(self._chunks)

    def _keep(self, data: bytes) -> None:
        if self.truncated:
            return
        room = self.max_bytes - len(self._notice) - self._size
        if len(data) <= room:
            self._chunks.append(data)
            self._size += len(data)
            return
        # Whole lines only, so that every kept JSON line still parses; then say what happened.
        self.truncated = True
        self._chunks.append(self._notice)
        self._size += len(self._notice)
        self._echo_text(self._notice.decode())

    def _echo_text(self, text: str) -> None:
        if self._echo is None:
            return
        try:
            self._echo.write(text)
            self._echo.flush()
        except (OSError, ValueError):
            # The container log went away (closed pipe): keep running, the upload still has the lines.
            self._echo = None

    def _redact(self, line: str) -> str:
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED)
        return line


class _SinkLogger:
    """structlog's wrapped logger: every level writes the rendered JSON line to the ``LogBuffer``."""

    def __init__(self, sink: LogBuffer) -> None:
        self._sink = sink

    def msg(self, message: str) -> None:
        self._sink.write_line(message)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "warning": logging.WARNING}
_LEVELS |= {"error": logging.ERROR, "critical": logging.CRITICAL}


def make_logger(sink: LogBuffer, *, level: str, **context: Any) -> FilteringBoundLogger:
    """A JSON-lines structlog logger writing to ``sink``, bound to ``context``; no global configuration."""
    logger: FilteringBoundLogger = structlog.wrap_logger(
        _SinkLogger(sink),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level.lower(), logging.INFO)),
        context_class=dict,
        cache_logger_on_first_use=False,
    )
    logger = logger.bind(**context)
    if level.lower() not in _LEVELS:
        logger.warning("unknown LOG_LEVEL, using info", log_level=level)
    return logger
