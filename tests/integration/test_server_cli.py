"""``orchestrator`` as users run it (the installed console script, a process): each misconfiguration is one
line saying what to do next, with a non-zero exit and no traceback; the first start without
PO_BOOTSTRAP_TOKEN prints a platform admin token once; ``--version``; ``serve --help`` lists every setting."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from orchestrator.cli import server as server_cli
from orchestrator.settings import ServerSettings
from tests.support.readonly import read_only
from tests.support.tools import tools_required

ORCHESTRATOR = Path(sys.executable).with_name("orchestrator")
TIMEOUT_SECONDS = 120
TOKEN = re.compile(r"^\s+(po_[A-Za-z0-9_-]{20,})\s*$", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PO_")}
    environ["PO_DATA_DIR"] = str(tmp_path / "data")
    environ["PO_LISTEN"] = f"127.0.0.1:{_free_port()}"
    environ.update(extra)
    return environ


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ORCHESTRATOR), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS
    )


def _one_line_error(done: subprocess.CompletedProcess[str], *hints: str) -> None:
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert 1 == len(errors), done.stderr
    for hint in hints:
        assert hint in errors[0]


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("nonsense://somewhere", "use sqlite+aiosqlite:///PATH or postgresql+asyncpg://"),
        ("sqlite:///tmp/po.db", "the driver 'sqlite' is not one this server uses"),
        ("postgresql://po@127.0.0.1/po", "the driver 'postgresql' is not one this server uses"),
        ("::not a url::", "PO_DATABASE_URL is not a database URL"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_bad_database_url__one_line(command: str, url: str, hint: str, tmp_path: Path) -> None:
    done = _run(command, env=_environ(tmp_path, PO_DATABASE_URL=url))

    _one_line_error(done, "PO_DATABASE_URL", hint)


def test_unreachable_postgresql__one_line_naming_what_to_check(tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://po:secret@127.0.0.1:{_free_port()}/po"

    done = _run("serve", env=_environ(tmp_path, PO_DATABASE_URL=url))

    _one_line_error(done, "database unavailable", "check PO_DATABASE_URL", "running and reachable")
    assert "secret" not in done.stderr
    assert server_cli.STARTUP_FAILURE == done.returncode


@pytest.mark.parametrize("key", ["not base64!", "c2hvcnQ="])
def test_malformed_encryption_key__one_line_saying_how_to_make_one(key: str, tmp_path: Path) -> None:
    done = _run("serve", env=_environ(tmp_path, PO_ENCRYPTION_KEY=key))

    _one_line_error(done, "PO_ENCRYPTION_KEY", "openssl rand -base64 32")
    assert key not in done.stderr


def test_read_only_data_dir__one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)

    with read_only(data, required=tools_required()):
        done = _run("serve", env=_environ(tmp_path))

    _one_line_error(done, f"cannot write {data}", "make the data dir writable")


def test_bad_setting__one_line_naming_the_variable(tmp_path: Path) -> None:
    done = _run("serve", env=_environ(tmp_path, PO_DEPLOYMENT_TIMEOUT_SECONDS="soon"))

    _one_line_error(done, "PO_DEPLOYMENT_TIMEOUT_SECONDS")
    assert 2 == done.returncode


Start = Callable[[], tuple[str, "subprocess.Popen[str]"]]


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Start]:
    """``start()`` starts ``orchestrator serve`` on the test's data dir; each is stopped by its pid."""
    env = _environ(tmp_path)
    started: list[subprocess.Popen[str]] = []

    def start() -> tuple[str, subprocess.Popen[str]]:
        """Start, wait for /healthz, stop; answer the stderr and the base URL."""
        env["PO_LISTEN"] = f"127.0.0.1:{_free_port()}"
        process = subprocess.Popen(
            [str(ORCHESTRATOR), "serve"], env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        base_url = f"http://{env['PO_LISTEN']}"
        _wait_healthy(process, base_url)
        return base_url, process

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=TIMEOUT_SECONDS)  # also closes its pipes


