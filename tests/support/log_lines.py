"""Reading the processes' log lines in tests: JSON lines parsed, and secrets looked for in every line."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog

from orchestrator import logs

#: A token as the orchestrator makes them (32 random bytes in URL-safe base64: 43 characters; an API token
#: has ``po_`` before), or a JWT (an agent's).
_TOKEN_SHAPED = re.compile(
    r"(?<![A-Za-z0-9_-])(?:po_)?[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"
    r"|eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"
)
#: The loggers uvicorn's default logging config (``uvicorn.Config`` without ``log_config=None``) sets up.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
#: Lines of a PEM body shorter than this are not looked for on their own (the last line can be short).
_MIN_PEM_LINE = 16


#: A standard logger's level, ``propagate``, ``disabled`` and handlers.
LoggerState = tuple[int, bool, bool, list[logging.Handler]]
#: A logger nothing has configured: every line goes up to the root logger's handlers.
PRISTINE_LOGGER: LoggerState = (logging.NOTSET, True, False, [])


def logger_state(logger: logging.Logger) -> LoggerState:
    return logger.level, logger.propagate, logger.disabled, list(logger.handlers)


def restore_logger(logger: logging.Logger, state: LoggerState) -> None:
    level, propagate, disabled, handlers = state
    logger.setLevel(level)
    logger.propagate, logger.disabled = propagate, disabled
    logger.handlers[:] = handlers


def json_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The lines of ``text`` that are JSON objects, and those (not blank) that are not."""
    parsed: list[dict[str, Any]] = []
    other: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        if isinstance(value, dict):
            parsed.append(value)
        else:
            other.append(line)
    return parsed, other


def forms(secret: str) -> list[str]:
    """What to look for of ``secret``: itself, and for a PEM each long line of its body (a key printed
    without its header lines, or re-wrapped, is still found)."""
    found = [secret]
    if secret.startswith("-----BEGIN"):
        found += [
            line.strip()
            for line in secret.splitlines()
            if len(line.strip()) >= _MIN_PEM_LINE and not line.startswith("-----")
        ]
    return found


def secret_hits(logs: Mapping[str, str], secrets: Mapping[str, str]) -> list[str]:
    """``"<secret name> in <log name>: <line>"`` for each line of each log holding a form of a secret
    (JSON escapes undone too: a secret with a newline appears as ``\\n`` in a JSON line)."""
    hits: list[str] = []
    for log_name, text in logs.items():
        for line in text.splitlines():
            decoded = line.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
            for secret_name, secret in secrets.items():
                if any(form in line or form in decoded for form in forms(secret)):
                    hits.append(f"{secret_name} in {log_name}: {line[:300]}")
    return hits


def token_shaped(text: str) -> list[str]:
    """What in ``text`` looks like a token whose value a test cannot know (a managed runner's own token, an
    agent's JWT): 43 URL-safe base64 characters mixing digits, upper and lower case letters; or a JWT."""
    return [
        found
        for found in _TOKEN_SHAPED.findall(text)
        if found.startswith("eyJ")
        or (
            any(c.isdigit() for c in found)
            and any(c.isupper() for c in found)
            and any(c.islower() for c in found)
        )
    ]


@contextmanager
def configured(
    level: str = "debug", fmt: str | None = "json", stream: io.StringIO | None = None
) -> Iterator[io.StringIO]:
    """``logs.configure`` writing to a buffer (yielded), the process's logging restored afterwards."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    names = (*logs.CHATTY, *logs.QUIET, "asyncssh")
    levels = {name: logging.getLogger(name).level for name in names}
    # As ``orchestrator serve`` has them (uvicorn without its own logging config): a server an earlier
    # fixture ran with uvicorn's default config gave them handlers, levels and no propagation.
    uvicorn = [logging.getLogger(name) for name in UVICORN_LOGGERS]
    kept = [logger_state(logger) for logger in uvicorn]
    for logger in uvicorn:
        restore_logger(logger, PRISTINE_LOGGER)
    buffer = io.StringIO() if stream is None else stream
    logs.configure(level, fmt=fmt, stream=buffer)
    try:
        yield buffer
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(root_level)
        for name, value in levels.items():
            logging.getLogger(name).setLevel(value)
        for logger, state in zip(uvicorn, kept, strict=True):
            restore_logger(logger, state)
