"""Command receipts: AES-256-GCM sealed leases that any server replica can open (no sticky sessions).

A receipt names the command, the delivery attempt and the end of its lease; the agent echoes it on
``ack``, ``retry`` and ``reject``. The key is derived from the server key, so every replica sharing that key
verifies every receipt. To the agent a receipt is an opaque base64url string.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from orchestrator.errors import InvalidInputError

_PURPOSE = b"po-command-receipt-key-v1"
_AAD = b"po-command-receipt-v1"
_NONCE_BYTES = 12


class InvalidReceiptError(InvalidInputError):
    """The receipt is not valid for this command."""


@dataclass(frozen=True, kw_only=True)
class Receipt:
    org_id: str
    runner_id: str
    command_id: str
    attempt: int
    #: End of the lease this receipt was issued with.
    expires_at: datetime


def receipt_key(server_key: bytes) -> bytes:
    """A 32-byte AES-256-GCM key for receipts only, derived from the server key."""
    return hmac.new(server_key, _PURPOSE, hashlib.sha256).digest()


def seal(key: bytes, receipt: Receipt) -> str:
    body = json.dumps(
        {
            "organization_id": receipt.org_id,
            "runner_id": receipt.runner_id,
            "command_id": receipt.command_id,
            "attempt": receipt.attempt,
            "expires_at": receipt.expires_at.astimezone(UTC).isoformat(),
        },
        separators=(",", ":"),
    ).encode()
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + AESGCM(key).encrypt(nonce, body, _AAD)
    return base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def open_receipt(key: bytes, text: str, *, org_id: str, runner_id: str, command_id: str) -> Receipt:
    """The receipt, if it was sealed with ``key`` for this command of this runner."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        body = AESGCM(key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _AAD)
        fields = json.loads(body)
        receipt = Receipt(
            org_id=str(fields["organization_id"]),
            runner_id=str(fields["runner_id"]),
            command_id=str(fields["command_id"]),
            attempt=int(fields["attempt"]),
            expires_at=datetime.fromisoformat(fields["expires_at"]),
        )
    except (binascii.Error, ValueError, InvalidTag, KeyError, TypeError) as exc:
        raise InvalidReceiptError("invalid receipt") from exc
    if (receipt.org_id, receipt.runner_id, receipt.command_id) != (org_id, runner_id, command_id):
        raise InvalidReceiptError("the receipt is for another command")
    return receipt
