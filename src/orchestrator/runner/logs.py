"""The runner's log: every runner log line and IaC output line, echoed and kept (capped) for upload.

Upstream keeps the first 10 MiB; so do we. The cap counts UTF-8 bytes of the plain text; a notice
"log truncated at <cap>" is always kept within it, so the uploaded text says it is incomplete.
A listener (the live log stream, ``runner.log_stream``) gets every line after redaction, the cap
notwithstanding.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TextIO

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
        self._listener: Callable[[str], None] | None = None

    def write_line(self, line: str) -> None:
        """Add one line (a trailing newline is added)."""
        text = self._redact(line.rstrip("\n")) + "\n"
        with self._lock:
            self._echo_text(text)
            self._keep(text.encode("utf-8", errors="replace"))
            self._tell(text)

    def attach(self, listener: Callable[[str], None]) -> None:
        """From now on, call ``listener`` with every line (redacted, ending in a newline), in order, under
        this buffer's lock (it must not write to this buffer); first with the lines kept so far. A listener
        that raises is detached."""
        with self._lock:
            self._listener = listener
            kept = b"".join(self._chunks).decode("utf-8", errors="replace")
            for line in kept.split("\n")[:-1]:
                self._tell(line + "\n")

    def detach(self) -> None:
        with self._lock:
            self._listener = None

    def _tell(self, text: str) -> None:
        if self._listener is None:
            return
        try:
            self._listener(text)
        except Exception:  # A broken listener must not break the run: the log is kept all the same.
            self._listener = None

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


#: Numeric levels (as ``logging``'s) by ``LOG_LEVEL`` value; unknown values mean info.
_LEVELS = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40, "critical": 50}


class RunnerLogger:
    """A JSON-lines logger writing to a ``LogBuffer``: ``log.info("event", key=value)``.

    It writes exactly what structlog's ``make_filtering_bound_logger`` did here with the processors
    ``add_log_level``, ``TimeStamper(fmt="iso", utc=True, key="time")``, ``format_exc_info`` and
    ``JSONRenderer()`` (the bound context, the keywords, ``event``, ``level``, ``time``, then
    ``exception`` when there is one), without importing structlog: its package imports asyncio and
    rich's tracebacks (about 70 ms of the runner's start, paid on every deployment).
    """

    def __init__(self, sink: LogBuffer, *, min_level: int, context: dict[str, Any]) -> None:
        self._sink = sink
        self._min_level = min_level
        self._context = context

    def bind(self, **context: Any) -> RunnerLogger:
        """A logger with ``context`` added to every line."""
        return RunnerLogger(self._sink, min_level=self._min_level, context={**self._context, **context})

    def debug(self, event: str, *args: Any, **kw: Any) -> None:
        self._log(10, "debug", event, args, kw)

    def info(self, event: str, *args: Any, **kw: Any) -> None:
        self._log(20, "info", event, args, kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> None:
        self._log(30, "warning", event, args, kw)

    warn = warning

    def error(self, event: str, *args: Any, **kw: Any) -> None:
        self._log(40, "error", event, args, kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> None:
        """An error line with the traceback of the exception being handled (``exc_info=True``)."""
        kw.setdefault("exc_info", True)
        self._log(40, "error", event, args, kw)

    def critical(self, event: str, *args: Any, **kw: Any) -> None:
        self._log(50, "critical", event, args, kw)

    def _log(self, level: int, name: str, event: str, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        if level < self._min_level:
            return
        if args:
            single_mapping = len(args) == 1 and isinstance(args[0], Mapping) and args[0]
            event = event % (args[0] if single_mapping else args)
        line = {**self._context, **kw, "event": event, "level": name}
        line["time"] = datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")
        exc_info = _exc_info(line.pop("exc_info", None))
        if exc_info is not None:
            line["exception"] = _format_exception(exc_info)
        self._sink.write_line(json.dumps(line, default=_json_fallback))


def make_logger(sink: LogBuffer, *, level: str, **context: Any) -> RunnerLogger:
    """A JSON-lines logger writing to ``sink``, bound to ``context``; no global configuration."""
    logger = RunnerLogger(sink, min_level=_LEVELS.get(level.lower(), _LEVELS["info"]), context=dict(context))
    if level.lower() not in _LEVELS:
        logger.warning("unknown LOG_LEVEL, using info", log_level=level)
    return logger


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _exc_info(value: Any) -> _ExcInfo | None:
    """``exc_info=`` as structlog reads it: an exception, an ``exc_info`` tuple, or true (the current one)."""
    if isinstance(value, BaseException):
        return (value.__class__, value, value.__traceback__)
    if isinstance(value, tuple) and len(value) == 3:
        kind, exc, tb = value
        if isinstance(kind, type) and issubclass(kind, BaseException) and isinstance(exc, BaseException):
            if tb is None or isinstance(tb, TracebackType):
                return (kind, exc, tb)
    if value:
        kind, exc, tb = sys.exc_info()
        if kind is not None and exc is not None:
            return (kind, exc, tb)
    return None


def _format_exception(exc_info: _ExcInfo) -> str:
    import traceback

    text = "".join(traceback.format_exception(*exc_info))
    return text[:-1] if text.endswith("\n") else text


def _json_fallback(value: Any) -> Any:
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)
