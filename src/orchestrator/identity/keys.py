"""The issuer's signing keys: RSA 2048 for RS256, which AWS STS, Google STS and Azure AD (Entra ID) all
accept for OIDC federation; and the rotation schedule over the stored keys.

Schedule (``R`` the rotation period, ``L`` = :func:`publish_ahead_seconds`): the first key signs at once.
Each next key is made once the newest has signed for ``R - L``, and signs ``L`` after it was made, so
that it is in the JWKS relying parties cached before any token names it. A key whose successor signs is
retired; it stays published until every token it signed has expired (:data:`RETAIN_AFTER_RETIREMENT`),
then it is deleted.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from orchestrator.secretbox import SecretBox
from orchestrator.store.signing_keys import SigningKeyRow

ALGORITHM: Final = "RS256"
KEY_SIZE_BITS: Final = 2048
#: The longest token lifetime ``PO_WORKLOAD_TOKEN_LIFETIME_SECONDS`` allows.
MAX_TOKEN_LIFETIME_SECONDS: Final = 3600
#: Clocks of replicas and relying parties may differ this much.
CLOCK_SKEW_SECONDS: Final = 300
#: How long a retired key stays published after its successor began to sign: the longest lifetime a
#: token may have had (whatever the replica that signed it was configured with) and the skew.
RETAIN_AFTER_RETIREMENT: Final = timedelta(seconds=MAX_TOKEN_LIFETIME_SECONDS + CLOCK_SKEW_SECONDS)
#: At most this long between a key's publication and its first token.
MAX_PUBLISH_AHEAD_SECONDS: Final = 3600.0


def publish_ahead_seconds(rotation_seconds: float) -> float:
    """How long a new key is published before it signs: an hour, or half the rotation period if shorter."""
    return min(MAX_PUBLISH_AHEAD_SECONDS, rotation_seconds / 2)


def seal_context(kid: str) -> str:
    """The ``secretbox`` context a key's private part is sealed under (a sealed key moved to another row
    does not open)."""
    return f"signing-key:{kid}"


def thumbprint(public_jwk: dict[str, Any]) -> str:
    """The RFC 7638 thumbprint of an RSA JWK (SHA-256, base64url): the key's ``kid``."""
    canonical = json.dumps({name: public_jwk[name] for name in ("e", "kty", "n")}, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def generate(box: SecretBox, *, generation: int, created_at: datetime, signs_from: datetime) -> SigningKeyRow:
    """A new RSA key, its private part sealed with the server key."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=KEY_SIZE_BITS)
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    kid = thumbprint(jwk)
    der = private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return SigningKeyRow(
        kid=kid,
        generation=generation,
        algorithm=ALGORITHM,
        public_jwk=json.dumps({"kty": jwk["kty"], "n": jwk["n"], "e": jwk["e"]}, sort_keys=True),
        private_key_sealed=box.seal(der, context=seal_context(kid)),
        created_at=created_at,
        signs_from=signs_from,
    )


def open_private(box: SecretBox, row: SigningKeyRow) -> rsa.RSAPrivateKey:
    """The key's private part; ``SealedValueError`` if it does not open with the server key."""
    der = box.open(row.private_key_sealed, context=seal_context(row.kid))
    key = serialization.load_der_private_key(der, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TypeError(f"signing key {row.kid} is not an RSA key")
    return key


def published_jwk(row: SigningKeyRow) -> dict[str, Any]:
    """The key as the JWKS publishes it: its public part only."""
    public: dict[str, Any] = json.loads(row.public_jwk)
    return {**public, "kid": row.kid, "use": "sig", "alg": row.algorithm}


def current(keys: Sequence[SigningKeyRow], now: datetime) -> SigningKeyRow | None:
    """The key that signs at ``now``: the newest that has begun to (``keys`` in generation order)."""
    signing = [key for key in keys if key.signs_from <= now]
    return signing[-1] if signing else None


def next_key_signs_from(
    keys: Sequence[SigningKeyRow], now: datetime, rotation_seconds: float
) -> datetime | None:
    """When a key made now would begin to sign, if one is due now; None while none is due (the newest
    key is still young, or it is published and waits for its turn)."""
    if not keys:
        return now
    newest = keys[-1]
    ahead = timedelta(seconds=publish_ahead_seconds(rotation_seconds))
    if newest.signs_from > now or now < newest.signs_from + timedelta(seconds=rotation_seconds) - ahead:
        return None
    return now + ahead


def expired(keys: Sequence[SigningKeyRow], now: datetime) -> list[str]:
    """The kids of retired keys no unexpired token can name any more: their successor has signed for
    :data:`RETAIN_AFTER_RETIREMENT`."""
    return [
        key.kid
        for key, successor in itertools.pairwise(keys)
        if successor.signs_from + RETAIN_AFTER_RETIREMENT <= now
    ]


def current_until(keys: Sequence[SigningKeyRow], signing: SigningKeyRow, rotation_seconds: float) -> datetime:
    """Until when ``signing`` surely stays the current key, as far as ``keys`` tell: the time its published
    successor signs, or else the time a successor becomes due (when the keys must be read again)."""
    later = [key for key in keys if key.generation > signing.generation]
    if later:
        return later[0].signs_from
    ahead = publish_ahead_seconds(rotation_seconds)
    return signing.signs_from + timedelta(seconds=rotation_seconds - ahead)
