"""structlog configuration, shared by every process (server, agent, managed runner).

One line per event on stderr, as JSON (``PO_LOG_FORMAT=json``, the default when stderr is not a terminal)
or as ``key=value`` text (``console``, the default on a terminal). Every line has ``event``, ``level`` and
``time`` (ISO 8601, UTC), then the context: what structlog's context variables hold (``request_id`` while a
request is served, a deployment's ``org_id``/``env_id``/``deployment_id`` where one is handled) and the
event's own keys; ``logger`` names the library of a standard ``logging`` line (uvicorn, httpx, ...), which
goes through the same renderer.

Secrets are kept out of logs by not logging them; :func:`redact` is the safety net: a value under a
secret-looking key (``token``, ``authorization``, ``password``, ``secret``, ``private_key``, ...) and
text that looks like a credential (a PEM private key, an age identity, a bearer or basic credential, a
JWT) are replaced by ``[REDACTED]`` in every line.

``po-runner standard`` writes its own lines (``runner.logs``: the same fields, JSON always, since they are
the deployment's log), without structlog: it must start fast.
"""

from __future__ import annotations

import itertools
import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Final, TextIO

import structlog

#: Libraries whose DEBUG lines print whole requests and answers (web identity tokens, AWS session tokens
#: and credentials, signatures): held at INFO or above, whatever the level asked for.
CHATTY: Final = ("botocore", "boto3", "s3transfer", "urllib3")
#: Libraries held at WARNING or above whatever the level: SQLAlchemy's engine logs every statement with its
#: parameters at INFO (token digests, sealed secrets), aiosqlite every call with its arguments at DEBUG;
#: httpcore's DEBUG is connection tracing.
QUIET: Final = ("sqlalchemy", "aiosqlite", "asyncpg", "httpcore")

FORMATS: Final = ("json", "console")
#: Level names accepted by ``PO_LOG_LEVEL`` (and the agent's ``LOG_LEVEL``), as ``logging``'s numbers.
LEVELS: Final = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40, "critical": 50}
#: The environment variables read by :func:`from_environ`, the first one set wins.
LEVEL_VARIABLES: Final = ("PO_LOG_LEVEL", "LOG_LEVEL")
FORMAT_VARIABLE: Final = "PO_LOG_FORMAT"

REDACTED: Final = "[REDACTED]"
#: Words that make a key secret-looking (matched on the key's words: ``x-deployment-token``, ``apiToken``,
#: ``private_key_pem`` ...), unless its last word says it only names or counts one (``token_id``).
_SECRET_WORDS: Final = frozenset(
    {
        "token",
        "tokens",
        "authorization",
        "password",
        "passwd",
        "secret",
        "secrets",
        "credential",
        "credentials",
        "cookie",
        "privatekey",
        "apikey",
        "decryptkey",
        "identity",
        "passphrase",
    }
)
_SECRET_PAIRS: Final = frozenset({("private", "key"), ("api", "key"), ("access", "key"), ("decrypt", "key")})
_NAMING_WORDS: Final = frozenset(
    {"id", "ids", "count", "kind", "type", "name", "names", "hint", "length", "uses"}
)
_WORD: Final = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
#: Text that is a credential wherever it appears.
_SECRET_TEXT: Final = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)"
    r"|AGE-SECRET-KEY-1[0-9A-Z]+"
    # A credential after the scheme: 8 or more token characters, not all letters ("Basic authentication").
    r"|\b(?:Bearer|Basic)\s+(?=[A-Za-z]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,}"
    r"|\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
    re.DOTALL,
)


