"""Process-wide state of the agents' command protocol (``app.state.agent_gateway``), made of its parts:
the key cache (``agent_keys``), authentication (``agent_authentication``), presence (``presence``), the
long poll (``long_poll``, woken by ``command_waker``) and the claim (``claim``); and their background
work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from fastapi import Request

from orchestrator.domain.deployments import Deployment
from orchestrator.gateway.agent_authentication import AgentAuthentication
from orchestrator.gateway.agent_keys import AgentKeys
from orchestrator.gateway.claim import Claims
from orchestrator.gateway.command_waker import CommandWaker
from orchestrator.gateway.long_poll import LongPoll
from orchestrator.gateway.presence import Presence
from orchestrator.gateway.token_uses import TokenUses
from orchestrator.notify import sleep_unless_stopped
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as store
from orchestrator.web.services import Services

log = structlog.get_logger(__name__)


@dataclass(kw_only=True)
class AgentGateway:
    settings: ServerSettings
    receipt_key: bytes
    waker: CommandWaker = field(default_factory=CommandWaker)
    #: Called with a deployment id when a deployment became final here (wakes wait-for-complete).
    on_final: Callable[[str], None] = lambda _deployment_id: None
    #: Set once this replica hears other replicas' announcements (PostgreSQL only).
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    #: The agent tokens accepted so far, by this replica and (a second later) by the others.
    token_uses: TokenUses = field(default_factory=TokenUses)
    authentication: AgentAuthentication = field(init=False)
    presence: Presence = field(init=False, default_factory=Presence)
    claims: Claims = field(init=False)
    long_poll: LongPoll = field(init=False)

    def __post_init__(self) -> None:
        keys = AgentKeys(max_age_seconds=self.settings.agent_public_key_cache_seconds)
        self.authentication = AgentAuthentication(keys=keys, token_uses=self.token_uses)
        self.claims = Claims(
            settings=self.settings, receipt_key=self.receipt_key, waker=self.waker, finished=self.finished
        )
        self.long_poll = LongPoll(
            settings=self.settings, waker=self.waker, claims=self.claims, presence=self.presence
        )

    def finished(self, deployments: list[Deployment]) -> None:
        for deployment in deployments:
            self.on_final(str(deployment.id))

    def stop_polls(self) -> None:
        """The server is stopping: long polls answer 204 (``LongPoll.stop``)."""
        self.long_poll.stop()

    async def hand_back_leases(self, svc: Services) -> None:
        """The server is stopping and its requests have ended: the commands it delivered that no answer
        closed are deliverable again at once (``Claims.hand_back``), not after their lease."""
        try:
            count = await self.claims.hand_back(svc)
        except Exception:
            log.exception("handing back the agent command leases failed; they run out by themselves")
            return
        if count:
            log.info("agent command leases handed back", count=count)

    async def run(self, svc: Services, stop: asyncio.Event) -> None:
        """Background work: the polling fallback and the exchange of agent token uses with the other
        replicas every ``PO_AGENT_POLL_FALLBACK_SECONDS``, the presence flush every
        ``PO_AGENT_PRESENCE_INTERVAL_SECONDS`` (both once more when stopping)."""
        loop = asyncio.get_running_loop()
        next_flush = loop.time() + self.settings.agent_presence_interval_seconds
        while not stop.is_set():
            try:
                await self.long_poll.wake_ready(svc)
                await self.token_uses.sync(svc.engine, svc.reader)
                if loop.time() >= next_flush:
                    next_flush = loop.time() + self.settings.agent_presence_interval_seconds
                    await self.presence.flush(svc)
            except Exception:
                log.exception("agent gateway background work failed")
            await sleep_unless_stopped(stop, self.settings.agent_poll_fallback_seconds)
        try:
            await self.presence.flush(svc)
            await self.token_uses.sync(svc.engine, svc.reader)
        except Exception:
            log.exception("writing agent presence or token uses failed")

    def listener_connected(self) -> None:
        """The PostgreSQL LISTEN connection is (again) up: announcements sent while it was down are lost,
        so every waiting long poll looks again."""
        self.listening.set()
        self.waker.notify_all()

    def announced(self, payload: str) -> None:
        """A replica (maybe this one) committed a change to a runner's queue: wake its long polls here."""
        parsed = store.parse_announcement(payload)
        if parsed is not None:
            self.waker.notify(*parsed)


def agent_gateway(request: Request) -> AgentGateway:
    gateway: AgentGateway = request.app.state.agent_gateway
    return gateway
