"""Agent token replays: the gateway accepts each agent token (JWT) once.

A token with ``jti`` (our agent's) is accepted exactly once; one without (an upstream agent's, whose
tokens of one second are identical) again only within ``agent_auth.REUSE_WITHOUT_JTI_SECONDS`` of its
first use. Uses are remembered until the token expires (``exp`` plus the clock skew).

Where they are remembered: first in this replica's memory, checked with no database access; written to
the ``agent_token_uses`` table in one batch per second and read back by the other replicas (and by this
one after a restart) in the same step (``sync``, from ``AgentGateway.run``). A replay to another replica
is therefore refused from about a second after the first use; within that second it is not. A database
insert per request was measured first and rejected (docs/benchmarks.md): with 10,000 agents holding long
polls SQLite's single writer took 67 % of a core while idle, and PostgreSQL's connection pool ran out
(polls failed). Polls that have nothing to deliver touch no database, and stay so.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.protocol import agent_auth
from orchestrator.store import agent_tokens as store

#: How far back each read of the other replicas' uses looks again (late commits, clocks a little apart).
OVERLAP_SECONDS: Final = 10.0
#: How often expired uses are forgotten (in memory) and deleted (in the table).
PRUNE_INTERVAL_SECONDS: Final = 60.0
#: Bytes of the digest kept in memory per use (128 bits: collisions are not a concern).
_KEY_BYTES: Final = 16


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(kw_only=True)
class TokenUses:
    """The agent token uses one replica knows of (see the module docstring)."""

    #: Names this replica's rows; new per process, so that after a restart its old rows count as others'.
    replica: str = field(default_factory=lambda: secrets.token_hex(8))
    clock: Callable[[], datetime] = _now
    #: Digest prefix -> when the token expires (epoch seconds).
    _expires: dict[bytes, float] = field(default_factory=dict)
    #: Digest prefix -> until when a token without ``jti`` is accepted again (epoch seconds).
    _reusable: dict[bytes, float] = field(default_factory=dict)
    _pending: list[store.TokenUse] = field(default_factory=list)
    _read_until: datetime | None = None
    _pruned_at: datetime | None = None

    def accept(self, digest: str, *, has_jti: bool, expires_at: datetime) -> bool:
        """Note a use of the verified token ``digest`` names (``agent_auth.use_key``); False for a replay."""
        now = self.clock()
        key = bytes.fromhex(digest)[:_KEY_BYTES]
        known = self._expires.get(key)
        if known is not None and known > now.timestamp():
            until = self._reusable.get(key)
            return until is not None and now.timestamp() <= until
        reusable_until = None if has_jti else now + timedelta(seconds=agent_auth.REUSE_WITHOUT_JTI_SECONDS)
        self._remember(key, expires_at, reusable_until)
        self._pending.append(
            store.TokenUse(
                digest=digest,
                replica=self.replica,
                first_used_at=now,
                expires_at=expires_at,
                reusable_until=reusable_until,
            )
        )
        return True

    def _remember(self, key: bytes, expires_at: datetime, reusable_until: datetime | None) -> None:
        self._expires[key] = expires_at.timestamp()
        if reusable_until is not None:
            self._reusable[key] = reusable_until.timestamp()
        else:
            self._reusable.pop(key, None)

    async def sync(self, engine: AsyncEngine, reader: AsyncEngine) -> None:
        """Write the uses accepted here since the last call (one transaction, none if there are none) and
        read the other replicas' (``reader``); every ``PRUNE_INTERVAL_SECONDS`` also forget and delete
        expired ones."""
        now = self.clock()
        lifetime = timedelta(seconds=agent_auth.TOKEN_LIFETIME_SECONDS + 2 * agent_auth.CLOCK_SKEW_SECONDS)
        overlap = timedelta(seconds=OVERLAP_SECONDS)
        since = now - lifetime if self._read_until is None else self._read_until - overlap
        prune = self._pruned_at is None or (now - self._pruned_at).total_seconds() >= PRUNE_INTERVAL_SECONDS
        pending, self._pending = self._pending, []
        if pending or prune:
            try:
                async with engine.begin() as conn:
                    await store.record(conn, pending)
                    if prune:
                        await store.prune(conn, now=now)
            except Exception:
                self._pending = pending + self._pending
                raise
        async with reader.connect() as conn:
            others = await store.recorded_since(conn, since, now=now, other_than=self.replica)
        self._read_until = now
        for use in others:
            key = bytes.fromhex(use.digest)[:_KEY_BYTES]
            if key in self._expires and use.reusable_until is not None:
                # Both replicas took a token without jti: the earlier window counts.
                current = self._reusable.get(key)
                if current is not None:
                    self._reusable[key] = min(current, use.reusable_until.timestamp())
                continue
            self._remember(key, use.expires_at, use.reusable_until)
        if prune:
            self._pruned_at = now
            self.forget_expired(now)

    def forget_expired(self, now: datetime) -> int:
        """Drop the uses of expired tokens from memory; how many."""
        cutoff = now.timestamp()
        expired = [key for key, expires in self._expires.items() if expires <= cutoff]
        for key in expired:
            del self._expires[key]
            self._reusable.pop(key, None)
        return len(expired)

    def __len__(self) -> int:
        return len(self._expires)
