"""`orchestrator backup` and `orchestrator restore`: a consistent copy of a server's database and objects,
made while the server runs, and its restore onto an empty data dir or database.

A backup is a directory::

    manifest.json       format, schema revision, server version, database kind, key check value
    database.sqlite3    SQLite: a copy made with SQLite's online backup API (consistent while writers run)
    database.pgdump     PostgreSQL: ``pg_dump --format=custom`` (one snapshot: consistent while writers run)
    objects/            bundles, logs and outputs (the data dir's ``objects``, or the S3 bucket's objects)
    server.key          only with ``--include-key`` (mode 0600)

The database is copied first, then the objects: an object is written before the row naming it commits, so
every object the copied rows name is in the copy (objects written later are extra and harmless). The
manifest is written last: a directory without one is not a complete backup, and restore refuses it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from orchestrator import data_dir as private
from orchestrator.blobs.location import FileLocation, S3Location, parse_object_store_url
from orchestrator.errors import OrchestratorError
from orchestrator.secretbox import KEY_FILE_NAME, decode_key, key_check_value
from orchestrator.settings import ServerSettings
from orchestrator.store import db, deployments, key_checks, migrate

__all__ = ["BackupError", "backup", "restore"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SQLITE_FILE = "database.sqlite3"
PG_DUMP_FILE = "database.pgdump"
OBJECTS_DIR = "objects"
#: A directory of PostgreSQL client programs (pg_dump, pg_restore), looked at before PATH.
PG_BIN_ENV = "PO_PG_BIN"

Progress = Callable[[str], None]


class BackupError(OrchestratorError):
    """The backup or restore could not be made."""


def _server_version() -> str:
    try:
        return version("platform-orchestrator")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        return "unknown"


def _quiet(_: str) -> None:
    pass


# --- the server key ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    key: bytes
    source: str


def _configured_key(settings: ServerSettings) -> _Key | None:
    """PO_ENCRYPTION_KEY, else the data dir's key file; None when neither exists (nothing is created)."""
    if settings.encryption_key:
        return _Key(decode_key(settings.encryption_key.get_secret_value()), "PO_ENCRYPTION_KEY")
    path = settings.data_dir / KEY_FILE_NAME
    if path.exists():
        return _Key(decode_key(path.read_text()), str(path))
    return None


# --- the database -----------------------------------------------------------------------------------


def _kind(url: URL) -> str:
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise BackupError(f"cannot back up a {backend} database")
    return backend


def _sqlite_path(url: URL) -> Path:
    if not url.database or url.database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up")
    return Path(url.database)


def find_pg_tool(name: str) -> str:
    """The path of PostgreSQL client program ``name``: in $PO_PG_BIN, on PATH, or the newest
    ``/usr/lib/postgresql/*/bin``; BackupError saying what to install otherwise."""
    explicit = os.environ.get(PG_BIN_ENV)
    if explicit:
        candidate = Path(explicit) / name
        if candidate.is_file():
            return str(candidate)
        raise BackupError(f"{PG_BIN_ENV}={explicit} holds no {name}")
    found = shutil.which(name)
    if found:
        return found
    debian = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: [int(part) for part in p.parent.parent.name.split(".") if part.isdigit()],
    )
    if debian:
        return str(debian[-1])
    raise BackupError(
        f"{name} not found: install the PostgreSQL client programs (the server's major version or newer), "
        f"or set {PG_BIN_ENV} to the directory holding pg_dump and pg_restore"
    )


def _libpq(url: URL) -> tuple[list[str], dict[str, str]]:
    """Connection arguments and environment of libpq programs for a ``postgresql+asyncpg`` URL (the
    password goes in the environment, never on the command line)."""
    args = ["--dbname", url.database or "postgres"]
    if url.host:
        args += ["--host", url.host]
    if url.port:
        args += ["--port", str(url.port)]
    if url.username:
        args += ["--username", url.username]
    environ = dict(os.environ)
    environ["PGCONNECT_TIMEOUT"] = environ.get("PGCONNECT_TIMEOUT", "10")
    if url.password is not None:
        environ["PGPASSWORD"] = str(url.password)
    ssl = url.query.get("ssl") or url.query.get("sslmode")
    if isinstance(ssl, str):
        environ["PGSSLMODE"] = {"true": "require"}.get(ssl, ssl)
    return args, environ


