"""How a runner agent authenticates to the runner gateway: a fresh EdDSA JWT per request.

The agent holds an Ed25519 private key (PKCS#8 PEM, ``PRIVATE_KEY``); the runner's configuration holds the
public key (PKIX PEM). Every request carries ``Authorization: Bearer <compact JWS>``:

- header ``{"alg": "EdDSA", "typ": "JWT", "kid": hex(sha256(raw 32-byte public key))}``
- claims ``{"aud": "platform-orchestrator-runner-gateway", "org_id", "runner_id", "iat", "exp"}`` with
  ``exp = iat + 300``, and (ours, not upstream's) a random ``jti``

The gateway accepts 30 s of clock skew; the org and runner must match the request path. Upstream:
``RUN:internal/gatewayapi/auth.go``. Shared by the agent (signing) and the gateway (verifying); imports
no server code.

Replays: the gateway accepts each token once (:func:`use_key`). Without ``jti`` two tokens signed in the
same second are identical (``iat`` has whole seconds and EdDSA signatures are deterministic), so a token
without ``jti`` (an upstream agent's) may be used again for a few seconds after its first use
(:data:`REUSE_WITHOUT_JTI_SECONDS`); one with ``jti`` exactly once.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any, Final

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from orchestrator import errors

AUDIENCE: Final = "platform-orchestrator-runner-gateway"
#: ``exp - iat`` of every token the agent signs; the gateway refuses longer-lived ones.
TOKEN_LIFETIME_SECONDS: Final = 300
#: Clock skew the gateway tolerates on ``iat`` and ``exp``.
CLOCK_SKEW_SECONDS: Final = 30
ALGORITHM: Final = "EdDSA"
#: How long after its first use a token without ``jti`` is still accepted (see the module docstring).
REUSE_WITHOUT_JTI_SECONDS: Final = 5
MAX_JTI_LENGTH: Final = 256


class AgentKeyError(errors.ConfigurationError):
    """The agent's private key is not a usable Ed25519 key."""


class AgentTokenError(errors.UnauthenticatedError):
    """The agent token is not valid."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """``kid``: hex SHA-256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_private_key(pem: str | bytes) -> Ed25519PrivateKey:
    """Parse ``PRIVATE_KEY``: an unencrypted PKCS#8 PEM Ed25519 key (``openssl genpkey -algorithm ed25519``
    makes one)."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        key = load_pem_private_key(data.strip() + b"\n", password=None)
    except TypeError as exc:
        raise AgentKeyError("the agent's private key must not be encrypted with a passphrase") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        # Never echo the key.
        raise AgentKeyError("the agent's private key is not a PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AgentKeyError("the agent's private key is not an Ed25519 key")
    return key


def generate_key_pair() -> tuple[str, str]:
    """A fresh agent key pair as ``(private PKCS#8 PEM, public PKIX PEM)``."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    public_pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    return private_pem, public_pem


def sign(private_key: Ed25519PrivateKey, org_id: str, runner_id: str, *, now: float | None = None) -> str:
    """A fresh token for one request of runner ``org_id/runner_id``."""
    issued = int(time.time() if now is None else now)
    claims = {
        "aud": AUDIENCE,
        "org_id": org_id,
        "runner_id": runner_id,
        "iat": issued,
        "exp": issued + TOKEN_LIFETIME_SECONDS,
        # Unique per token: the gateway refuses a token it has seen (tokens of one second would be equal).
        "jti": secrets.token_urlsafe(16),
    }
    headers = {"kid": key_id(private_key.public_key()), "typ": "JWT"}
    return jwt.encode(claims, private_key, algorithm=ALGORITHM, headers=headers)


def _int_claim(claims: dict[str, Any], name: str) -> int:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentTokenError(f"claim {name} is not a number")
    return int(value)


def verify(
    token: str,
    public_key: Ed25519PublicKey,
    *,
    org_id: str,
    runner_id: str,
    now: float | None = None,
    skew_seconds: int = CLOCK_SKEW_SECONDS,
) -> dict[str, Any]:
    """The claims of ``token`` if it is a valid token of ``org_id/runner_id`` signed by ``public_key``.

    Raises ``AgentTokenError``; its message is for logs only, the gateway answers a generic 401.
    """
    current = time.time() if now is None else now
    try:
        header = jwt.get_unverified_header(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            public_key,
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            # Times are checked below against ``now``, with the gateway's skew.
            options={
                "verify_exp": False,
                "verify_iat": False,
                "verify_nbf": False,
                "require": ["aud", "iat", "exp", "org_id", "runner_id"],
            },
        )
    except jwt.PyJWTError as exc:
        raise AgentTokenError(f"invalid token: {exc}") from exc
    kid = header.get("kid")
    if kid is not None and kid != key_id(public_key):
        raise AgentTokenError("the token's kid does not match the runner's key")
    issued, expires = _int_claim(claims, "iat"), _int_claim(claims, "exp")
    if expires - issued > TOKEN_LIFETIME_SECONDS or expires <= issued:
        raise AgentTokenError("the token's lifetime is not within 300 s")
    if issued > current + skew_seconds:
        raise AgentTokenError("the token was issued in the future")
    if expires <= current - skew_seconds:
        raise AgentTokenError("the token has expired")
    if claims.get("org_id") != org_id or claims.get("runner_id") != runner_id:
        raise AgentTokenError("the token is for another runner")
    jti = claims.get("jti")
    if jti is not None and (not isinstance(jti, str) or not jti or len(jti) > MAX_JTI_LENGTH):
        raise AgentTokenError(f"claim jti is not a string of 1..{MAX_JTI_LENGTH} characters")
    return claims


def use_key(token: str, claims: dict[str, Any]) -> tuple[str, bool]:
    """What identifies one use of a verified token, and whether it has a ``jti``: a SHA-256 of its ``jti``
    with its org and runner, or of the whole token when it has none."""
    jti = claims.get("jti")
    if isinstance(jti, str) and jti:
        text = f"jti\x00{claims.get('org_id')}\x00{claims.get('runner_id')}\x00{jti}"
        return hashlib.sha256(text.encode()).hexdigest(), True
    return hashlib.sha256(f"token\x00{token}".encode()).hexdigest(), False
