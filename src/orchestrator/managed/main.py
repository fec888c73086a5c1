"""Wiring of one managed runner process: work directory, tags, client, signals; ``po-runner managed``
calls :func:`serve`."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from orchestrator import errors
from orchestrator.managed import child
from orchestrator.managed.client import ManagedClient
from orchestrator.managed.loop import ManagedRunner
from orchestrator.managed.settings import ManagedSettings
from orchestrator.managed.tags import detect_tags


async def serve(
    settings: ManagedSettings, *, stop: asyncio.Event | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``): 0; a definite refusal: 1; ``ConfigurationError`` if it
    cannot start (the work directory, the CA)."""
    environ = os.environ if environ is None else environ
    try:
        await asyncio.to_thread(child.prepare_work_root, settings.runner_work_dir)
    except OSError as exc:
        raise errors.ConfigurationError(
            f"RUNNER_WORK_DIR {settings.runner_work_dir} cannot be used: {exc.strerror or exc}"
        ) from exc
    tags = await asyncio.to_thread(detect_tags, environ, settings.extra_tags)
    client = ManagedClient(
        settings.runner_url, timeout_seconds=settings.runner_request_timeout_seconds, tls=settings.tls()
    )
    runner = ManagedRunner(settings=settings, client=client, tags=tags, path=environ.get("PATH"))
    stop = stop or asyncio.Event()

    def signalled() -> None:
        # The first signal stops claiming and lets the running deployment finish; a second one hurries it.
        if stop.is_set():
            runner.hurry.set()
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled)
    try:
        return await runner.run(stop)
    finally:
        await client.aclose()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
