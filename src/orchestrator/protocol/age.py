"""age (X25519) encryption of deployment outputs and logs, over pyrage.

The CLI generates a key pair per deployment, sends the recipient (``age1...``) with the deployment and
keeps the identity (``AGE-SECRET-KEY-1...``); the runner encrypts to the recipient. pyrage errors are
translated into the orchestrator error tree here.
"""

from __future__ import annotations

import base64
import binascii

import pyrage
from pyrage import x25519

from orchestrator import errors


class AgeKeyError(errors.InvalidInputError):
    """The age key is not valid."""


class AgeDecryptError(errors.OrchestratorError):
    """The data could not be decrypted with this age identity."""


class AgeEncryptError(errors.OrchestratorError):
    """The data could not be encrypted to this age recipient."""


def generate_identity() -> tuple[str, str]:
    """A fresh X25519 key pair as ``(identity "AGE-SECRET-KEY-1...", recipient "age1...")``."""
    identity = x25519.Identity.generate()
    return str(identity), str(identity.to_public())


def recipient_of(identity: str) -> str:
    """The recipient (public key) of an identity."""
    return str(_identity(identity).to_public())


def check_recipient(recipient: str) -> str:
    """Return ``recipient`` unchanged if it is a valid X25519 recipient, else raise ``AgeKeyError``."""
    _recipient(recipient)
    return recipient


def encrypt(data: bytes, recipient: str) -> bytes:
    """Binary age ciphertext of ``data`` for ``recipient``."""
    parsed = _recipient(recipient)
    try:
        return bytes(pyrage.encrypt(data, [parsed]))
    except pyrage.EncryptError as exc:
        raise AgeEncryptError(f"age encryption failed: {exc}") from exc


def decrypt(data: bytes, identity: str) -> bytes:
    """Plain text of binary age ciphertext ``data``; ``AgeDecryptError`` if it is not for ``identity``."""
    parsed = _identity(identity)
    try:
        return bytes(pyrage.decrypt(data, [parsed]))
    except pyrage.DecryptError as exc:
        raise AgeDecryptError(f"age decryption failed: {exc}") from exc


def encrypt_b64(data: bytes, recipient: str) -> str:
    """``encrypt`` as standard base64 text: the form of ``outputs`` and of the log upload."""
    return base64.b64encode(encrypt(data, recipient)).decode("ascii")


def decrypt_b64(text: str | bytes, identity: str) -> bytes:
    """Inverse of ``encrypt_b64``."""
    try:
        ciphertext = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AgeDecryptError("the ciphertext is not standard base64") from exc
    return decrypt(ciphertext, identity)


def _recipient(recipient: str) -> x25519.Recipient:
    try:
        return x25519.Recipient.from_str(recipient.strip())
    except pyrage.RecipientError as exc:
        raise AgeKeyError(f"not a valid age X25519 recipient: {exc}") from exc


def _identity(identity: str) -> x25519.Identity:
    try:
        return x25519.Identity.from_str(identity.strip())
    except pyrage.IdentityError as exc:
        # Never echo the identity itself: it is a secret.
        raise AgeKeyError(f"not a valid age X25519 identity: {exc}") from exc