def _run_pg(tool: str, args: list[str], environ: dict[str, str]) -> None:
    done = subprocess.run([find_pg_tool(tool), *args], env=environ, capture_output=True, text=True)
    if done.returncode != 0:
        detail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise BackupError(f"{tool} failed (exit {done.returncode}): {detail}")


def _sqlite_copy(source: Path, target: Path) -> None:
    """Copy with SQLite's online backup API, in one step: a consistent snapshot while writers run."""
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


async def _schema_and_check(url: str) -> tuple[frozenset[str], str | None]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            revisions = await migrate.current_revisions(conn)
            # key_checks came with 0006: a database not yet migrated past it has no recorded value.
            tables = await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names())
            check = await key_checks.get(conn) if "key_checks" in tables else None
    finally:
        await db.dispose(engine)
    return revisions, check


async def _tables(url: str) -> list[str]:
    engine = db.create_engine(url)
    try:
        async with engine.connect() as conn:
            names: list[str] = await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names())
    finally:
        await db.dispose(engine)
    return names


# --- the objects ------------------------------------------------------------------------------------


def _location(settings: ServerSettings) -> FileLocation | S3Location:
    url = settings.object_store_url
    return parse_object_store_url(url) if url else FileLocation(settings.data_dir / OBJECTS_DIR)


def _s3_client(settings: ServerSettings) -> Any:
    from orchestrator.blobs.s3 import S3BlobStore

    location = _location(settings)
    assert isinstance(location, S3Location)
    store = S3BlobStore(location.bucket, location.prefix, endpoint_url=settings.object_store_endpoint or None)
    return store._client


def _s3_names(client: Any, location: S3Location) -> Iterator[tuple[str, str]]:
    """(object name in the bucket, key under the prefix) of every object under the store's prefix."""
    prefix = f"{location.prefix}/" if location.prefix else ""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            yield item["Key"], item["Key"][len(prefix) :]


