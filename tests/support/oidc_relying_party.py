"""How the cloud stand-ins check the orchestrator's OIDC tokens: ``Verifier`` is what they need (the
issuer's URL and a relying party's ``verify``). ``TestIssuer`` (tests/support/workload_identity.py) is
one, for launcher tests; ``RelyingParty`` is one for the real server's issuer, checking a token as a
cloud's STS does: the discovery document and the JWKS it names, fetched afresh, the key named by the
token's ``kid``, RS256, the audience, the issuer and the times.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx
import jwt


class Verifier(Protocol):
    @property
    def issuer(self) -> str: ...

    def verify(self, token: str, *, audience: str) -> dict[str, Any]:
        """The token's claims; ``jwt.PyJWTError`` when it is not valid for ``audience``."""
        ...


class RelyingParty:
    """Verifies tokens of the OIDC issuer at ``issuer`` (set it once the server's URL is known)."""

    def __init__(self, issuer: str = "") -> None:
        self.issuer = issuer

    def verify(self, token: str, *, audience: str) -> dict[str, Any]:
        config = httpx.get(f"{self.issuer}/.well-known/openid-configuration", timeout=10).json()
        if config.get("issuer") != self.issuer:
            raise jwt.InvalidIssuerError(f"the discovery document names the issuer {config.get('issuer')!r}")
        client = jwt.PyJWKClient(config["jwks_uri"], cache_jwk_set=False, cache_keys=False)
        key = client.get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=config["id_token_signing_alg_values_supported"],
            audience=audience,
            issuer=self.issuer,
            options={"require": ["iss", "sub", "aud", "iat", "exp"]},
        )
        return claims
