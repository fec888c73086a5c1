"""Object storage for bundles and logs: the filesystem by default, or an S3-compatible bucket.

    orchestrator.blobs           the ``BlobStore`` protocol, key checks, ``FileBlobStore``
    orchestrator.blobs.s3        ``S3BlobStore`` (boto3, calls run in worker threads)
    orchestrator.blobs.location  ``PO_OBJECT_STORE_URL`` parsing and ``open_blob_store``

Imports go one way: ``location`` → ``s3`` → this module; this module imports neither.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

from orchestrator.errors import ObjectStoreError, OrchestratorError

__all__ = ["BlobStore", "BlobStoreError", "FileBlobStore", "check_key"]

#: Path segments of letters, digits, ``.``, ``_``, ``-``; none empty, none starting with ``.`` (no ``..``).
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
MAX_KEY_LENGTH = 512


class BlobStoreError(ObjectStoreError):
    """The object store failed (answered 503: retrying may help once it is back or has room again)."""


class BlobStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...

    async def get(self, key: str) -> bytes | None: ...

    async def delete(self, key: str) -> None: ...


def check_key(key: str) -> str:
    """``key`` if it is a safe relative object key (``a/b.tar.gz``); raises OrchestratorError otherwise."""
    if len(key) > MAX_KEY_LENGTH or not _KEY.match(key):
        raise OrchestratorError(f"invalid blob key {key!r}")
    return key


def _failure(what: str, key: str, exc: OSError) -> BlobStoreError:
    """The answer to a filesystem error: what failed, on which object; the root directory stays in the
    server's log (``__cause__``), not in messages that API clients read."""
    reason = exc.strerror or type(exc).__name__
    return BlobStoreError(f"object store unavailable: cannot {what} {key!r}: {reason}")


class FileBlobStore:
    """Blobs as files under ``root``; writes are atomic (temporary file, then rename). Filesystem errors
    (read-only, disk full, permission denied) are raised as ``BlobStoreError``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    async def put(self, key: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._put, key, data)
        except OSError as exc:
            raise _failure("write", key, exc) from exc

    async def get(self, key: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._get, key)
        except OSError as exc:
            raise _failure("read", key, exc) from exc

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await asyncio.to_thread(path.unlink, missing_ok=True)
        except OSError as exc:
            raise _failure("delete", key, exc) from exc
