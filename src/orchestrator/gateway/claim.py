"""Claiming a runner's next command for a long poll: a cheap read first (most polls find nothing), then
the lease (``dispatch.agent_commands.claim_next``), and the delivery with its deployment token and
receipt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.deployment_tokens import deployment_token
from orchestrator.dispatch import agent_commands as policy
from orchestrator.domain.deployments import Deployment
from orchestrator.gateway import receipts
from orchestrator.gateway.command_waker import CommandWaker
from orchestrator.protocol import commands as protocol
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as store
from orchestrator.web.services import Services, transaction

#: Largest body of an agent's answer to a delivered command (ack/retry/reject), and of a long poll.
MAX_ANSWER_BYTES = 16 * 1024


@dataclass(kw_only=True)
class Claims:
    settings: ServerSettings
    receipt_key: bytes
    waker: CommandWaker
    #: Called with the deployments a claim found failed (their commands expired).
    finished: Callable[[list[Deployment]], None]
    #: The leases this process handed out that may still run, by command id (``hand_back``).
    handed_out: dict[str, policy.Lease] = field(default_factory=dict)

    async def deliverable(self, svc: Services, org_id: str, runner_id: str) -> bool:
        """A cheap read: might a claim hand out (or expire) something now?"""
        now = datetime.now(UTC)
        async with svc.reader.connect() as conn:
            head = await store.head(conn, org_id, runner_id)
        return head is not None and (head.available(now) or head.expires_at <= now)

    async def claim(self, svc: Services, org_id: str, runner_id: str) -> protocol.NextCommand | None:
        max_age = 3 * self.settings.agent_poll_fallback_seconds
        if not self.waker.may_have_command(org_id, runner_id, max_age=max_age):
            return None
        if not await self.deliverable(svc, org_id, runner_id):
            return None
        now = datetime.now(UTC)
        async with transaction(svc) as conn:
            outcome = await policy.claim_next(
                conn, org_id, runner_id, now=now, lease=timedelta(seconds=self.settings.agent_lease_seconds)
            )
        self.finished(outcome.failed)
        if outcome.claimed is None:
            return None
        self._remember(outcome.claimed, now)
        return self._delivery(svc, outcome.claimed)

    def _remember(self, claimed: policy.Claimed, now: datetime) -> None:
        for command_id in [k for k, lease in self.handed_out.items() if lease.expires_at <= now]:
            del self.handed_out[command_id]
        command = claimed.command
        self.handed_out[command.id] = policy.Lease(
            command_id=command.id,
            org_id=command.org_id,
            runner_id=command.runner_id,
            attempt=claimed.attempt,
            expires_at=claimed.lease_expires_at,
        )

    async def hand_back(self, svc: Services) -> int:
        """The server is stopping (its requests have ended): the leases it handed out that no answer
        closed become deliverable at once (``dispatch.agent_commands.hand_back``); how many."""
        leases, self.handed_out = list(self.handed_out.values()), {}
        if not leases:
            return 0
        async with transaction(svc) as conn:
            handed_back = await policy.hand_back(conn, leases, now=datetime.now(UTC))
        for lease in handed_back:
            self.waker.notify(lease.org_id, lease.runner_id)
        return len(handed_back)

    def _delivery(self, svc: Services, claimed: policy.Claimed) -> protocol.NextCommand:
        command = claimed.command
        envelope: dict[str, Any] = dict(command.envelope)
        # The deployment token travels only in the delivery (``spec.token``, and ``TOKEN`` in the JobSpec
        # of a kubernetes-agent command): derived from the server key, stored nowhere.
        token = deployment_token(svc.token_key, command.org_id, str(command.deployment_id))
        envelope["payload"] = protocol.with_deployment_token(envelope["payload"], token)
        receipt = receipts.seal(
            self.receipt_key,
            receipts.Receipt(
                org_id=command.org_id,
                runner_id=command.runner_id,
                command_id=command.id,
                attempt=claimed.attempt,
                expires_at=claimed.lease_expires_at,
            ),
        )
        return protocol.NextCommand(
            command=protocol.CommandEnvelope.model_validate(envelope),
            receipt=receipt,
            attempt=claimed.attempt,
            lease_expires_at=claimed.lease_expires_at,
        )