def _wait_healthy(process: subprocess.Popen[str], base_url: str) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise AssertionError(f"the server ended: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=TIMEOUT_SECONDS)
    return stderr


def test_first_start_without_bootstrap_token__prints_an_admin_token_once(
    serving: Start, tmp_path: Path
) -> None:
    _, first = serving()
    first_stderr = _stop(first)
    _, second = serving()
    second_stderr = _stop(second)

    tokens = TOKEN.findall(first_stderr)
    assert 1 == len(tokens), first_stderr
    assert "orchestrator token create" in first_stderr
    assert [] == TOKEN.findall(second_stderr), second_stderr
    # Only in the banner: on no other line of the first start, nor anywhere in the data dir.
    assert 1 == sum(1 for line in first_stderr.splitlines() if tokens[0] in line)
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            assert tokens[0].encode() not in path.read_bytes()


def test_first_start_token__is_a_platform_admin_token(serving: Start) -> None:
    base_url, first = serving()
    token = TOKEN.findall(_banner_so_far(first))
    assert token

    created = httpx.post(
        f"{base_url}/orgs", json={"id": "acme"}, headers={"Authorization": f"Bearer {token[0]}"}, timeout=30
    )

    assert 201 == created.status_code, created.text


def _banner_so_far(process: subprocess.Popen[str]) -> str:
    """The stderr up to the banner's last line (the process goes on)."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "orchestrator token create" in line:
            break
    return "".join(lines)


def test_token_create__makes_a_working_token(serving: Start, tmp_path: Path) -> None:
    env = _environ(tmp_path, PO_BOOTSTRAP_TOKEN="po_bootstrap_" + "b" * 40)
    assert 0 == _run("migrate", env=env).returncode

    made = _run("token", "create", env=env)
    assert 0 == made.returncode, made.stderr
    base_url, process = serving()

    listed = httpx.get(
        f"{base_url}/orgs", headers={"Authorization": f"Bearer {made.stdout.strip()}"}, timeout=30
    )

    assert 200 == listed.status_code, listed.text
    assert made.stdout.strip() not in _stop(process)


def test_version() -> None:
    done = _run("--version", env=dict(os.environ))

    assert 0 == done.returncode
    assert re.match(r"orchestrator, version \d+\.\d+", done.stdout)


def test_serve_help__lists_every_setting() -> None:
    shown = CliRunner().invoke(server_cli.main, ["serve", "--help"], terminal_width=200)

    assert 0 == shown.exit_code
    names = list(ServerSettings.model_fields)
    assert len(names) > 30
    for name in names:
        variable = "MANAGED_RUNNER_SECRET" if name == "managed_runner_secret" else f"PO_{name.upper()}"
        assert variable in shown.output, variable


def _set_revision(database_url: str, revision: str) -> None:
    """Pretend a newer orchestrator migrated the database: its alembic_version names ``revision``."""
    import asyncio

    import sqlalchemy as sa

    from orchestrator.store import db

    async def run() -> None:
        engine = db.create_engine(database_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
        finally:
            await db.dispose(engine)

    asyncio.run(run())


@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_schema_newer_than_this_build__refused_naming_both_revisions(
    command: str, database_url: str, tmp_path: Path
) -> None:
    from orchestrator.store import migrate

    env = _environ(tmp_path, PO_DATABASE_URL=database_url)
    assert 0 == _run("migrate", env=env).returncode
    _set_revision(database_url, "9999_from_the_future")

    done = _run(command, env=env)

    _one_line_error(
        done,
        f"the database's schema is at revision 9999_from_the_future, newer than this orchestrator's "
        f"{migrate.head()} (head); run a newer orchestrator, or restore a backup",
    )
    assert (server_cli.STARTUP_FAILURE if command == "serve" else 1) == done.returncode


def test_backup_and_restore_commands__as_the_readme_shows(database_url: str, tmp_path: Path) -> None:
    """`orchestrator backup DEST` (key apart), `orchestrator restore DEST` onto a new data dir holding the
    key; a second restore onto it is refused, as is a restore with another key; `--include-key`."""
    import base64

    source = _environ(
        tmp_path, PO_DATABASE_URL=database_url, PO_ENCRYPTION_KEY=base64.b64encode(b"a" * 32).decode()
    )
    assert 0 == _run("migrate", env=source).returncode
    assert 0 == _run("token", "create", env=source).returncode
    backup_dir = tmp_path / "backup"

    made = _run("backup", str(backup_dir), env=source)

    assert 0 == made.returncode, made.stderr
    assert "server key not included" in made.stderr
    target_url = _empty_database_like(database_url, tmp_path)
    target = {**source, "PO_DATABASE_URL": target_url}
    wrong = {**target, "PO_ENCRYPTION_KEY": base64.b64encode(b"b" * 32).decode()}
    _one_line_error(_run("restore", str(backup_dir), env=wrong), "the server key does not open this backup")
    restored = _run("restore", str(backup_dir), "--data-dir", str(tmp_path / "restored"), env=target)
    assert 0 == restored.returncode, restored.stderr
    assert "start the server" in restored.stderr
    _one_line_error(_run("restore", str(backup_dir), env=target), "is not empty")
    _one_line_error(_run("backup", str(backup_dir), env=source), "is not an empty directory")
    with_key = _run("backup", str(tmp_path / "with-key"), "--include-key", env=source)
    assert 0 == with_key.returncode, with_key.stderr
    assert (tmp_path / "with-key" / "server.key").read_text() == base64.b64encode(b"a" * 32).decode()


def _empty_database_like(database_url: str, tmp_path: Path) -> str:
    if database_url.startswith("sqlite"):
        return f"sqlite+aiosqlite:///{tmp_path / 'restored.db'}"
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    name = f"{url.database}_restored"
    import asyncio

    import asyncpg  # type: ignore[import-untyped]

    async def create() -> None:
        conn = await asyncpg.connect(
            host=url.host, port=url.port, user=url.username, password=url.password, database="postgres"
        )
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return url.set(database=name).render_as_string(hide_password=False)
