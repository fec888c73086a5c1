"""Per-deployment tokens: derived from the server key, stored nowhere, compared in constant time.

Minted by the dispatcher (a launched run's ``TOKEN``) and the agent gateway (a command's delivery), checked
by the runner gateway: beside the secret box, below both, so that the dispatcher need not import the gateway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

_PURPOSE = b"po-deployment-token-v1"


def token_key(server_key: bytes) -> bytes:
    """A key for deployment tokens only, derived from the server key."""
    return hmac.new(server_key, _PURPOSE, hashlib.sha256).digest()


def deployment_token(key: bytes, org_id: str, deployment_id: str) -> str:
    mac = hmac.new(key, f"{org_id}\x00{deployment_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def verify(key: bytes, org_id: str, deployment_id: str, presented: str | None) -> bool:
    if not presented:
        return False
    expected = deployment_token(key, org_id, deployment_id)
    return hmac.compare_digest(expected.encode(), presented.strip().encode())
