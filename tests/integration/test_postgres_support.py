"""The throwaway PostgreSQL server from tests/support/postgres.py really starts, serves and stops."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import pytest

from tests.support.postgres import PostgresServer, find_pg_bin

pytestmark = pytest.mark.postgres


def _tools_required() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")
        for name in ("CI", "PO_TEST_REQUIRE_TOOLS")
    )


def _require_pg_bin() -> Path:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        reason = (
            "PostgreSQL server binaries not found (set PO_TEST_PG_BIN or install the Debian "
            "package 'postgresql')"
        )
        if _tools_required():
            pytest.fail(f"{reason}; CI/PO_TEST_REQUIRE_TOOLS is set, so this is a failure")
        pytest.skip(reason)
    return bin_dir


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_start_create_query_stop(tmp_path: Path) -> None:
    server = PostgresServer(_require_pg_bin())
    try:
        server.start(tmp_path)
        assert server.running
        port = server.port
        assert _port_open(port)
        assert server.url("app") == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/app"

        server.create_database("app")
        conn = await asyncpg.connect(server.dsn("app"))
        try:
            assert await conn.fetchval("select 1") == 1
            assert await conn.fetchval("select current_database()") == "app"
            await conn.execute("create table t (x int); insert into t values (42)")
        finally:
            await conn.close()

        server.create_database("app_copy", template="app")
        conn = await asyncpg.connect(server.dsn("app_copy"))
        try:
            assert await conn.fetchval("select x from t") == 42
        finally:
            await conn.close()
    finally:
        server.stop()

    assert not server.running
    assert not _port_open(port)
    server.stop()  # idempotent
