"""Agent presence (``last_seen_at``): kept in memory per poll and written in one batch every
``PO_AGENT_PRESENCE_INTERVAL_SECONDS`` (``AgentGateway.run``), so a long poll costs no database write."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.store import agent_commands as store
from orchestrator.web.services import Services, transaction


@dataclass(kw_only=True)
class Presence:
    _seen: dict[tuple[str, str], datetime] = field(default_factory=dict)

    def seen(self, org_id: str, runner_id: str) -> None:
        """Note the agent's poll (written by ``flush``)."""
        self._seen[(org_id, runner_id)] = datetime.now(UTC)

    async def flush(self, svc: Services) -> None:
        """Write the polls noted since the last flush (one transaction)."""
        if not self._seen:
            return
        seen, self._seen = self._seen, {}
        try:
            async with transaction(svc) as conn:
                await store.touch_presences(conn, seen)
        except Exception:
            # Keep what was not written (unless newer polls came in meanwhile) for the next flush.
            self._seen = {**seen, **self._seen}
            raise
