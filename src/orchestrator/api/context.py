"""The user API's caller: its bearer token checked, its organization and role admitted (``READ``, ``DEPLOY``,
``MANAGE``). The services and the transaction every route uses are in ``web.services``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastapi import Depends, Request, Security

from orchestrator.domain.entities import ApiToken
from orchestrator.domain.roles import Permission, Role, allows
from orchestrator.errors import ForbiddenError, NotFoundError, UnauthenticatedError
from orchestrator.store import orgs as org_store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction


@dataclass(frozen=True, kw_only=True)
class Principal:
    """The caller, from its bearer token."""

    token_id: str
    #: None for a platform-wide token.
    org_id: str | None
    role: Role


_API_TOKEN_PURPOSE = b"po-api-token-hash-v1"


def api_token_key(server_key: bytes) -> bytes:
    """The key of stored API token hashes, derived from the server key (as ``deployment_tokens.token_key``
    derives the deployment tokens' key)."""
    return hmac.new(server_key, _API_TOKEN_PURPOSE, hashlib.sha256).digest()


def hash_token(key: bytes, token: str) -> str:
    """What the tokens table stores for an API token: HMAC-SHA256 keyed with :func:`api_token_key`, so a
    copy of the table alone does not let anyone test guesses. API tokens carry 256 random bits: a fast
    MAC is enough, a slow KDF would only cost latency."""
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def legacy_hash_token(token: str) -> str:
    """The bare SHA-256 that rows written before keyed hashes hold; upgraded on their first use."""
    return hashlib.sha256(token.encode()).hexdigest()


async def principal(
    request: Request, svc: Services = Depends(services), _documented: None = Security(openapi.API_TOKEN)
) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError("missing bearer token in the Authorization header")
    keyed = hash_token(svc.api_token_key, token.strip())
    async with svc.reader.connect() as conn:
        found = await org_store.find_token(conn, keyed)
    if found is None:
        found = await _upgrade_legacy(svc, token.strip(), keyed)
    if found is None or (found.expires_at is not None and found.expires_at <= datetime.now(UTC)):
        raise UnauthenticatedError("invalid or expired token")
    return Principal(token_id=str(found.id), org_id=found.org_id, role=Role(found.role))


async def _upgrade_legacy(svc: Services, token: str, keyed: str) -> ApiToken | None:
    """A row with the token's bare SHA-256 (written before keyed hashes) is rewritten to the keyed hash
    and admitted. Done here, on first use, because only the token itself gives the keyed hash."""
    legacy = legacy_hash_token(token)
    async with svc.reader.connect() as conn:
        found = await org_store.find_token(conn, legacy)
    if found is None:
        return None
    async with transaction(svc) as conn:
        await org_store.rehash_token(conn, found.id, old_hash=legacy, new_hash=keyed)
    return found


def org_access(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits the caller to ``{org_id}`` with ``permission``.

    A token of another organization gets the same 404 as an organization that does not exist.
    """

    async def check(org_id: str, request: Request, caller: Principal = Depends(principal)) -> Principal:
        if caller.org_id is None:
            svc = services(request)
            async with svc.reader.connect() as conn:
                if await org_store.get_org(conn, org_id) is None:
                    raise NotFoundError(f"organization '{org_id}' not found")
        elif caller.org_id != org_id:
            raise NotFoundError(f"organization '{org_id}' not found")
        if not allows(caller.role, permission):
            raise ForbiddenError(f"role '{caller.role}' may not {permission} in organization '{org_id}'")
        return caller

    # Every role reads; only the other permissions can be refused.
    return check if permission is Permission.READ else openapi.may_answer(403)(check)


READ = Depends(org_access(Permission.READ))
DEPLOY = Depends(org_access(Permission.DEPLOY))
MANAGE = Depends(org_access(Permission.MANAGE))
