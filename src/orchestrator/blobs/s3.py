"""Blobs in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, SeaweedFS, moto...).

boto3 is synchronous: every call runs in a worker thread (``asyncio.to_thread``) on one client, which
is thread-safe. Credentials, region and retries come from boto3's standard chain (``AWS_*`` variables,
shared config files, instance/pod roles); only the endpoint can be given explicitly, for S3-compatible
servers, which are then addressed path-style (``http://host/bucket/key``). botocore errors are answered
as ``BlobStoreError``; a missing object is ``None``, as in every ``BlobStore``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from orchestrator.blobs import BlobStoreError, check_key
from orchestrator.errors import ConfigurationError, OrchestratorError

__all__ = ["S3BlobStore"]

#: S3 bucket naming rules (lowercase, 3-63 characters, no leading/trailing dot or dash).
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
_T = TypeVar("_T")


class S3BlobStore:
    """Blobs as objects ``[prefix/]key`` in ``bucket``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        max_connections: int = 20,
        client: Any = None,
    ) -> None:
        if not BUCKET_NAME.match(bucket):
            raise ConfigurationError(f"invalid S3 bucket name {bucket!r}")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_key(prefix)
            except OrchestratorError as exc:
                raise ConfigurationError(f"invalid object store prefix {prefix!r}") from exc
        self.bucket = bucket
        self.prefix = prefix
        if client is None:
            use_path_style = endpoint_url is not None if path_style is None else path_style
            config = botocore.config.Config(
                region_name=region,
                retries={"mode": "standard", "max_attempts": 5},
                connect_timeout=10,
                read_timeout=60,
                max_pool_connections=max_connections,
                s3={"addressing_style": "path"} if use_path_style else None,
            )
            client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self._client = client

    def __repr__(self) -> str:
        return f"S3BlobStore(s3://{self.bucket}/{self.prefix})"

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def _call(self, what: str, key: str, function: Callable[[], _T]) -> _T:
        try:
            return await asyncio.to_thread(function)
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", "?"), error.get("Message", "")
            raise BlobStoreError(
                f"object store unavailable: {what} s3://{self.bucket}/{key} failed: {code} {message}".rstrip()
            ) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise BlobStoreError(
                f"object store unavailable: {what} s3://{self.bucket}/{key} failed: {exc}"
            ) from exc

    async def put(self, key: str, data: bytes) -> None:
        name = self._key(key)
        await self._call(
            "put", name, lambda: self._client.put_object(Bucket=self.bucket, Key=name, Body=data)
        )

    def _get(self, name: str) -> bytes | None:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=name)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    async def get(self, key: str) -> bytes | None:
        name = self._key(key)
        return await self._call("get", name, lambda: self._get(name))

    async def delete(self, key: str) -> None:
        # DeleteObject succeeds for a missing key, as FileBlobStore.delete does.
        name = self._key(key)
        await self._call("delete", name, lambda: self._client.delete_object(Bucket=self.bucket, Key=name))

    async def check(self) -> None:
        """Raise ConfigurationError unless the bucket exists and the credentials may use it."""
        try:
            await self._call("head", "", lambda: self._client.head_bucket(Bucket=self.bucket))
        except BlobStoreError as exc:
            raise ConfigurationError(
                f"object store bucket {self.bucket!r} is not usable: {exc.message}"
            ) from exc

    def close(self) -> None:
        self._client.close()
