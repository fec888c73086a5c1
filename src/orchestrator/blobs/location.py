"""Where bundles and logs live: ``PO_OBJECT_STORE_URL`` parsed, and the store opened.

==========================  ===============================================================================
``file:///var/lib/po/obj``  files under that absolute directory (default: ``<data dir>/objects``)
``s3://bucket[/prefix]``    objects ``[prefix/]<key>`` in an S3 or S3-compatible bucket; credentials and
                            region from the standard AWS chain (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``,
                            ``AWS_PROFILE``, roles...); the endpoint from ``PO_OBJECT_STORE_ENDPOINT``
                            (path-style addressing) or boto3's own ``AWS_ENDPOINT_URL_S3``
==========================  ===============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from orchestrator.blobs import BlobStore, FileBlobStore
from orchestrator.errors import ConfigurationError

__all__ = ["FileLocation", "S3Location", "open_blob_store", "parse_object_store_url"]


@dataclass(frozen=True)
class FileLocation:
    root: Path


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str


def parse_object_store_url(url: str) -> FileLocation | S3Location:
    """``file:///abs/dir`` or ``s3://bucket[/prefix]``; raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ValueError(f"object store URL {url!r} must not have a query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"object store URL {url!r}: a file URL names no host (file:///abs/dir)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"object store URL {url!r}: the directory must be absolute")
        return FileLocation(Path(path))
    if parts.scheme == "s3":
        if not parts.netloc or parts.username or parts.password or parts.port:
            raise ValueError(f"object store URL {url!r} must be s3://bucket[/prefix]")
        from orchestrator.blobs.s3 import BUCKET_NAME

        if not BUCKET_NAME.match(parts.netloc):
            raise ValueError(f"object store URL {url!r}: invalid bucket name {parts.netloc!r}")
        return S3Location(bucket=parts.netloc, prefix=unquote(parts.path).strip("/"))
    raise ValueError(f"object store URL {url!r}: the scheme must be file or s3")


async def open_blob_store(url: str | None, *, data_dir: Path, endpoint_url: str | None = None) -> BlobStore:
    """The store ``url`` names (``None``: files under ``data_dir/objects``). An S3 bucket is checked
    (HeadBucket) so that a wrong bucket or credentials stop the server at start-up, not a deployment."""
    try:
        location = parse_object_store_url(url) if url else FileLocation(data_dir / "objects")
    except ValueError as exc:
        raise ConfigurationError(f"PO_OBJECT_STORE_URL: {exc}") from exc
    if isinstance(location, FileLocation):
        return FileBlobStore(location.root)
    from orchestrator.blobs.s3 import S3BlobStore

    store = S3BlobStore(location.bucket, location.prefix, endpoint_url=endpoint_url or None)
    await store.check()
    return store
