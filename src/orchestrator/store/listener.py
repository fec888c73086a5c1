"""PostgreSQL LISTEN on one channel, on a connection of its own, reconnecting forever.

Used to hear what other server replicas commit (``agent_commands.announce``). After every (re)connect
``on_connected`` is called: a notification sent while the connection was down is lost, so the caller
treats a reconnect as "anything may have changed".
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy.engine import URL, make_url

from orchestrator.notify import sleep_unless_stopped

log = structlog.get_logger(__name__)

#: Longest wait between attempts to reconnect.
MAX_BACKOFF_SECONDS = 30.0
#: How often the idle connection is checked (a LISTEN connection that died says nothing otherwise).
HEALTH_CHECK_SECONDS = 10.0


def asyncpg_dsn(url: str | URL) -> str:
    """The libpq-style DSN asyncpg takes, from a SQLAlchemy ``postgresql+asyncpg://`` URL."""
    parsed = make_url(url) if isinstance(url, str) else url
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


async def listen(
    url: str | URL,
    channel: str,
    on_payload: Callable[[str], None],
    stop: asyncio.Event,
    *,
    on_connected: Callable[[], None] = lambda: None,
) -> None:
    """Call ``on_payload`` for every notification on ``channel`` until ``stop`` is set."""
    import asyncpg  # type: ignore[import-untyped]  # the driver; only servers on PostgreSQL come here

    dsn = asyncpg_dsn(url)
    failures = 0

    def received(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        on_payload(payload)

    while not stop.is_set():
        conn: Any = None
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
            await conn.add_listener(channel, received)
            failures = 0
            log.debug("listening", channel=channel)
            on_connected()
            while not await sleep_unless_stopped(stop, HEALTH_CHECK_SECONDS):
                await conn.execute("SELECT 1")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)
            log.warning(
                "PostgreSQL listener lost its connection", channel=channel, error=repr(exc), retry_in=delay
            )
            await sleep_unless_stopped(stop, delay)
        finally:
            if conn is not None:
                try:
                    await asyncio.wait_for(conn.close(), 5)
                except Exception:
                    conn.terminate()
