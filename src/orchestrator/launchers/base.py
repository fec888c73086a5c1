"""The launcher seam: every kind of compute (local process, Kubernetes Job, ECS task, ...) is one class."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NoReturn, Protocol, runtime_checkable

from orchestrator.errors import OrchestratorError
from orchestrator.protocol.launch import RunSpec

#: Longest text of an answer (a cloud's, a host's) quoted in a launch error.
MAX_QUOTED: Final = 300


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


@dataclass(frozen=True, kw_only=True)
class LaunchTarget:
    """The runner a launch, a status check or a cancel is for, as the server's launcher factory gets it."""

    org_id: str
    runner_id: str
    runner_type: str
    #: The runner's full configuration, secrets included: only the launcher sees it.
    configuration: dict[str, Any]

    @property
    def subject(self) -> str:
        """The subject of the runner's workload identity tokens (upstream's ``{org_id}+{runner_id}``)."""
        return f"{self.org_id}+{self.runner_id}"


class WorkloadIdentity(Protocol):
    """The short-lived OIDC tokens the orchestrator, as an OIDC issuer, mints for one runner: what the
    cloud runner types (GKE, EKS, AKS, ECS) exchange for cloud credentials. No long-lived cloud
    credential is stored for them."""

    async def token(self, audience: str) -> str:
        """A signed JWT (``iss`` the orchestrator's public URL, ``sub`` ``{org_id}+{runner_id}``, ``aud``
        the given audience), valid for a few minutes."""
        ...


@dataclass(frozen=True, kw_only=True)
class Launched:
    """What ``launch`` may answer instead of a bare handle: the handle, with a note for the deployment's
    status message when the run was launched in a way its user should know about (and can change), such
    as the Kubernetes launcher's fallback to upstream's plain ``TOKEN`` when its Role allows no Secrets."""

    handle: str
    #: Said in the deployment's status message, while it executes and after it ended; never a secret.
    note: str | None = None


def launched(result: str | Launched) -> Launched:
    """``launch``'s answer, a bare handle or :class:`Launched`, as :class:`Launched`."""
    return result if isinstance(result, Launched) else Launched(handle=result)


class LaunchError(OrchestratorError):
    """The runner could not be launched."""

    #: False when retrying cannot help (bad configuration, permission denied).
    retryable: bool = True


def fail(message: str, *, retryable: bool, cause: BaseException | None = None) -> NoReturn:
    """Raise :class:`LaunchError` ``message`` with ``retryable`` set, from ``cause``."""
    error = LaunchError(message)
    error.retryable = retryable
    raise error from cause


def transient(status: int) -> bool:
    """Whether an HTTP error answer of ``status`` may pass by itself (429, 5xx): asking again can help."""
    return status == 429 or status >= 500


def shortened(text: str, limit: int = MAX_QUOTED) -> str:
    """Printable characters only, white space folded, at most ``limit`` of them: for quoting an answer."""
    cleaned = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


class Launcher(Protocol):
    """Starts runner executions; ``launch`` is idempotent per deployment."""

    async def launch(self, spec: RunSpec) -> str | Launched:
        """Start the run and return an opaque handle (``local:host:pid:start``, ``ns:job``, an ARN), or
        :class:`Launched` with the handle and a note for the deployment (read both with
        :func:`launched`)."""
        ...

    async def status(self, handle: str) -> RunStatus: ...

    async def cancel(self, handle: str, *, grace_seconds: float) -> None: ...


@runtime_checkable
class BoundedRuns(Protocol):
    """A launcher whose runs share a host with a limit on how many execute at once (local runs)."""

    def run_slots(self) -> tuple[str, int]:
        """The handle prefix of this host's runs, and how many of them may execute at once."""
        ...


@runtime_checkable
class KeepsUnsavedState(Protocol):
    """A launcher that keeps an ended run's unsaved state (``RunStatus.unsaved_state``) until told that
    the orchestrator saved it."""

    def forget_unsaved_state(self, handle: str) -> None: ...
