"""Several ``orchestrator serve`` replicas on one PostgreSQL behind one address, for the replica fault test
(tests/faults/test_replicas.py) and the replica benchmark (bench/replicas.py).

:class:`Replicas` starts ``count`` real server processes (:class:`tests.support.outages.ServerProcess`) on
one database, sharing the data dir (the server key) and the runs dir, as replicas on one host do, with a
:class:`tests.support.round_robin.RoundRobin` front whose URL is every replica's ``PO_PUBLIC_URL``: the
runners they launch, the agent and the managed runners all talk to the front, so a dead replica's runs
carry on through the others. :class:`DispatchView` reads the deployments' dispatch columns (who holds
which lease) straight from the database, to see a dead replica's leases and when the others take them over.
:func:`s3_object_store` is the environment of an S3-compatible object store (moto) shared by the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from orchestrator.store import db
from orchestrator.store.schema import deployments
from tests.support.emulators import MOTO_CREDENTIALS
from tests.support.outages import ServerProcess
from tests.support.round_robin import RoundRobin

T = TypeVar("T")

#: Final statuses of a deployment.
FINAL = ("succeeded", "failed", "cancelled")


class Replicas:
    """``count`` servers on ``database_url`` behind one round-robin front (see the module). ``environment``
    goes to every server (after the defaults of ServerProcess)."""

    def __init__(
        self, count: int, database_url: str, work: Path, *, environment: Mapping[str, str] | None = None
    ) -> None:
        self.database_url = database_url
        self.servers = [
            ServerProcess(database_url, work / "data", **dict(environment or {})) for _ in range(count)
        ]
        self.front = RoundRobin([server.port for server in self.servers])
        for server in self.servers:
            server.env["PO_PUBLIC_URL"] = self.front.url

    @property
    def url(self) -> str:
        return self.front.url

    def start(self) -> Replicas:
        """The front, then each server in turn (the first migrates a fresh database); on a failure, what
        was started is stopped again."""
        self.front.start()
        try:
            for server in self.servers:
                server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()
        self.front.stop()

    def __enter__(self) -> Replicas:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def name(self, server: ServerProcess) -> str:
        return f"r{self.servers.index(server)}"

    def running(self) -> list[ServerProcess]:
        return [server for server in self.servers if server.running]


def owner_prefix(server: ServerProcess) -> str:
    """The start of the dispatch owner of ``server``'s dispatcher (``host:pid:random``)."""
    assert server.process is not None
    return f"{socket.gethostname()}:{server.process.pid}:"


@dataclass(frozen=True, kw_only=True)
class DispatchRow:
    id: str
    status: str
    dispatch_state: str
    owner: str | None
    lease_until: datetime | None


class DispatchView:
    """Reads the deployments' dispatch columns from the database, through an engine on an event loop of its
    own, in a thread of its own: any thread may read (one read at a time)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="dispatch-view")
        self._thread.start()
        self._engine: AsyncEngine | None = None
        self._lock = threading.Lock()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def close(self) -> None:
        if self._engine is not None:
            self._run(self._engine.dispose())
            self._engine = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> DispatchView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, condition: sa.ColumnElement[bool]) -> dict[str, DispatchRow]:
        async def read() -> list[Any]:
            if self._engine is None:
                self._engine = db.create_engine(self.database_url)
            async with self._engine.connect() as conn:
                return list(
                    await conn.execute(
                        sa.select(
                            deployments.c.id,
                            deployments.c.status,
                            deployments.c.dispatch_state,
                            deployments.c.dispatch_owner,
                            deployments.c.dispatch_lease_until,
                        ).where(condition)
                    )
                )

        return {
            str(row.id): DispatchRow(
                id=str(row.id),
                status=str(row.status),
                dispatch_state=str(row.dispatch_state),
                owner=row.dispatch_owner,
                lease_until=row.dispatch_lease_until,
            )
            for row in self._run(read())
        }

    def all(self) -> dict[str, DispatchRow]:
        return self._rows(sa.true())

    def held_by(self, prefix: str) -> dict[str, DispatchRow]:
        """Executing deployments whose dispatch lease names an owner starting with ``prefix``."""
        return self._rows(
            sa.and_(deployments.c.dispatch_owner.startswith(prefix), deployments.c.status == "executing")
        )

    def wait_held_by(self, prefix: str, timeout_seconds: float, interval: float = 0.02) -> bool:
        """Wait until an owner starting with ``prefix`` holds a lease (False: not within the timeout)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.held_by(prefix):
                return True
            time.sleep(interval)
        return False

    def watch_takeover(
        self, prefix: str, ids: Iterable[str], *, since: float, timeout_seconds: float, interval: float = 0.1
    ) -> dict[str, float | None]:
        """Per deployment of ``ids`` (leased to a dead owner starting with ``prefix``): seconds from
        ``since`` (``time.monotonic()``, the kill) until another owner claimed it, its lease was ended, or
        it ended; None when that did not happen within ``timeout_seconds``."""
        waiting = set(ids)
        taken: dict[str, float | None] = dict.fromkeys(waiting)
        deadline = since + timeout_seconds
        while waiting and time.monotonic() < deadline:
            rows = self._rows(deployments.c.id.in_(list(waiting)))
            now = time.monotonic()
            for deployment_id in list(waiting):
                row = rows.get(deployment_id)
                if row is None or row.status != "executing" or not (row.owner or "").startswith(prefix):
                    taken[deployment_id] = round(now - since, 2)
                    waiting.discard(deployment_id)
            if waiting:
                time.sleep(interval)
        return taken


def s3_object_store(endpoint: str, bucket: str, prefix: str = "po") -> dict[str, str]:
    """The servers' environment for an object store in ``bucket`` at ``endpoint`` (moto: any credentials),
    after creating the bucket."""
    import boto3

    environment = {
        **MOTO_CREDENTIALS,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        region_name=environment["AWS_REGION"],
    ).create_bucket(Bucket=bucket)
    return {
        **environment,
        "PO_OBJECT_STORE_URL": f"s3://{bucket}/{prefix}",
        "PO_OBJECT_STORE_ENDPOINT": endpoint,
    }


def s3_object_count(endpoint: str, bucket: str) -> int:
    """Objects in ``bucket`` (moto)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=MOTO_CREDENTIALS["AWS_REGION"],
    )
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        count += len(page.get("Contents", []))
    return count
