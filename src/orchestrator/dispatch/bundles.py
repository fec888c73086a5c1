"""Deployment bundles in the object store, sealed with the server key.

A bundle holds the compiled root module, and with it the literal credentials of the module providers it
uses (``po-provider-secrets.auto.tfvars.json``), which the database keeps sealed: so the object is sealed
too (AES-256-GCM, the deployment bound as associated data: a bundle copied under another deployment's key
does not open). Bundles stored before sealing (plain tar.gz) are still read, as they are.
"""

from __future__ import annotations

import uuid

from orchestrator.blobs import BlobStore
from orchestrator.secretbox import SEALED_OBJECT_MAGIC, SecretBox


def bundle_key(org_id: str, deployment_id: uuid.UUID) -> str:
    return f"bundles/{org_id}/{deployment_id}.tar.gz.sealed"


def _context(org_id: str, deployment_id: uuid.UUID | str) -> str:
    return f"bundle:{org_id}/{deployment_id}"


async def put(blobs: BlobStore, box: SecretBox, org_id: str, deployment_id: uuid.UUID, bundle: bytes) -> str:
    """Seal and store a deployment's bundle; its object key."""
    key = bundle_key(org_id, deployment_id)
    await blobs.put(key, box.seal_bytes(bundle, context=_context(org_id, deployment_id)))
    return key


async def get(
    blobs: BlobStore, box: SecretBox, org_id: str, deployment_id: uuid.UUID | str, key: str
) -> bytes | None:
    """The bundle (tar.gz) stored under ``key`` for that deployment; None when the object is gone.
    SealedValueError when it does not open with the server key (another key, another deployment's object)."""
    stored = await blobs.get(key)
    return None if stored is None else opened(box, org_id, deployment_id, stored)


def opened(box: SecretBox, org_id: str, deployment_id: uuid.UUID | str, stored: bytes) -> bytes:
    """The bundle (tar.gz) of a stored object of that deployment: opened with the server key, or as it is
    when stored before bundles were sealed. SealedValueError when it does not open."""
    if not stored.startswith(SEALED_OBJECT_MAGIC):
        return stored
    return box.open_bytes(stored, context=_context(org_id, deployment_id))
