"""A workload identity for launcher tests: an RS256 signing key of the test's own, tokens as the
orchestrator's OIDC issuer mints them (``iss``, ``sub`` ``{org_id}+{runner_id}``, ``aud``, ``iat``,
``nbf``, ``exp``, ``kid`` in the header), its JWKS, and ``verify``, which the cloud stand-ins (STS, Azure
AD) use to check a presented token exactly as the real services check one against a published JWKS.

Launcher tests use it where the server's own issuer is not running; the end-to-end tests use the
server's issuer through its ``/.well-known`` documents instead.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://orchestrator.test"


@dataclass
class TestIssuer:
    """Mints tokens for one subject; ``verify`` is the relying party's check."""

    subject: str = "org-1+runner-1"
    issuer: str = ISSUER
    lifetime_seconds: int = 300
    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    _key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048), repr=False)
    #: Every (audience, token) minted, in order.
    minted: list[tuple[str, str]] = field(default_factory=list)

    __test__ = False  # not a pytest test class

    async def token(self, audience: str) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": self.subject,
            "aud": audience,
            "iat": now,
            "nbf": now,
            "exp": now + self.lifetime_seconds,
            "jti": uuid.uuid4().hex,
        }
        token = jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": self.kid})
        self.minted.append((audience, token))
        return token

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def verify(self, token: str, *, audience: str) -> dict[str, Any]:
        """The claims of a token this issuer signed for ``audience``; ``jwt.InvalidTokenError`` otherwise."""
        header = jwt.get_unverified_header(token)
        keys = {k["kid"]: k for k in self.jwks()["keys"]}
        if header.get("kid") not in keys:
            raise jwt.InvalidTokenError(f"unknown key id {header.get('kid')!r}")
        key = jwt.PyJWK(keys[header["kid"]]).key
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=["RS256"], audience=audience, issuer=self.issuer
        )
        return claims
