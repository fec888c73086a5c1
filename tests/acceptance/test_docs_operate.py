"""The commands of docs/operate/ (and of the managed runners page) as an operator types them, on real
`orchestrator` processes (SQLite): the server's commands (migrate, serve, a backup while it runs, a
restore), the backup and restore page, the TLS page's start with a certificate and its reload by SIGHUP,
and a server with a managed runner for local development.

What the test changes in them: the machine's paths (`/backups/`, `/var/lib/`, `/etc/po/tls`) are under a
temporary directory, the port is a free one, and `<pid>` is the server's process id."""

from __future__ import annotations

import os
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.docs import Shell, commands, docs_example, substitute, wait_for
from tests.support.kube_api import CertificateAuthority
from tests.support.postgres import PostgresServer, free_port
from tests.support.served_tls import install, served_serial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def root() -> Iterator[Path]:
    """Stands for the machine's `/`: `/backups`, `/var/lib`, `/etc` of the pages are under it."""
    made = Path(tempfile.mkdtemp(prefix="po-docs-operate-"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def operator(root: Path) -> Iterator[Shell]:
    home = root / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PO_", "OCTL_", "XDG_", "PYTEST")) and key not in ("HOME", "PYTHONPATH")
    }
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
        PO_LISTEN=f"127.0.0.1:{free_port()}",
        TMPDIR=str(root),
        PYTHONPATH=os.environ.get("PYTHONPATH", ""),  # this checkout's code, whichever environment runs it
    )
    shell = Shell(cwd=home, env=env, state=root)
    try:
        yield shell
    finally:
        shell.stop()


def paths(root: Path) -> dict[str, str]:
    return {"/backups/": f"{root}/backups/", "/var/lib/": f"{root}/var/lib/"}


def on_root(text: str, root: Path) -> str:
    for old, new in paths(root).items():
        text = text.replace(old, new)
    return text


def serve(shell: Shell, line: str, log: Path) -> str:
    shell.start(line, log=log)
    url = f"http://{shell.env['PO_LISTEN']}"
    wait_for(f"{url}/healthz", log=log)
    return url


def make_org(shell: Shell, url: str) -> str:
    """An organization made with a platform token `orchestrator token create` made; that token."""
    token = shell.run("orchestrator token create").stdout.strip()
    created = httpx.post(f"{url}/orgs", json={"id": "acme"}, headers={"Authorization": f"Bearer {token}"})
    assert 201 == created.status_code, created.text
    return token


def has_org(url: str, token: str) -> bool:
    return 200 == httpx.get(f"{url}/orgs/acme", headers={"Authorization": f"Bearer {token}"}).status_code


def test_server_page__migrate_serve_backup_and_restore(operator: Shell, root: Path) -> None:
    migrate, serve_line, backup, restore = commands(docs_example("operate/server-commands"))
    operator.run(migrate)
    url = serve(operator, serve_line, root / "server.log")
    token = make_org(operator, url)

    operator.run(on_root(backup, root))
    operator.stop()
    done = operator.run(on_root(restore, root))

    assert "start the server" in done.stderr
    operator.env["PO_DATA_DIR"] = f"{root}/var/lib/po-restored"
    restored = serve(operator, "orchestrator serve", root / "restored.log")
    assert has_org(restored, token)


def test_backup_page__backup_with_and_without_the_key_then_restore_with_the_key_kept_apart(
    operator: Shell, root: Path
) -> None:
    data_dir = root / "var" / "lib" / "po"
    operator.env["PO_DATA_DIR"] = str(data_dir)
    url = serve(operator, "orchestrator serve", root / "server.log")
    token = make_org(operator, url)

    made = operator.run(on_root(docs_example("operate/backup"), root))
    assert "server key not included" in made.stderr
    assert not (root / "backups" / "po-2026-01-31" / "server.key").exists()
    assert (root / "backups" / "po-2026-01-31-key" / "server.key").read_bytes() == (
        data_dir / "server.key"
    ).read_bytes()

    operator.stop()  # another machine, or this one after a loss: the restored server takes the port
    del operator.env["PO_DATA_DIR"]
    *prepare, serve_line = commands(on_root(docs_example("operate/restore"), root))
    operator.run("\n".join(prepare))
    restored = serve(operator, serve_line, root / "restored.log")
    assert has_org(restored, token)
    assert 0o700 == (root / "var" / "lib" / "po-restored").stat().st_mode & 0o777


