"""A server started with another key than the database's sealed values were sealed under is refused at
start with a clear error: the database records a key check value of the server key (never the key)."""

from __future__ import annotations

import asyncio
import base64
import os
import sys

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from orchestrator.errors import ConfigurationError
from orchestrator.secretbox import KEY_FILE_NAME, key_check_value
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store.schema import key_checks


def with_key(settings: ServerSettings, key: bytes | None) -> ServerSettings:
    encoded = None if key is None else SecretStr(base64.b64encode(key).decode())
    return settings.model_copy(update={"encryption_key": encoded})


async def start(settings: ServerSettings) -> None:
    """Start the app (its lifespan: migrations, key check) and stop it again."""
    app = create_app(settings, run_dispatcher=False)
    async with app.router.lifespan_context(app):
        pass


async def recorded(database_url: str) -> list[str]:
    engine = db.create_engine(database_url)
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(sa.select(key_checks.c.check_value))).scalars())
    finally:
        await db.dispose(engine)


async def test_key_check__another_key_is_refused_the_original_starts(
    settings: ServerSettings, database_url: str
) -> None:
    key_a, key_b = os.urandom(32), os.urandom(32)

    await start(with_key(settings, key_a))
    with pytest.raises(ConfigurationError) as refused:
        await start(with_key(settings, key_b))
    await start(with_key(settings, key_a))

    assert refused.value.message.startswith(
        "PO_ENCRYPTION_KEY is not the key this database was created with: "
    )
    assert [key_check_value(key_a)] == await recorded(database_url)


async def test_key_check__the_value_reveals_not_the_key(settings: ServerSettings, database_url: str) -> None:
    key = os.urandom(32)

    await start(with_key(settings, key))
    [stored] = await recorded(database_url)

    assert key.hex() not in stored
    assert base64.b64encode(key).decode() not in stored
    assert 64 == len(stored)


async def test_key_check__a_regenerated_key_file_is_refused_naming_it(settings: ServerSettings) -> None:
    plain = with_key(settings, None)
    await start(plain)
    key_file = settings.data_dir / KEY_FILE_NAME
    key_file.unlink()  # lost: the next start generates a new one

    with pytest.raises(ConfigurationError) as refused:
        await start(plain)

    assert refused.value.message.startswith(f"{key_file} is not the key this database was created with")


async def test_key_check__a_database_from_before_check_values_records_one(
    settings: ServerSettings, database_url: str
) -> None:
    key_a, key_b = os.urandom(32), os.urandom(32)
    engine = db.create_engine(database_url)
    try:
        await migrate.upgrade(engine, "0005")
    finally:
        await db.dispose(engine)

    await start(with_key(settings, key_a))
    with pytest.raises(ConfigurationError):
        await start(with_key(settings, key_b))

    assert [key_check_value(key_a)] == await recorded(database_url)


async def test_key_check__serve_refuses_with_one_line_and_no_traceback(
    settings: ServerSettings, database_url: str
) -> None:
    await start(with_key(settings, os.urandom(32)))
    env = {
        **os.environ,
        "PO_DATABASE_URL": database_url,
        "PO_DATA_DIR": str(settings.data_dir),
        "PO_LISTEN": "127.0.0.1:0",
        "PO_LOG_LEVEL": "warning",
        "PO_ENCRYPTION_KEY": base64.b64encode(os.urandom(32)).decode(),
    }

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.cli.server", "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:  # it started serving: not refused
            process.kill()
            await process.wait()
    lines = stderr.decode().strip().splitlines()

    assert 0 != process.returncode
    assert 1 == len(lines), lines
    assert lines[0].startswith("Error: PO_ENCRYPTION_KEY is not the key this database was created with")
