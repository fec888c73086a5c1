"""The orchestrator as an OIDC issuer: ``WorkloadIssuer`` mints the runners' workload identity tokens and
answers the keys the JWKS publishes.

One issuer per server process. The keys live in the database (``store.signing_keys``), so every replica
signs with the same current key and publishes the same JWKS, and a restart keeps them. The current key is
cached in memory until the schedule (``keys``) says it may change: minting a token reads no database then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import jwt
import structlog
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.identity import keys
from orchestrator.launchers.base import LaunchError, WorkloadIdentity
from orchestrator.secretbox import SecretBox
from orchestrator.settings import ServerSettings
from orchestrator.store import db
from orchestrator.store import signing_keys as key_store
from orchestrator.store.signing_keys import SigningKeyRow

log = structlog.get_logger(__name__)

#: The published keys are read again at least this often (another replica may have made or deleted one;
#: a new key is published long before it signs, see ``keys.publish_ahead_seconds``).
JWKS_REFRESH_SECONDS: Final = 60.0


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True)
class _Snapshot:
    """The keys as last read, and the current one's private part."""

    rows: tuple[SigningKeyRow, ...]
    signing: SigningKeyRow
    private: rsa.RSAPrivateKey
    #: The signing key stays current until then (then the keys are read again).
    current_until: datetime
    read_at: datetime


class WorkloadIssuer:
    """Mints short-lived RS256 tokens (``iss`` the public URL, ``sub`` ``{org_id}+{runner_id}``, ``aud``),
    and rotates its signing keys (see ``identity.keys``)."""

    def __init__(self, engine: AsyncEngine, box: SecretBox, settings: ServerSettings) -> None:
        self._engine = engine
        self._box = box
        #: The ``iss`` of every token: the public URL without a trailing slash.
        self.issuer: str = settings.resolved_public_url.rstrip("/")
        self.lifetime_seconds: int = settings.workload_token_lifetime_seconds
        self.rotation_seconds: float = settings.oidc_key_rotation_seconds
        self._snapshot: _Snapshot | None = None
        self._lock = asyncio.Lock()

    def identity(self, subject: str) -> WorkloadIdentity:
        """The workload identity of one runner (``LaunchTarget.subject``), for its launcher."""
        if not subject or "+" not in subject:
            raise ValueError(f"a workload identity subject is '{{org_id}}+{{runner_id}}', not {subject!r}")
        return _RunnerIdentity(self, subject)

    async def token(self, *, subject: str, audience: str) -> str:
        """A signed JWT for ``subject``, valid ``lifetime_seconds`` from now, for ``audience`` only."""
        if not audience:
            error = LaunchError("the runner's workload identity token needs an audience, and it has none")
            error.retryable = False
            raise error
        snapshot = await self._fresh(signing=True)
        now = _now()
        issued = int(now.timestamp())
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "iat": issued,
            "nbf": issued,
            "exp": issued + self.lifetime_seconds,
            "jti": uuid.uuid4().hex,
        }
        headers = {"kid": snapshot.signing.kid, "typ": "JWT"}
        return jwt.encode(claims, snapshot.private, algorithm=keys.ALGORITHM, headers=headers)

    async def published_keys(self) -> list[dict[str, Any]]:
        """The JWKs of every key a valid token may name (the current one, retired ones whose tokens may
        not have expired yet, and the next one, published before it signs): public parts only."""
        snapshot = await self._fresh(signing=False)
        return [keys.published_jwk(row) for row in snapshot.rows]

    async def _fresh(self, *, signing: bool) -> _Snapshot:
        snapshot = self._snapshot
        if snapshot is not None and not self._stale(snapshot, _now(), signing=signing):
            return snapshot
        async with self._lock:
            snapshot = self._snapshot
            if snapshot is None or self._stale(snapshot, _now(), signing=signing):
                snapshot = self._snapshot = await self._load()
            return snapshot

    @staticmethod
    def _stale(snapshot: _Snapshot, now: datetime, *, signing: bool) -> bool:
        if now >= snapshot.current_until:
            return True
        return not signing and now >= snapshot.read_at + timedelta(seconds=JWKS_REFRESH_SECONDS)

    async def _load(self) -> _Snapshot:
        """Read the keys; make the next one if it is due and delete expired ones first."""
        now = _now()
        async with db.readonly(self._engine).connect() as conn:
            rows = await key_store.all_keys(conn)
        if keys.next_key_signs_from(rows, now, self.rotation_seconds) is not None or keys.expired(rows, now):
            rows = await self._rotate()
            now = _now()
        signing = keys.current(rows, now)
        if signing is None:  # cannot be: the rotation made one that signs now, or one signs already
            raise RuntimeError("the OIDC issuer has no signing key")
        previous = self._snapshot
        private = (
            previous.private
            if previous is not None and previous.signing.kid == signing.kid
            else keys.open_private(self._box, signing)
        )
        return _Snapshot(
            rows=tuple(rows),
            signing=signing,
            private=private,
            current_until=keys.current_until(rows, signing, self.rotation_seconds),
            read_at=now,
        )

    async def _rotate(self) -> list[SigningKeyRow]:
        """In one transaction: make the next key if it is still due (of replicas doing so at once, the
        first to commit wins: the generation is unique), delete expired keys; the keys then."""
        # The RSA key is made before the transaction, which must not wait for it (SQLite: the write lock).
        candidate: SigningKeyRow | None = None
        async with db.readonly(self._engine).connect() as conn:
            before = await key_store.all_keys(conn)
        if keys.next_key_signs_from(before, _now(), self.rotation_seconds) is not None:
            candidate = await asyncio.to_thread(
                keys.generate,
                self._box,
                generation=before[-1].generation + 1 if before else 1,
                created_at=_now(),
                signs_from=_now(),
            )
        async with self._engine.begin() as conn:
            rows = await key_store.all_keys(conn)
            now = _now()
            signs_from = keys.next_key_signs_from(rows, now, self.rotation_seconds)
            generation = rows[-1].generation + 1 if rows else 1
            if signs_from is not None and candidate is not None and candidate.generation == generation:
                made = dataclasses.replace(candidate, created_at=now, signs_from=signs_from)
                if await key_store.insert(conn, made):
                    log.info("OIDC signing key made", kid=made.kid, signs_from=signs_from.isoformat())
                rows = await key_store.all_keys(conn)
            gone = keys.expired(rows, now)
            if gone:
                await key_store.delete(conn, gone)
                log.info("OIDC signing keys deleted, their tokens have expired", kids=gone)
                rows = [row for row in rows if row.kid not in gone]
        return rows


@dataclass(frozen=True)
class _RunnerIdentity:
    """``launchers.base.WorkloadIdentity`` of one runner."""

    issuer: WorkloadIssuer
    subject: str

    async def token(self, audience: str) -> str:
        return await self.issuer.token(subject=self.subject, audience=audience)