def test_tls_page__serves_https_and_reloads_on_sighup(operator: Shell, root: Path) -> None:
    ca = CertificateAuthority("po-ca")
    tls_dir = root / "etc" / "po" / "tls"
    first = install(ca.issue("127.0.0.1", server=True), tls_dir)
    port = free_port()
    start, reload = commands(
        substitute(docs_example("operate/tls-serve"), {"/etc/po/tls": str(tls_dir), "8443": str(port)})
    )
    (ca_file := root / "ca.pem").write_bytes(ca.pem)
    # No periodic check within the test: only the signal reloads (the page: "reload the files now").
    operator.env["PO_TLS_RELOAD_INTERVAL_SECONDS"] = "3600"
    log = root / "server.log"
    server = operator.start(start, log=log)
    wait_for(f"https://127.0.0.1:{port}/healthz", log=log, verify=ssl.create_default_context(cafile=ca_file))
    assert first == served_serial(port, ca)

    second = install(ca.issue("127.0.0.1", server=True), tls_dir)
    operator.run(substitute(reload, {"<pid>": str(server_pid(server.pid))}))

    waited = time.monotonic()
    while served_serial(port, ca) != second:
        assert time.monotonic() - waited < 30, log.read_text()[-3000:]
        time.sleep(0.2)


def server_pid(shell_pid: int) -> int:
    """The `orchestrator serve` process: the shell's own pid when bash ran it in its place (it does for a
    single command), else its child."""
    command = Path(f"/proc/{shell_pid}/cmdline").read_bytes()
    if b"orchestrator" in command and b"serve" in command:
        return shell_pid
    children = Path(f"/proc/{shell_pid}/task/{shell_pid}/children").read_text().split()
    (child,) = children
    return int(child)


def test_managed_runners_page__a_server_and_a_managed_runner_for_local_development(
    operator: Shell, root: Path
) -> None:
    """docs/runners/managed.md's block in one shell (the server in the background, the runner in the
    foreground), as typed: the runner registers and the pool is online in an organization made after."""
    port = operator.env["PO_LISTEN"].rsplit(":", 1)[1]
    block = substitute(docs_example("runners/managed-local"), {"127.0.0.1:8080": f"127.0.0.1:{port}"})
    log = root / "managed.log"
    operator.start(block, log=log)
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/healthz", log=log)
    token = make_org(operator, url)

    waited = time.monotonic()
    while True:
        pool = httpx.get(f"{url}/orgs/acme/runners/managed", headers={"Authorization": f"Bearer {token}"})
        assert 200 == pool.status_code, pool.text
        if pool.json()["status"]["online"]:
            break
        assert time.monotonic() - waited < 60, log.read_text()[-3000:]
        time.sleep(0.5)
    assert "managed" in pool.json()["status"]["tags"]


def test_database_page__a_server_on_postgresql(
    operator: Shell, root: Path, postgres_server: PostgresServer
) -> None:
    """docs/operate/database.md's commands on the test's PostgreSQL cluster: its user, host and port, and a
    database name of the test's own, in place of the page's."""
    name = f"docs_{os.getpid()}"
    operator.env.update(PGHOST="127.0.0.1", PGPORT=str(postgres_server.port), PGUSER="postgres")
    operator.env["PATH"] = f"{postgres_server.bin_dir}:{operator.env['PATH']}"
    create, export, migrate, serve_line = commands(
        substitute(
            docs_example("operate/postgresql"),
            {
                "createdb po": f"createdb {name}",
                "po@localhost/po": f"postgres@127.0.0.1:{postgres_server.port}/{name}",
            },
        )
    )
    try:
        operator.run("\n".join((create, export, migrate)))
        url = serve(operator, serve_line, root / "server.log")
        ready = httpx.get(f"{url}/readyz").json()
        assert "ok" == ready["checks"]["database"]
        assert not list((Path(operator.env["HOME"]) / ".local/share/platform-orchestrator").glob("*.db*"))
    finally:
        operator.stop()
        postgres_server.drop_database(name)
