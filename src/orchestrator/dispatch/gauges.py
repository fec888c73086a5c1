"""What the metrics read from the database: the gauges of rows, set when ``/metrics`` is scraped, and the
runner type a deployment's counters are labelled with."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestrator import metrics
from orchestrator.domain.deployments import Deployment
from orchestrator.store import agent_commands as command_store
from orchestrator.store import deployments as store

#: The runner type label of a deployment whose runner no longer exists.
UNKNOWN_RUNNER_TYPE = "unknown"


async def runner_type(conn: AsyncConnection, deployment: Deployment) -> str:
    """The type of the deployment's runner, as a label."""
    return await store.runner_type(conn, deployment.org_id, deployment.runner_id) or UNKNOWN_RUNNER_TYPE


async def finished(conn: AsyncConnection, deployment: Deployment, *, status: str) -> None:
    """Count a deployment that became final (``po_deployments_finished_total``, by its final status)."""
    kind = await runner_type(conn, deployment)
    metrics.DEPLOYMENTS_FINISHED.labels(kind, str(status)).inc()


@dataclass(eq=False, kw_only=True)
class DatabaseGauges:
    """Sets ``po_deployments_running`` and ``po_agent_commands_pending`` from the database (every replica's
    work: the same value on each). A runner type seen once stays, at 0 when none of its deployments runs."""

    reader: AsyncEngine
    _seen: set[str] = field(default_factory=set)

    async def refresh(self) -> None:
        async with self.reader.connect() as conn:
            running = await store.executing_by_runner_type(conn)
            pending = await command_store.open_count(conn)
        self._seen |= running.keys()
        for kind in self._seen:
            metrics.DEPLOYMENTS_RUNNING.labels(kind).set(running.get(kind, 0))
        metrics.AGENT_COMMANDS_PENDING.set(pending)
