"""The Kubernetes launcher of the cloud runner types (``kubernetes-gke``, ``kubernetes-eks``,
``kubernetes-aks``): the same Job as ``kubernetes``, on a cluster whose access comes from a cloud.

Composition, not a second Kubernetes client: a :class:`ClusterAccessSource` turns the runner's
configuration and the orchestrator's workload identity into a :class:`ClusterAccess` (the cluster's URL
and CA, a short-lived bearer token) by the cloud's exchange; :class:`CloudKubernetesLauncher` asks it for
an access at every launch, status check and cancel and hands the call to a
:class:`~orchestrator.launchers.kubernetes.KubernetesLauncher` built on that access.

The server builds a launcher per call, so accesses are cached in an :class:`AccessCache` the server
keeps (one per process), by :func:`access_key`, until ``margin_seconds`` before their token expires. An
answer 401 from the cluster drops the cached access, so the next call exchanges again.

A source raises :class:`LaunchError` naming what refused ("Google STS refused the workload identity
token: ..."), ``retryable`` False when asking again cannot help; its messages never hold a token, an
assertion or another credential (:func:`redacted` helps).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from lightkube import ApiError

from orchestrator.launchers.base import Launched, LaunchError, LaunchTarget, RunState, RunStatus
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from orchestrator.protocol.launch import RunSpec

__all__ = [
    "REFRESH_MARGIN_SECONDS",
    "AccessCache",
    "CloudKubernetesLauncher",
    "ClusterAccessSource",
    "ExpiringAccess",
    "access_key",
    "redacted",
]

#: An access is exchanged again this long before its token expires.
REFRESH_MARGIN_SECONDS: Final = 120.0


@dataclass(frozen=True, kw_only=True)
class ExpiringAccess:
    """A cluster access and when its token expires (``time.time()`` seconds)."""

    access: ClusterAccess
    expires_at: float


class ClusterAccessSource(Protocol):
    """Exchanges the orchestrator's workload identity for access to one cluster (one per cloud)."""

    async def cluster_access(self) -> ExpiringAccess:
        """A fresh access; :class:`LaunchError` naming the refusal, never quoting a credential."""
        ...


def access_key(target: LaunchTarget) -> str:
    """The cache key of a runner's access: its identity and whole configuration (a changed runner gets a
    new access)."""
    document = json.dumps(
        [target.runner_type, target.org_id, target.runner_id, target.configuration],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(document.encode()).hexdigest()


class AccessCache:
    """Cluster accesses by :func:`access_key`, each until ``margin_seconds`` before its token expires.
    Concurrent calls for one key share one exchange."""

    def __init__(
        self, *, margin_seconds: float = REFRESH_MARGIN_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.margin_seconds = margin_seconds
        self._clock = clock
        self._entries: dict[str, ExpiringAccess] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, key: str, source: ClusterAccessSource) -> ClusterAccess:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is None or not self._fresh(entry):
                self._entries.pop(key, None)
                entry = await source.cluster_access()
                self._entries[key] = entry
            self._prune()
            return entry.access

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def _fresh(self, entry: ExpiringAccess) -> bool:
        return entry.expires_at - self.margin_seconds > self._clock()

    def _prune(self) -> None:
        for key in [k for k, entry in self._entries.items() if not self._fresh(entry)]:
            del self._entries[key]
        for key in [k for k, lock in self._locks.items() if k not in self._entries and not lock.locked()]:
            del self._locks[key]


class CloudKubernetesLauncher:
    """A :class:`KubernetesLauncher` on a fresh access from ``source`` for each call. ``options`` go to
    the Kubernetes launcher (``image``, ``scheduling_delay_seconds``, ``token_in_secret``);
    ``hint_on_unauthorized`` is appended to a launch's or cancel's 401 from the cluster (how the cloud
    maps the identity to a Kubernetes user)."""

    def __init__(
        self,
        source: ClusterAccessSource,
        *,
        egress: EgressPolicy | None,
        cache: AccessCache | None = None,
        cache_key: str = "",
        hint_on_unauthorized: str | None = None,
        **options: Any,
    ) -> None:
        self.source = source
        self.egress = egress
        self.cache = cache if cache is not None else AccessCache()
        self.cache_key = cache_key
        self.hint_on_unauthorized = hint_on_unauthorized
        self.options = options

    async def _kubernetes(self) -> KubernetesLauncher:
        access = await self.cache.get(self.cache_key, self.source)
        return KubernetesLauncher(access, egress=self.egress, **self.options)

    async def launch(self, spec: RunSpec) -> str | Launched:
        kubernetes = await self._kubernetes()
        try:
            return await kubernetes.launch(spec)
        except LaunchError as exc:
            self._unauthorized(exc)
            raise

    async def status(self, handle: str) -> RunStatus:
        try:
            kubernetes = await self._kubernetes()
        except LaunchError as exc:
            return RunStatus(state=RunState.UNKNOWN, detail=exc.message)
        status = await kubernetes.status(handle)
        # The Kubernetes launcher reports API errors as UNKNOWN with the answer in the detail
        # (``kubernetes.answer_summary``: "...: 401 Unauthorized..."): a revoked token is exchanged again.
        if status.state is RunState.UNKNOWN and ": 401 " in (status.detail or ""):
            self.cache.forget(self.cache_key)
        return status

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        kubernetes = await self._kubernetes()
        try:
            await kubernetes.cancel(handle, grace_seconds=grace_seconds)
        except LaunchError as exc:
            self._unauthorized(exc)
            raise

    def _unauthorized(self, exc: LaunchError) -> None:
        """On the cluster's 401: forget the access, and raise ``exc`` with the hint when there is one."""
        cause = exc.__cause__
        if not isinstance(cause, ApiError):
            return
        code = cause.response.status_code if cause.response is not None else cause.status.code
        if code != 401:
            return
        self.cache.forget(self.cache_key)
        if self.hint_on_unauthorized:
            hinted = LaunchError(f"{exc.message} ({self.hint_on_unauthorized})")
            hinted.retryable = exc.retryable
            raise hinted from cause


# --- for the sources ----------------------------------------------------------------------------------


def redacted(text: str, secrets: list[str]) -> str:
    """``text`` with every occurrence of each secret (a token, an assertion) replaced by ``[redacted]``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text
