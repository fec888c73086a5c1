"""The launcher seam: every kind of compute (local process, Kubernetes Job, ECS task, ...) is one class."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from orchestrator.errors import OrchestratorError
from orchestrator.protocol.launch import RunSpec


class RunState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    #: The launcher cannot tell (for example the handle belongs to another host).
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class UnsavedState:
    """A Terraform state file an ended run left behind that its backend does not hold
    (``errored.tfstate``): the runner could not save it, nor hand it to the orchestrator."""

    #: Where it is, on the launcher's host.
    path: str
    data: bytes


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    state: RunState
    exit_code: int | None = None
    #: Why the run ended or is stuck, for the deployment's status message.
    detail: str | None = None
    #: State the ended run left behind unsaved (launchers that can see the run's files only).
    unsaved_state: UnsavedState | None = None


class LaunchError(OrchestratorError):
    """The runner could not be launched."""

    #: False when retrying cannot help (bad configuration, permission denied).
    retryable: bool = True


class Launcher(Protocol):
    """Starts runner executions; ``launch`` is idempotent per deployment."""

    async def launch(self, spec: RunSpec) -> str:
        """Start the run and return an opaque handle (``local:host:pid:start``, ``ns:job``, an ARN)."""
        ...

    async def status(self, handle: str) -> RunStatus: ...

    async def cancel(self, handle: str, *, grace_seconds: float) -> None: ...


@runtime_checkable
class KeepsUnsavedState(Protocol):
    """A launcher that keeps an ended run's unsaved state (``RunStatus.unsaved_state``) until told that
    the orchestrator saved it."""

    def forget_unsaved_state(self, handle: str) -> None: ...
