"""Object stores for bundles and logs: the filesystem and an S3 bucket (moto_server over real HTTP)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pydantic
import pytest

from orchestrator.blobs import BlobStore, BlobStoreError, FileBlobStore
from orchestrator.blobs.location import FileLocation, S3Location, open_blob_store, parse_object_store_url
from orchestrator.blobs.s3 import S3BlobStore
from orchestrator.errors import ConfigurationError, OrchestratorError
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.emulators import (
    FAKE_GCS_SERVER_ENV,
    MOTO_CREDENTIALS,
    MOTO_SERVER_ENV,
    Emulator,
    emulator_or_skip,
    start_fake_gcs,
    start_moto,
)

UNSAFE_KEYS = [
    "",
    "/etc/passwd",
    "../outside",
    "bundles/../../outside",
    "bundles//x",
    "bundles/",
    ".hidden",
    "bundles/.tmp-x",
    "a\\b",
    "a b",
    "bündel",
    "a\x00b",
    "x" * 513,
]


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = emulator_or_skip(start_moto, tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's standard chain sees the test credentials only, never the developer's AWS profile."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in MOTO_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def s3_client(moto: Emulator) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=moto.url,
        region_name=MOTO_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def bucket(moto: Emulator, aws_env: None) -> str:
    name = f"blobs-{uuid.uuid4().hex[:12]}"
    s3_client(moto).create_bucket(Bucket=name)
    return name


def bucket_keys(moto: Emulator, bucket: str) -> list[str]:
    listed = s3_client(moto).list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listed.get("Contents", []))


def stored_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@dataclass
class Subject:
    """A store under test and what it holds, as stored (file paths or object keys)."""

    store: BlobStore
    listing: Callable[[], list[str]]


@pytest.fixture(params=["file", "s3", "s3-prefixed"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "file":
        root = tmp_path / "objects"
        yield Subject(FileBlobStore(root), lambda: stored_files(root))
        return
    moto: Emulator = request.getfixturevalue("moto")
    name: str = request.getfixturevalue("bucket")
    prefix = "po/objects" if request.param == "s3-prefixed" else ""
    s3 = S3BlobStore(name, prefix, endpoint_url=moto.url)
    yield Subject(s3, lambda: bucket_keys(moto, name))
    s3.close()


@pytest.fixture
def store(subject: Subject) -> BlobStore:
    return subject.store


async def test_put_get__round_trip_of_any_bytes(store: BlobStore) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value

    await store.put("bundles/acme/d1.tar.gz", data)

    assert data == await store.get("bundles/acme/d1.tar.gz")


async def test_put__overwrites(store: BlobStore) -> None:
    await store.put("logs/acme/d1", b"first")
    await store.put("logs/acme/d1", b"second")

    assert b"second" == await store.get("logs/acme/d1")


async def test_get__missing_is_none(store: BlobStore) -> None:
    assert await store.get("bundles/acme/never-written.tar.gz") is None


async def test_delete__removes_and_is_idempotent(subject: Subject) -> None:
    store = subject.store
    await store.put("bundles/acme/d1.tar.gz", b"x")
    await store.put("bundles/acme/d2.tar.gz", b"y")

    await store.delete("bundles/acme/d1.tar.gz")
    await store.delete("bundles/acme/d1.tar.gz")
    await store.delete("bundles/acme/never-written.tar.gz")

    assert await store.get("bundles/acme/d1.tar.gz") is None
    assert b"y" == await store.get("bundles/acme/d2.tar.gz")
    assert 1 == len(subject.listing())


async def test_concurrent_puts_and_gets(store: BlobStore) -> None:
    keys = [f"logs/acme/{i:03d}" for i in range(40)]

    await asyncio.gather(*(store.put(key, key.encode() * 1000) for key in keys))
    found = await asyncio.gather(*(store.get(key) for key in keys))

    assert [key.encode() * 1000 for key in keys] == found


@pytest.mark.parametrize("key", UNSAFE_KEYS, ids=lambda k: repr(k)[:20])
async def test_unsafe_keys__refused_for_every_operation(subject: Subject, key: str) -> None:
    store = subject.store
    for operation in (store.put(key, b"x"), store.get(key), store.delete(key)):
        with pytest.raises(OrchestratorError, match="invalid blob key"):
            await operation

    assert [] == subject.listing()


async def test_s3__objects_are_named_prefix_slash_key(moto: Emulator, bucket: str) -> None:
    store = S3BlobStore(bucket, "/po/objects/", endpoint_url=moto.url)

    await store.put("bundles/acme/d1.tar.gz", b"bundle")

    assert ["po/objects/bundles/acme/d1.tar.gz"] == bucket_keys(moto, bucket)
    body = s3_client(moto).get_object(Bucket=bucket, Key="po/objects/bundles/acme/d1.tar.gz")["Body"]
    assert b"bundle" == body.read()


async def test_s3__missing_bucket_is_a_blob_store_error(moto: Emulator, aws_env: None) -> None:
    store = S3BlobStore("no-such-bucket", endpoint_url=moto.url)

    with pytest.raises(BlobStoreError, match="NoSuchBucket"):
        await store.put("logs/acme/d1", b"x")
    with pytest.raises(BlobStoreError, match="NoSuchBucket"):
        await store.get("logs/acme/d1")


async def test_s3__unreachable_endpoint_is_a_blob_store_error(aws_env: None) -> None:
    from tests.support.postgres import free_port

    store = S3BlobStore("bucket", endpoint_url=f"http://127.0.0.1:{free_port()}")

    with pytest.raises(BlobStoreError, match="Could not connect"):
        await store.get("logs/acme/d1")


async def test_open_blob_store__default_is_files_in_the_data_dir(tmp_path: Path) -> None:
    store = await open_blob_store(None, data_dir=tmp_path)

    await store.put("bundles/x", b"1")

    assert (tmp_path / "objects" / "bundles" / "x").read_bytes() == b"1"


async def test_open_blob_store__file_url(tmp_path: Path) -> None:
    store = await open_blob_store(f"file://{tmp_path}/elsewhere", data_dir=tmp_path / "data")

    await store.put("bundles/x", b"1")

    assert (tmp_path / "elsewhere" / "bundles" / "x").read_bytes() == b"1"


async def test_open_blob_store__s3_url(moto: Emulator, bucket: str, tmp_path: Path) -> None:
    store = await open_blob_store(f"s3://{bucket}/po", data_dir=tmp_path, endpoint_url=moto.url)

    await store.put("logs/acme/d1", b"log")

    assert ["po/logs/acme/d1"] == bucket_keys(moto, bucket)
    assert not (tmp_path / "objects").exists()


async def test_open_blob_store__missing_bucket_stops_start_up(
    moto: Emulator, aws_env: None, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match="'no-such-bucket' is not usable"):
        await open_blob_store("s3://no-such-bucket", data_dir=tmp_path, endpoint_url=moto.url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///var/lib/po/objects", FileLocation(Path("/var/lib/po/objects"))),
        ("file://localhost/srv/o", FileLocation(Path("/srv/o"))),
        ("s3://my-bucket", S3Location("my-bucket", "")),
        ("s3://my-bucket/", S3Location("my-bucket", "")),
        ("s3://my-bucket/po/objects/", S3Location("my-bucket", "po/objects")),
    ],
)
def test_parse_object_store_url(url: str, expected: object) -> None:
    assert expected == parse_object_store_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "objects",
        "/var/lib/po",
        "file://host/dir",
        "file:relative",
        "s3://",
        "s3://Upper_Case",
        "s3://b",
        "s3://key:secret@bucket/x",
        "s3://bucket:9000/x",
        "s3://bucket/x?region=eu",
        "gs://bucket",
        "http://minio:9000/bucket",
    ],
)
def test_parse_object_store_url__refuses(url: str) -> None:
    with pytest.raises(ValueError, match="object store URL"):
        parse_object_store_url(url)


def test_settings__object_store_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PO_OBJECT_STORE_URL", "s3://po-objects/prod")
    monkeypatch.setenv("PO_OBJECT_STORE_ENDPOINT", "http://127.0.0.1:9000")

    settings = ServerSettings(data_dir=tmp_path)

    assert ("s3://po-objects/prod", "http://127.0.0.1:9000") == (
        settings.object_store_url,
        settings.object_store_endpoint,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("object_store_url", "ftp://host/x"), ("object_store_endpoint", "minio:9000")],
)
def test_settings__bad_object_store_refused(field: str, value: str, tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        ServerSettings.model_validate({"data_dir": tmp_path, field: value})


async def test_server__missing_bucket_stops_start_up(
    settings: ServerSettings, moto: Emulator, aws_env: None
) -> None:
    app = create_app(
        settings.model_copy(
            update={"object_store_url": "s3://no-such-bucket/po", "object_store_endpoint": moto.url}
        )
    )

    with pytest.raises(ConfigurationError, match=r"bucket .no-such-bucket. is not usable.*404"):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.parametrize(
    ("start", "variable"), [(start_moto, MOTO_SERVER_ENV), (start_fake_gcs, FAKE_GCS_SERVER_ENV)]
)
@pytest.mark.parametrize("required", [False, True], ids=["skip", "fail-when-required"])
def test_missing_emulator__skips_or_fails(
    start: Callable[[Path], Emulator],
    variable: str,
    required: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(variable, str(tmp_path / "not-installed"))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PO_TEST_REQUIRE_TOOLS", raising=False)
    if required:
        monkeypatch.setenv("PO_TEST_REQUIRE_TOOLS", "1")
    outcome = pytest.fail.Exception if required else pytest.skip.Exception

    with pytest.raises(outcome, match="not found"):
        emulator_or_skip(start, tmp_path)
