"""The issuer's two public documents, as relying parties (AWS STS, Google STS, Azure AD) fetch them:
``{issuer}/.well-known/openid-configuration`` (OIDC Discovery 1.0) and the JWKS it names (RFC 7517)."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from orchestrator.identity import keys

DISCOVERY_PATH: Final = "/.well-known/openid-configuration"
#: Upstream's path of the JWKS.
JWKS_PATH: Final = "/.well-known/jwks"
#: Relying parties may cache both documents this long (a new key is published an hour before it signs,
#: or half the rotation period if shorter: ``keys.publish_ahead_seconds``).
CACHE_CONTROL: Final = "public, max-age=300"
CLAIMS: Final = ("iss", "sub", "aud", "iat", "nbf", "exp", "jti")


def discovery(issuer: str) -> dict[str, Any]:
    """The discovery document of ``issuer`` (the public URL without a trailing slash)."""
    return {
        "issuer": issuer,
        "jwks_uri": f"{issuer}{JWKS_PATH}",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [keys.ALGORITHM],
        "claims_supported": list(CLAIMS),
    }


def jwks(published: list[dict[str, Any]]) -> dict[str, Any]:
    return {"keys": published}


def path_prefix(issuer: str) -> str:
    """The path of the issuer URL (``/po`` of ``https://host/po``; empty for none): relying parties fetch
    the documents under it, so the server serves them there too, for a proxy that forwards the path as it
    is (one that strips the prefix reaches the documents at the root, as the gateway's routes)."""
    return urlsplit(issuer).path.rstrip("/")


def is_https(issuer: str) -> bool:
    """Clouds' security token services accept only https issuers."""
    return urlsplit(issuer).scheme == "https"
