"""Which launcher runs a command: the seam between the agent loop and the compute it launches on.

``vm`` runners (``connection: {type: agent}``) run ``po-runner standard`` as a local process, the same
``LocalLauncher`` the orchestrator uses for ``connection: {type: local}`` (as ``AGENT_RUN_USER`` when the
agent runs as root). ``kubernetes-agent`` runners get
their Job in the agent's cluster: ``kubernetes`` is a factory called with the command's payload
(``agent.kubernetes.kubernetes_launchers``); without it such commands are rejected as permanent errors.
``cluster`` (the same object, in ``po-runner remote``) finds the runs launched before a restart that have
not started yet, so the agent watches them again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.launchers.base import Launcher, LaunchError
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser
from orchestrator.protocol.commands import CreateJobPayload

#: Builds the launcher for one ``create-job`` payload (namespace, Job configuration).
LauncherFactory = Callable[[CreateJobPayload], Launcher]


@dataclass(frozen=True, kw_only=True)
class UnstartedRun:
    """A run this agent launched earlier (before a restart) whose pod has not started yet."""

    handle: str
    #: The command that launched it: the id of the events about it.
    command_id: str
    deployment_id: str
    job_id: str
    #: Since the run (its Job) was created.
    age_seconds: float


class LaunchedRuns(Protocol):
    """The agent's cluster, as far as resuming watches after a restart needs it."""

    def launcher(self) -> Launcher: ...

    async def unstarted_runs(self, org_id: str, runner_id: str) -> list[UnstartedRun]: ...


class PermanentLaunchError(LaunchError):
    """The agent cannot launch this run; trying again will not help."""

    retryable = False


class AgentLaunchers:
    def __init__(
        self,
        *,
        runs_dir: Path,
        environ: Mapping[str, str],
        run_user: RunUser | None = None,
        run_uids: RunUids | None = None,
        run_cgroups: RunCgroups | None = None,
        kubernetes: LauncherFactory | None = None,
        cluster: LaunchedRuns | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.local = LocalLauncher(
            runs_dir,
            environ=environ,
            run_user=run_user,
            run_uids=run_uids,
            run_cgroups=run_cgroups,
            user_setting="AGENT_RUN_USER",
            on_exit=on_exit,
        )
        self._kubernetes = kubernetes
        self.cluster = cluster

    def for_command(self, payload: CreateJobPayload) -> Launcher:
        runner_type = payload.spec.runner_type
        if runner_type == "vm":
            return self.local
        if runner_type == "kubernetes-agent" and self._kubernetes is not None:
            return self._kubernetes(payload)
        raise PermanentLaunchError(f"this agent cannot launch runs of runner type '{runner_type}'")

    @staticmethod
    def local_environment(payload: CreateJobPayload) -> bool:
        """Whether the run gets the agent's own additions as its job ``environment`` (the CA file path):
        only local processes share the agent's file system. Kubernetes Jobs get them in their pod template
        (``agent.kubernetes.job_with_agent_additions``)."""
        return payload.spec.runner_type == "vm"

    @staticmethod
    def watches_start(payload: CreateJobPayload) -> bool:
        """Whether the agent watches the run until its pod starts (a Job can stay pending forever)."""
        return payload.spec.runner_type == "kubernetes-agent"