def _file_objects(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith(".tmp-"):
            yield path


def _copy_objects_out(settings: ServerSettings, target: Path) -> int:
    location = _location(settings)
    target.mkdir(mode=0o700)
    count = 0
    if isinstance(location, FileLocation):
        for path in _file_objects(location.root):
            destination = target / path.relative_to(location.root)
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                shutil.copyfile(path, destination)
            except FileNotFoundError:  # deleted by retention since it was listed
                continue
            count += 1
        return count
    client = _s3_client(settings)
    try:
        for name, key in _s3_names(client, location):
            destination = target / key
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            client.download_file(location.bucket, name, str(destination))
            count += 1
    finally:
        client.close()
    return count


def _objects_present(settings: ServerSettings) -> str | None:
    """What holds objects already (for the refusal of a non-empty target), or None."""
    location = _location(settings)
    if isinstance(location, FileLocation):
        return str(location.root) if next(_file_objects(location.root), None) is not None else None
    client = _s3_client(settings)
    try:
        found = next(_s3_names(client, location), None)
    finally:
        client.close()
    return f"s3://{location.bucket}/{location.prefix}" if found is not None else None


def _copy_objects_in(settings: ServerSettings, source: Path) -> int:
    location = _location(settings)
    count = 0
    if isinstance(location, FileLocation):
        for path in _file_objects(source):
            destination = location.root / path.relative_to(source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, destination)
            count += 1
        return count
    client = _s3_client(settings)
    prefix = f"{location.prefix}/" if location.prefix else ""
    try:
        for path in _file_objects(source):
            client.upload_file(str(path), location.bucket, prefix + path.relative_to(source).as_posix())
            count += 1
    finally:
        client.close()
    return count


# --- backup -----------------------------------------------------------------------------------------


def backup(
    settings: ServerSettings, destination: Path, *, include_key: bool = False, progress: Progress = _quiet
) -> dict[str, Any]:
    """Copy the server's database, objects (and, with ``include_key``, its key) into ``destination``, a
    new or empty directory; returns the manifest written."""
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise BackupError(f"{destination} exists and is not an empty directory: back up into a new one")
    url = make_url(settings.resolved_database_url)
    kind = _kind(url)
    if kind == "sqlite" and not _sqlite_path(url).is_file():
        raise BackupError(
            f"no SQLite database at {_sqlite_path(url)}: run it with the server's settings (PO_DATA_DIR or "
            "--data-dir, PO_DATABASE_URL or --database-url)"
        )
    revisions, recorded_check = asyncio.run(_schema_and_check(settings.resolved_database_url))
    if not revisions:
        raise BackupError("the database has no schema yet: there is nothing to back up")
    key = _configured_key(settings)
    if recorded_check is not None:
        check = recorded_check
    elif key is not None:
        check = key_check_value(key.key)
    else:
        raise BackupError(
            "no server key: set PO_ENCRYPTION_KEY or point --data-dir at the data dir holding "
            f"{KEY_FILE_NAME}"
        )
    if include_key:
        if key is None:
            raise BackupError(
                f"--include-key: no server key is configured (PO_ENCRYPTION_KEY, or {KEY_FILE_NAME} in the "
                "data dir)"
            )
        if key_check_value(key.key) != check:
            raise BackupError(
                f"{key.source} is not the key this database was created with: it cannot be included"
            )

    destination.mkdir(parents=True, exist_ok=True, mode=0o700)
    destination.chmod(0o700)
    if kind == "sqlite":
        progress(f"copying the SQLite database {_sqlite_path(url)} (online backup)")
        _sqlite_copy(_sqlite_path(url), destination / SQLITE_FILE)
        (destination / SQLITE_FILE).chmod(0o600)
        database_file = SQLITE_FILE
    else:
        progress(f"dumping the PostgreSQL database {url.database} (pg_dump --format=custom)")
        args, environ = _libpq(url)
        _run_pg(
            "pg_dump",
            [
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                "--file",
                str(destination / PG_DUMP_FILE),
                *args,
            ],
            environ,
        )
        (destination / PG_DUMP_FILE).chmod(0o600)
        database_file = PG_DUMP_FILE
    location = _location(settings)
    where = (
        str(location.root)
        if isinstance(location, FileLocation)
        else f"s3://{location.bucket}/{location.prefix}"
    )
    progress(f"copying the objects of {where}")
    objects = _copy_objects_out(settings, destination / OBJECTS_DIR)
    if include_key and key is not None:
        path = destination / KEY_FILE_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(base64.b64encode(key.key).decode())
        progress(f"including the server key ({key.source}): keep this backup as secret as the key")
    manifest = {
        "format": FORMAT_VERSION,
        "schema_revision": ", ".join(sorted(revisions)),
        "server_version": _server_version(),
        "created_at": datetime.now(UTC).isoformat(),
        "database": kind,
        "database_file": database_file,
        "objects": objects,
        "key_included": include_key,
        "key_check": check,
    }
    _write_private(destination / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


# --- restore ----------------------------------------------------------------------------------------


def read_manifest(source: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{source} is not a complete backup: it has no {MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source / MANIFEST} cannot be read: {exc}") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise BackupError(
            f"{source} is a backup of format {manifest.get('format')!r}, this build reads {FORMAT_VERSION}: "
            "restore it with the orchestrator that made it or a newer one"
        )
    return manifest


def _restore_key(settings: ServerSettings, source: Path, manifest: dict[str, Any]) -> _Key:
    """The key the restored server will use; refuses one that does not open the backup."""
    key = _configured_key(settings)
    if key is None and manifest.get("key_included"):
        key = _Key(
            decode_key((source / KEY_FILE_NAME).read_text()), f"{source / KEY_FILE_NAME} (in the backup)"
        )
    if key is None:
        raise BackupError(
            "the server key does not open this backup: the backup does not include the key (made without "
            "--include-key) and none is configured; set PO_ENCRYPTION_KEY or put the original "
            f"{KEY_FILE_NAME} "
            "in the data dir"
        )
    if key_check_value(key.key) != manifest.get("key_check"):
        raise BackupError(
            f"the server key does not open this backup: {key.source} is not the key the backup's database "
            "was created with; use the original key (PO_ENCRYPTION_KEY, or the server.key of the original "
            "data dir, or a backup made with --include-key)"
        )
    return key


def _refuse_non_empty(settings: ServerSettings, url: URL) -> None:
    kind = _kind(url)
    if kind == "sqlite":
        path = _sqlite_path(url)
        if path.exists() and path.stat().st_size > 0 and asyncio.run(_tables(settings.resolved_database_url)):
            raise BackupError(f"the database {path} is not empty: restore onto a new data dir or database")
    elif tables := asyncio.run(_tables(settings.resolved_database_url)):
        raise BackupError(
            f"the database {url.database} is not empty (it has {len(tables)} tables, e.g. "
            f"{sorted(tables)[0]}): "
            "restore into a new, empty database"
        )
    objects = _objects_present(settings)
    if objects is not None:
        raise BackupError(
            f"the object store {objects} is not empty: restore onto a new data dir or object store"
        )
    if settings.data_dir.is_dir():
        allowed = {KEY_FILE_NAME, OBJECTS_DIR}
        if kind == "sqlite":
            allowed |= {p.name for p in _sqlite_companions(_sqlite_path(url))}
        extra = sorted(p.name for p in settings.data_dir.iterdir() if p.name not in allowed)
        if extra:
            raise BackupError(
                f"the data dir {settings.data_dir} is not empty (it holds {extra[0]}): restore onto a new "
                "data dir"
            )


def _sqlite_companions(path: Path) -> list[Path]:
    return [
        path,
        path.with_name(path.name + "-wal"),
        path.with_name(path.name + "-shm"),
        path.with_name(path.name + "-journal"),
    ]


def restore(settings: ServerSettings, source: Path, *, progress: Progress = _quiet) -> dict[str, Any]:
    """Restore the backup in ``source`` onto the empty data dir, database and object store of
    ``settings``, then migrate it to this build's head; returns the backup's manifest."""
    manifest = read_manifest(source)
    revision = str(manifest.get("schema_revision", ""))
    if not all(migrate.known_revision(r.strip()) for r in revision.split(",")):
        raise BackupError(
            f"the backup is of schema {revision}, newer than this build's {migrate.head()}: restore it with "
            "a newer orchestrator"
        )
    url = make_url(settings.resolved_database_url)
    kind = _kind(url)
    if manifest.get("database") != kind:
        raise BackupError(
            f"the backup is of a {manifest.get('database')} database, the target is {kind}: restore it onto "
            f"a {manifest.get('database')} database"
        )
    key = _restore_key(settings, source, manifest)
    _refuse_non_empty(settings, url)

    private.prepare(settings.data_dir)
    if kind == "sqlite":
        path = _sqlite_path(url)
        progress(f"restoring the SQLite database into {path}")
        for companion in _sqlite_companions(path):
            companion.unlink(missing_ok=True)
        private.private_sqlite_file(settings.resolved_database_url)
        _sqlite_copy(source / SQLITE_FILE, path)
    else:
        progress(f"restoring the PostgreSQL database {url.database} (pg_restore)")
        args, environ = _libpq(url)
        _run_pg(
            "pg_restore",
            [
                "--no-owner",
                "--no-privileges",
                "--single-transaction",
                "--exit-on-error",
                *args,
                str(source / PG_DUMP_FILE),
            ],
            environ,
        )
    progress("restoring the objects")
    _copy_objects_in(settings, source / OBJECTS_DIR)
    if not settings.encryption_key and not (settings.data_dir / KEY_FILE_NAME).exists():
        _write_private(settings.data_dir / KEY_FILE_NAME, base64.b64encode(key.key).decode())
        progress(f"the server key of the backup is now {settings.data_dir / KEY_FILE_NAME}")
    if revision != migrate.head():
        progress(f"migrating the schema from {revision} to {migrate.head()}")
    released = asyncio.run(_migrate_and_release(settings.resolved_database_url))
    if released:
        progress(f"handed back {released} dispatch claims of the backed-up server")
    return manifest


async def _migrate_and_release(url: str) -> int:
    """Bring the restored schema to the head; end the backed-up server's dispatch claims, so that the
    restored server checks the deployments it finds executing at once (their runners belong to the
    backed-up server: gone, they fail as after a crash)."""
    engine = db.create_engine(url)
    try:
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            return await deployments.release_every_claim(conn, now=datetime.now(UTC))
    finally:
        await db.dispose(engine)
