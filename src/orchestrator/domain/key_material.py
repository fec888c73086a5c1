"""Parsing the keys and certificates that runner configurations carry, with ``cryptography``.

Each ``check_*`` function returns its input unchanged or raises ``ValueError`` with a message fit for a 400
answer; they are used as pydantic validators. :func:`load_agent_public_key` is also what verifies an agent's
signatures later on.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_pem_public_key,
    load_ssh_private_key,
    load_ssh_public_key,
)

__all__ = [
    "AGENT_KEY_MAX_LENGTH",
    "check_agent_public_key",
    "check_base64_pem_certificates",
    "check_base64_pem_private_key",
    "check_ssh_private_key",
    "check_ssh_public_key",
    "load_agent_public_key",
]

#: Upstream's limit for an agent's public key (CPSPEC ``K8sAgentRunnerKey``).
AGENT_KEY_MAX_LENGTH: Final = 200

_PUBLIC_KEY_BEGIN: Final = "-----BEGIN PUBLIC KEY-----"
_PUBLIC_KEY_END: Final = "-----END PUBLIC KEY-----"
_AGENT_KEY_ERROR: Final = "does not look like an ed25519 public key in PEM format"


def load_agent_public_key(pem: str) -> Ed25519PublicKey:
    """Parse an agent's key: a PKIX ``PUBLIC KEY`` PEM block of an Ed25519 key, at most 200 characters."""
    if len(pem) > AGENT_KEY_MAX_LENGTH:
        raise ValueError(f"{_AGENT_KEY_ERROR}: longer than {AGENT_KEY_MAX_LENGTH} characters")
    text = pem.strip()
    if not (text.startswith(_PUBLIC_KEY_BEGIN) and text.endswith(_PUBLIC_KEY_END)):
        raise ValueError(f"{_AGENT_KEY_ERROR}: expected a '{_PUBLIC_KEY_BEGIN}' block")
    try:
        key = load_pem_public_key(text.encode("ascii"))
    except (ValueError, UnsupportedAlgorithm, UnicodeEncodeError) as exc:
        raise ValueError(f"{_AGENT_KEY_ERROR}: the PEM block does not decode") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{_AGENT_KEY_ERROR}: the key is not an Ed25519 key")
    return key


def check_agent_public_key(pem: str) -> str:
    load_agent_public_key(pem)
    return pem


def _b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        if value.rstrip().endswith("..."):
            # Seed 001's example shortens kubeconfig values so: LS0tLS1CRUdJTiBDRVJUS...
            raise ValueError(
                f"must be the base64 encoding of {what}, not a value shortened with '...' as in the "
                "documentation's example: give the whole value (kubectl config view --raw shows it)"
            ) from exc
        raise ValueError(f"must be the base64 encoding of {what}") from exc


def check_base64_pem_certificates(value: str) -> str:
    """Base64 of one or more PEM certificates, as kubeconfig's ``*-data`` fields hold them."""
    raw = _b64decode(value, "a PEM certificate")
    try:
        x509.load_pem_x509_certificates(raw)
    except ValueError as exc:
        raise ValueError("must be the base64 encoding of a PEM certificate") from exc
    return value


class _EncryptedKeyError(ValueError):
    def __init__(self) -> None:
        super().__init__("the private key must not be encrypted with a passphrase")


def _check_private_key(load: Callable[..., object], raw: bytes, problem: str) -> None:
    """``load`` (a ``cryptography`` private-key loader) must read ``raw`` without a password."""
    try:
        load(raw, password=None)
    except TypeError as exc:
        raise _EncryptedKeyError() from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(problem) from exc


def check_base64_pem_private_key(value: str) -> str:
    """Base64 of a PEM private key (kubeconfig ``client-key-data``)."""
    problem = "must be the base64 encoding of a PEM private key"
    _check_private_key(load_pem_private_key, _b64decode(value, "a PEM private key"), problem)
    return value


def check_ssh_private_key(value: str) -> str:
    """An unencrypted SSH private key, in OpenSSH or PEM format."""
    problem = "must be an SSH private key in OpenSSH or PEM format"
    raw = value.strip().encode("utf-8")
    openssh = raw.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    _check_private_key(load_ssh_private_key if openssh else load_pem_private_key, raw, problem)
    return value


def check_ssh_public_key(value: str) -> str:
    """An SSH public key in OpenSSH format: ``ssh-ed25519 AAAA... [comment]``."""
    try:
        load_ssh_public_key(value.strip().encode("utf-8"))
    except (ValueError, UnsupportedAlgorithm, UnicodeEncodeError) as exc:
        raise ValueError("must be an SSH public key in OpenSSH format, e.g. 'ssh-ed25519 AAAA...'") from exc
    return value
