"""Wiring of one agent process: key, TLS, client, launchers, signals; ``po-runner remote`` calls ``serve``."""

from __future__ import annotations

import asyncio
import os
import signal

from orchestrator.agent import metrics
from orchestrator.agent.client import AgentClient
from orchestrator.agent.kubernetes import kubernetes_launchers
from orchestrator.agent.launchers import AgentLaunchers
from orchestrator.agent.loop import Agent
from orchestrator.agent.settings import AgentSettings
from orchestrator.client.gateway import RunnerGateway
from orchestrator.errors import ConfigurationError
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser, prepare_runs_dir
from orchestrator.protocol import agent_auth


async def serve(settings: AgentSettings, *, stop: asyncio.Event | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT (or ``stop``); ``ConfigurationError`` if it cannot start."""
    key = agent_auth.load_private_key(settings.private_key.get_secret_value())
    run_user = RunUser.resolve(settings.agent_run_user, setting="AGENT_RUN_USER")
    prepare_runs_dir(settings.agent_runs_dir, run_user, setting="AGENT_RUNS_DIR")
    uids = (
        RunUids.from_setting(settings.agent_run_uids, settings.agent_runs_dir, setting="AGENT_RUN_UIDS")
        if run_user is not None
        else None
    )
    cgroups = RunCgroups.from_setting(
        settings.agent_run_cgroups, settings.agent_runs_dir, setting="AGENT_RUN_CGROUPS"
    )
    # ConfigurationError here when the gateway CA or the mTLS pair cannot be loaded.
    client = AgentClient(
        gateway=RunnerGateway.of(settings, timeout_seconds=settings.agent_request_timeout_seconds),
        private_key=key,
        poll_timeout_seconds=settings.agent_poll_timeout_seconds,
    )
    stop = stop or asyncio.Event()
    # Off unless AGENT_METRICS_ADDR is set; an address that cannot be bound stops the agent here.
    exposed = _metrics_server(settings.agent_metrics_addr) if settings.agent_metrics_addr else None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        cluster = kubernetes_launchers(
            os.environ,
            scheduling_delay_seconds=settings.k8s_runner_pod_scheduling_delay,
            namespaces=settings.job_namespaces(),
        )
        launchers = AgentLaunchers(
            runs_dir=settings.agent_runs_dir,
            environ=os.environ,
            run_user=run_user,
            run_uids=uids,
            run_cgroups=cgroups,
            kubernetes=cluster,
            cluster=cluster,
            on_exit=metrics.run_finished,
        )
        # Local runs an earlier agent started go on without it; what a runner of theirs leaves behind
        # when it dies is stopped all the same.
        launchers.local.resume()
        await Agent(settings=settings, client=client, launchers=launchers).run(stop)
    finally:
        await client.aclose()
        if exposed is not None:
            exposed.close()
        if cgroups is not None:
            cgroups.close()  # only if no run is left in it: runs go on without the agent
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _metrics_server(address: str) -> metrics.MetricsServer:
    try:
        return metrics.MetricsServer(address)
    except OSError as exc:
        raise ConfigurationError(
            f"AGENT_METRICS_ADDR {address}: cannot listen: {exc.strerror or exc}"
        ) from exc