def secret_key(key: str) -> bool:
    """Whether a value logged under ``key`` would be a credential (``authorization``, ``api_token``,
    ``PRIVATE_KEY``, ``X-Deployment-Token``) rather than about one (``token_id``, ``secret_names``)."""
    words = [word.lower() for word in _WORD.findall(key)]
    if not words or words[-1] in _NAMING_WORDS:
        return False
    return any(word in _SECRET_WORDS for word in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def redact_value(value: Any) -> Any:
    """``value`` with what looks like a credential replaced: in text, mappings and sequences, at any depth."""
    if isinstance(value, str):
        return _SECRET_TEXT.sub(REDACTED, value) if _maybe_secret_text(value) else value
    if isinstance(value, Mapping):
        return {
            k: REDACTED if isinstance(k, str) and secret_key(k) else redact_value(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(item) for item in value)
    return value


def _maybe_secret_text(text: str) -> bool:
    # A cheap first look, so that ordinary lines skip the regular expression.
    return (
        "PRIVATE KEY" in text
        or "AGE-SECRET-KEY" in text
        or "Bearer" in text
        or "Basic" in text
        or "eyJ" in text
    )


def redact(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The structlog processor: secret-looking keys and credential-looking text become ``[REDACTED]``."""
    for key, value in list(event_dict.items()):
        if secret_key(key):
            event_dict[key] = REDACTED
        elif not isinstance(value, int | float | bool) and value is not None:
            event_dict[key] = redact_value(value)
    return event_dict


def quiet_chatty_libraries() -> None:
    """Keep the loggers of ``CHATTY`` at INFO or above, those of ``QUIET`` at WARNING or above (a level set
    higher stays)."""
    for names, floor in ((CHATTY, logging.INFO), (QUIET, logging.WARNING)):
        for name in names:
            logger = logging.getLogger(name)
            logger.setLevel(max(logger.level, floor))


def from_environ(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """``(level, format)`` from ``PO_LOG_LEVEL`` (or ``LOG_LEVEL``, upstream's name for the agent) and
    ``PO_LOG_FORMAT``; the format is ``None`` when not set. Raises ``ValueError`` naming the variable."""
    level = next((environ[name] for name in LEVEL_VARIABLES if environ.get(name)), "info")
    if level.lower() not in LEVELS:
        raise ValueError(f"{_level_variable(environ)}: {level!r} is not one of {', '.join(LEVELS)}")
    fmt = environ.get(FORMAT_VARIABLE) or None
    if fmt is not None and fmt.lower() not in FORMATS:
        raise ValueError(f"{FORMAT_VARIABLE}: {fmt!r} is not one of {', '.join(FORMATS)}")
    return level.lower(), None if fmt is None else fmt.lower()


def _level_variable(environ: Mapping[str, str]) -> str:
    return next((name for name in LEVEL_VARIABLES if environ.get(name)), LEVEL_VARIABLES[0])


def resolved_format(fmt: str | None, stream: TextIO) -> str:
    """``fmt``, or JSON unless ``stream`` is a terminal."""
    if fmt is not None:
        return fmt
    try:
        return "console" if stream.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


class _StdlibHandler(logging.Handler):
    """Sends standard ``logging`` records through the structlog renderer, to the same writer."""

    def __init__(self, writer: structlog.WriteLogger, formatter: logging.Formatter) -> None:
        super().__init__()
        self.writer = writer
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.msg(self.format(record))
        except Exception:  # logging's own contract: a failing handler reports and goes on
            self.handleError(record)


def configure(level: str = "info", *, fmt: str | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog and the standard ``logging`` of this process: ``level`` (a name of
    :data:`LEVELS`; unknown: info, said in a warning line) and ``fmt`` (``json``, ``console``, or ``None``:
    :func:`resolved_format`), both written to ``stream`` (stderr)."""
    out = sys.stderr if stream is None else stream
    numeric = LEVELS.get(level.lower(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if resolved_format(fmt, out) == "json"
        else structlog.dev.ConsoleRenderer(colors=False, timestamp_key="time")
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True, key="time")
    writer = structlog.WriteLogger(out)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            # Before the renderer, so that a console traceback is plain text (rich's would show locals).
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_args: writer,
        # Not cached: a later configure applies to every logger (a few lines a request: no measurable cost).
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            timestamper,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redact,
            renderer,
        ],
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_StdlibHandler(writer, formatter))
    root.setLevel(numeric)
    # asyncssh (the vm runner over SSH) logs every connection and command at INFO: its warnings only,
    # unless debugging.
    logging.getLogger("asyncssh").setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    quiet_chatty_libraries()
    if level.lower() not in LEVELS:
        structlog.get_logger("orchestrator.logs").warning("unknown log level, using info", log_level=level)
