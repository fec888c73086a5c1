"""Authenticating an agent's request: a JWT (``protocol.agent_auth``) of the runner in the path, signed by
the runner's registered key (``gateway.agent_keys``), accepted once (``gateway.token_uses``). Every failure
is the same 401; the reason goes to the log only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from orchestrator.domain.managed import MANAGED_RUNNER_ID, NOT_AN_AGENT_MESSAGE
from orchestrator.errors import ForbiddenError, UnauthenticatedError
from orchestrator.gateway.agent_keys import AgentKeys
from orchestrator.gateway.token_uses import TokenUses
from orchestrator.protocol import agent_auth
from orchestrator.web.services import Services

log = structlog.get_logger(__name__)

#: The one answer to every authentication failure: nothing that tells an attacker what was wrong.
UNAUTHENTICATED = "invalid agent credentials"


@dataclass(kw_only=True)
class AgentAuthentication:
    keys: AgentKeys
    #: The agent tokens accepted so far, by this replica and (a second later) by the others.
    token_uses: TokenUses

    async def authenticate(
        self, svc: Services, org_id: str, runner_id: str, authorization: str | None
    ) -> None:
        """Admit a request whose ``Authorization`` carries a valid agent token of ``org_id/runner_id``;
        the same UnauthenticatedError for every failure."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(UNAUTHENTICATED)
        if runner_id == MANAGED_RUNNER_ID:
            # The pool is every organization's (seed 004); its runners use /runner/*, never these routes.
            raise ForbiddenError(NOT_AN_AGENT_MESSAGE)
        key = await self.keys.get(svc, org_id, runner_id)
        if key is None:
            log.info("agent authentication failed", org_id=org_id, runner_id=runner_id, reason="no agent key")
            raise UnauthenticatedError(UNAUTHENTICATED)
        try:
            claims = agent_auth.verify(token.strip(), key, org_id=org_id, runner_id=runner_id)
        except agent_auth.AgentTokenError as exc:
            log.info("agent authentication failed", org_id=org_id, runner_id=runner_id, reason=exc.message)
            raise UnauthenticatedError(UNAUTHENTICATED) from None
        if not self.first_use(token.strip(), claims):
            log.warning(
                "agent authentication failed", org_id=org_id, runner_id=runner_id, reason="replayed token"
            )
            raise UnauthenticatedError(UNAUTHENTICATED)

    def first_use(self, token: str, claims: dict[str, Any]) -> bool:
        """Note a verified token's use; False for a replay (``gateway.token_uses``)."""
        digest, has_jti = agent_auth.use_key(token, claims)
        expires_at = datetime.fromtimestamp(int(claims["exp"]) + agent_auth.CLOCK_SKEW_SECONDS, UTC)
        return self.token_uses.accept(digest, has_jti=has_jti, expires_at=expires_at)
