"""structlog configuration, shared by every process (server, agent, runner)."""

from __future__ import annotations

import logging
import sys
from typing import Final

import structlog

#: Libraries whose DEBUG lines print whole requests and answers (web identity tokens, AWS session tokens
#: and credentials, signatures): held at INFO or above, whatever the level asked for.
CHATTY: Final = ("botocore", "boto3", "s3transfer", "urllib3")


def quiet_chatty_libraries() -> None:
    """Keep the loggers of ``CHATTY`` at INFO or above (a level set higher stays)."""
    for name in CHATTY:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.level, logging.INFO))


def configure(level: str = "info", *, json: bool = False) -> None:
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    # asyncssh (the vm runner over SSH) logs every connection and command at INFO: its warnings only,
    # unless debugging.
    logging.getLogger("asyncssh").setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
    quiet_chatty_libraries()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
