"""The registered agent keys of runners, cached for ``PO_AGENT_PUBLIC_KEY_CACHE_SECONDS``: the Ed25519 key of
a ``kubernetes-agent`` runner (``runner_configuration.key``) or of a ``vm`` runner with an agent connection
(``runner_configuration.connection.key``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from orchestrator.domain.key_material import load_agent_public_key
from orchestrator.domain.runner_types import agent_public_key
from orchestrator.store import runners as runner_store
from orchestrator.web.services import Services


@dataclass(kw_only=True)
class AgentKeys:
    max_age_seconds: float
    _keys: dict[tuple[str, str], tuple[float, Ed25519PublicKey]] = field(default_factory=dict)

    async def get(self, svc: Services, org_id: str, runner_id: str) -> Ed25519PublicKey | None:
        """The runner's registered agent key, if it is an agent runner."""
        key = (org_id, runner_id)
        cached = self._keys.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.max_age_seconds:
            return cached[1]
        async with svc.reader.connect() as conn:
            runner = await runner_store.get_runner(conn, org_id, runner_id)
        pem = agent_public_key(runner.type, runner.configuration) if runner is not None else None
        if pem is None:
            self._keys.pop(key, None)
            return None
        try:
            public = load_agent_public_key(pem)
        except ValueError:
            return None
        self._keys[key] = (time.monotonic(), public)
        return public
