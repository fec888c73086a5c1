"""Wiring of one managed runner process: work directory, tags, client, signals; ``po-runner managed``
calls :func:`serve`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from orchestrator import errors
from orchestrator.launchers import run_user
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser
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
    # The secret is in the settings now: out of the environment every child's could be built from.
    os.environ.pop("RUNNER_MANAGED_SECRET", None)
    uids = RunUids.from_setting(settings.runner_run_uids, settings.runner_work_dir, setting="RUNNER_RUN_UIDS")
    if uids is not None:
        _check_reachable(uids, settings.runner_work_dir)
    try:
        await asyncio.to_thread(
            child.prepare_work_root, settings.runner_work_dir, other_users=uids is not None
        )
    except OSError as exc:
        raise errors.ConfigurationError(
            f"RUNNER_WORK_DIR {settings.runner_work_dir} cannot be used: {exc.strerror or exc}"
        ) from exc
    tags = await asyncio.to_thread(detect_tags, environ, settings.extra_tags)
    client = ManagedClient(
        settings.runner_url, timeout_seconds=settings.runner_request_timeout_seconds, tls=settings.tls()
    )
    cgroups = RunCgroups.from_setting(
        settings.runner_run_cgroups, settings.runner_work_dir, setting="RUNNER_RUN_CGROUPS"
    )
    runner = ManagedRunner(
        settings=settings, client=client, tags=tags, path=environ.get("PATH"), uids=uids, cgroups=cgroups
    )
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
        if cgroups is not None:
            cgroups.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _check_reachable(uids: RunUids, work_root: Path) -> None:
    """The runs' uids must start this Python and pass through to their work directories: said at start,
    not as every deployment failing."""
    user = RunUser(name=f"uid {uids.uids.first}", uid=uids.uids.first, gid=uids.uids.first)
    needs = [*run_user.runner_paths(sys.executable), (work_root.parent, run_user.EXECUTE)]
    blocked = run_user.unreachable(user, needs)
    if blocked is not None:
        path, why = blocked
        raise errors.ConfigurationError(
            f"RUNNER_RUN_UIDS: deployments run as uids of {uids.uids.first}-{uids.uids.last}, which cannot "
            f"pass {path} ({why}); grant others traverse access (chmod o+x) on the way to the runner's "
            "Python and RUNNER_WORK_DIR, or set RUNNER_RUN_UIDS empty to run them as the runner's own user"
        )
