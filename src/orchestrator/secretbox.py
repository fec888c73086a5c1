"""Encryption of secrets at rest with the server key (AES-256-GCM).

A sealed value is ``v1.<base64url(nonce ‖ ciphertext)>``; a sealed object (``seal_bytes``: bundles, which may
be large) is ``SEALED_OBJECT_MAGIC ‖ nonce ‖ ciphertext``. The context (for example ``runner:org/id``) is
bound as associated data, so a sealed value copied to another row, or an object to another key, does not
open.

The database records a key check value of the server key (:func:`key_check_value`, never the key), so that a
server started with another key is refused at start, instead of failing on every sealed value later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orchestrator.errors import ConfigurationError, SealedValueError

_PREFIX = "v1."
#: The first bytes of an object sealed with ``seal_bytes`` (no gzip or tar file starts so).
SEALED_OBJECT_MAGIC = b"PO-SEALED-v1\n"
KEY_FILE_NAME = "server.key"
_KEY_CHECK_LABEL = b"po-key-check-v1"


class SecretBox:
    """Seals and opens small secrets with one 32-byte key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ConfigurationError(
                "the encryption key must be 32 bytes (base64-encoded in PO_ENCRYPTION_KEY)"
            )
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, *, context: str) -> str:
        nonce = os.urandom(12)
        sealed = nonce + self._aead.encrypt(nonce, plaintext, context.encode())
        return _PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def open(self, token: str, *, context: str) -> bytes:
        """The plaintext; SealedValueError (naming ``context``, which is no secret) if it does not open."""
        if not token.startswith(_PREFIX):
            raise SealedValueError(f"the stored secret of {context} has an unknown format")
        raw = token[len(_PREFIX) :]
        try:
            data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
            return self._aead.decrypt(data[:12], data[12:], context.encode())
        except (InvalidTag, ValueError, binascii.Error) as exc:
            raise SealedValueError(
                f"the stored secret of {context} does not open with the server key "
                "(it was sealed under another key, or damaged)"
            ) from exc

    def seal_bytes(self, plaintext: bytes, *, context: str) -> bytes:
        """``plaintext`` sealed as an object: no base64 (bundles), ``SEALED_OBJECT_MAGIC`` first."""
        nonce = os.urandom(12)
        return SEALED_OBJECT_MAGIC + nonce + self._aead.encrypt(nonce, plaintext, context.encode())

    def open_bytes(self, sealed: bytes, *, context: str) -> bytes:
        """The plaintext of ``seal_bytes``; SealedValueError (naming ``context``) if it does not open."""
        if not sealed.startswith(SEALED_OBJECT_MAGIC):
            raise SealedValueError(f"the stored object of {context} is not sealed")
        data = sealed[len(SEALED_OBJECT_MAGIC) :]
        try:
            return self._aead.decrypt(data[:12], data[12:], context.encode())
        except (InvalidTag, ValueError) as exc:
            raise SealedValueError(
                f"the stored object of {context} does not open with the server key "
                "(it was sealed under another key, or damaged)"
            ) from exc


def key_check_value(key: bytes) -> str:
    """What the database keeps to recognise the server key: HMAC-SHA256(key, label), hex. It reveals
    nothing of the key (nor of the keys derived from it, which use other labels)."""
    return hmac.new(key, _KEY_CHECK_LABEL, hashlib.sha256).hexdigest()


#: What to do about a malformed PO_ENCRYPTION_KEY, said with the error.
_KEY_HINT = (
    "; give the base64 of 32 random bytes (`openssl rand -base64 32`), the key this database was created "
    "with, or unset it to use the data dir's server.key"
)


def decode_key(value: str) -> bytes:
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except ValueError as exc:
        raise ConfigurationError("PO_ENCRYPTION_KEY is not valid base64" + _KEY_HINT) from exc
    if len(key) != 32:
        raise ConfigurationError("PO_ENCRYPTION_KEY must decode to 32 bytes" + _KEY_HINT)
    return key


def load_or_create_key(data_dir: Path) -> bytes:
    """Read the key file in the data dir, creating it (mode 0600) on first use."""
    path = data_dir / KEY_FILE_NAME
    if path.exists():
        return decode_key(path.read_text())
    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(key).decode())
    return key
