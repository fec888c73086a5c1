"""A throwaway PostgreSQL server for tests, started from the machine's own PostgreSQL binaries.

Usage::

    server = PostgresServer()          # raises PostgresError if no binaries are found
    server.start(tmp_path)
    try:
        server.create_database("app")
        engine = create_async_engine(server.url("app"))
        ...
    finally:
        server.stop()

PostgreSQL refuses to run as root, so when the tests run as root (as CI does) ``initdb`` and
``pg_ctl`` run as the ``postgres`` OS user, on directories that user owns. The server listens on
127.0.0.1 only, on a free port, with trust authentication; it is tuned for speed, not durability.
It is stopped by its own data directory and PID, never by process name; an ``atexit`` hook stops
any server a test forgot to stop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresError", "PostgresServer", "find_pg_bin", "free_port"]

PG_BIN_ENV = "PO_TEST_PG_BIN"
PG_OS_USER = "postgres"
SUPERUSER = "postgres"
_REQUIRED_TOOLS = ("initdb", "pg_ctl", "postgres", "psql")
# Unix socket paths are limited to 107 bytes; leave room for "/.s.PGSQL.65535".
_MAX_SOCKET_DIR_LEN = 80
_START_ATTEMPTS = 3


class PostgresError(RuntimeError):
    """The test PostgreSQL server could not be found, started, used or stopped."""


def _has_tools(bin_dir: Path) -> bool:
    return all((bin_dir / tool).is_file() for tool in _REQUIRED_TOOLS)


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin
    return tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name)) or (0,)


def find_pg_bin() -> Path | None:
    """Return the directory holding ``initdb``, ``pg_ctl``, ``postgres`` and ``psql``, or None.

    Looks at ``$PO_TEST_PG_BIN`` first (an error if set but incomplete), then the newest
    ``/usr/lib/postgresql/*/bin`` (Debian's layout), then ``initdb`` on ``PATH``.
    """
    explicit = os.environ.get(PG_BIN_ENV)
    if explicit:
        bin_dir = Path(explicit)
        if not _has_tools(bin_dir):
            raise PostgresError(f"{PG_BIN_ENV}={explicit} lacks one of {', '.join(_REQUIRED_TOOLS)}")
        return bin_dir
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if _has_tools(p)]
    if candidates:
        return max(candidates, key=_version_key)
    on_path = shutil.which("initdb")
    if on_path:
        bin_dir = Path(on_path).resolve().parent
        if _has_tools(bin_dir):
            return bin_dir
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (an orphaned postmaster may linger unreaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3, after the parenthesised command name, is the state.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_live_servers: set[PostgresServer] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop()


class PostgresServer:
    """One PostgreSQL cluster: ``start(base_dir)``, ``url(db)``, ``create_database``, ``stop()``."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir if bin_dir is not None else find_pg_bin()
        if found is None:
            raise PostgresError(
                "PostgreSQL server binaries not found: set PO_TEST_PG_BIN, or install them "
                "(Debian: apt-get install postgresql)"
            )
        self.bin_dir: Path = found
        self.port: int = 0
        self.data_dir: Path | None = None
        self.socket_dir: Path | None = None
        self.log_file: Path | None = None
        self.pid: int | None = None
        self._owned_dirs: list[Path] = []
        self._as_root = os.geteuid() == 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, base_dir: Path) -> None:
        """initdb a new cluster under ``base_dir`` and start it; return once it accepts connections."""
        if self.pid is not None:
            raise PostgresError("server already started")
        _live_servers.add(self)
        try:
            root = self._prepare_root(base_dir)
            self.data_dir = root / "data"
            self.log_file = root / "postgres.log"
            self.socket_dir = self._prepare_socket_dir(root)
            self._run_as_owner(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                cwd=root,
                what="initdb",
            )
            self._start_postmaster(root)
        except BaseException:
            self.stop()
            raise

    def pause(self) -> None:
        """Shut the server down cleanly (committed data survives, unlike ``stop``'s immediate mode, which
        with ``synchronous_commit=off`` may lose the last commits); :meth:`resume` starts it again."""
        self._require_started()
        assert self.data_dir is not None
        self._run_as_owner(
            [str(self.bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.data_dir)],
            cwd=self.data_dir.parent,
            what="pg_ctl stop",
        )
        self.pid = None

    def resume(self) -> None:
        """Start a paused server again, on the same port (the same URLs)."""
        if self.pid is not None or self.data_dir is None:
            raise PostgresError("resume: the server is running, or was never started")
        self._start_postmaster(self.data_dir.parent, port=self.port)

    def _start_postmaster(self, root: Path, *, port: int | None = None) -> None:
        assert self.data_dir is not None and self.log_file is not None and self.socket_dir is not None
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.port = port or free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            result = self._run_as_owner(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-o",
                    options,
                ],
                cwd=root,
                what="pg_ctl start",
                check=False,
            )
            self.pid = self._read_pid()
            if result.returncode == 0 and self.pid is not None:
                return
            log = self._log_tail()
            self.stop(keep_dirs=True)
            port_taken = "Address already in use" in log or "could not bind" in log
            if not port_taken or attempt == _START_ATTEMPTS or port is not None:
                raise PostgresError(
                    f"pg_ctl start failed (exit {result.returncode}): {result.stderr.strip()}\n"
                    f"--- {self.log_file} ---\n{log}"
                )

    def stop(self, *, keep_dirs: bool = False, remove_in_background: bool = False) -> None:
        """Stop the server (immediate mode) and wait until its postmaster is gone. Idempotent.

        ``remove_in_background``: its directories are removed by an ``rm -rf`` of their own, not waited
        for (a test session's server holds a database per test, hundreds of thousands of files: removing
        them took a worker over a minute at the end of the suite)."""
        data_dir = self.data_dir
        pid = self.pid if self.pid is not None else self._read_pid()
        if data_dir is not None and (data_dir / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._run_as_owner(
                    [str(self.bin_dir / "pg_ctl"), "stop", "-m", "immediate", "-w", "-D", str(data_dir)],
                    cwd=data_dir.parent,
                    what="pg_ctl stop",
                    check=False,
                )
        if pid is not None:
            self._kill_pid(pid)
        self.pid = None
        if not keep_dirs:
            for owned in self._owned_dirs:
                if remove_in_background and owned.exists():
                    # The shell starts rm in the background and exits at once: rm is no child of ours.
                    subprocess.run(
                        ["sh", "-c", 'rm -rf -- "$1" &', "sh", str(owned)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                        check=False,
                    )
                else:
                    shutil.rmtree(owned, ignore_errors=True)
            self._owned_dirs.clear()
            _live_servers.discard(self)

    def _kill_pid(self, pid: int) -> None:
        """Backstop after pg_ctl stop: signal our own postmaster by PID, never anything by name."""
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            if not _pid_alive(pid):
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + 5.0
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self.pid is not None and _pid_alive(self.pid)

    # -- use ---------------------------------------------------------------------------------

    def url(self, dbname: str) -> str:
        """SQLAlchemy URL for ``dbname``: ``postgresql+asyncpg://postgres@127.0.0.1:PORT/dbname``."""
        self._require_started()
        return f"postgresql+asyncpg://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def dsn(self, dbname: str) -> str:
        """libpq/asyncpg DSN for ``dbname``: ``postgresql://postgres@127.0.0.1:PORT/dbname``."""
        self._require_started()
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE ``name`` (optionally from ``template``, which must have no connections)."""
        sql = f"CREATE DATABASE {_quote_ident(name)}"
        if template is not None:
            sql += f" TEMPLATE {_quote_ident(template)}"
        self.execute(sql)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS ``name``, disconnecting its sessions."""
        self.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")

    def execute(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with psql from the server's bin dir over TCP; return psql's output."""
        self._require_started()
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                dbname,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise PostgresError(f"psql failed on {sql!r}: {result.stderr.strip()}")
        return result.stdout

    # -- helpers -----------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self.pid is None:
            raise PostgresError("server not started")

    def _read_pid(self) -> int | None:
        if self.data_dir is None:
            return None
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError):
            return None

    def _log_tail(self, lines: int = 30) -> str:
        if self.log_file is None:
            return ""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _prepare_root(self, base_dir: Path) -> Path:
        """A directory the server's OS user owns and can reach: ``base_dir/postgres`` or a temp dir."""
        base_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="postgres-", dir=base_dir))
        if not self._as_root:
            return root
        self._chown(root)
        if self._owner_can_use(root):
            return root
        # e.g. pytest's tmp_path under a 0700 /tmp/pytest-of-root: use a temp dir we remove on stop.
        root.rmdir()
        return self._owned_temp_dir()

    def _prepare_socket_dir(self, root: Path) -> Path:
        sock = root / "sock"
        if len(str(sock)) <= _MAX_SOCKET_DIR_LEN:
            sock.mkdir()
            if self._as_root:
                self._chown(sock)
            return sock
        return self._owned_temp_dir()

    def _owned_temp_dir(self) -> Path:
        path = Path(tempfile.mkdtemp(prefix="po-pg-"))
        self._owned_dirs.append(path)
        if self._as_root:
            self._chown(path)
        return path

    def _chown(self, path: Path) -> None:
        try:
            user = pwd.getpwnam(PG_OS_USER)
        except KeyError:
            raise PostgresError(
                f"running as root, but there is no {PG_OS_USER!r} OS user to run PostgreSQL as "
                f"(create it: useradd --system --user-group {PG_OS_USER})"
            ) from None
        os.chown(path, user.pw_uid, user.pw_gid)

    def _owner_can_use(self, path: Path) -> bool:
        probe = [*self._owner_prefix(), "test", "-w", str(path), "-a", "-x", str(path)]
        result = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        return result.returncode == 0

    def _owner_prefix(self) -> list[str]:
        if not self._as_root:
            return []
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", PG_OS_USER, "--"]
        setpriv = shutil.which("setpriv")
        if setpriv:
            user = pwd.getpwnam(PG_OS_USER)
            return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"]
        raise PostgresError("running as root, but neither runuser nor setpriv is available")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["PGCONNECT_TIMEOUT"] = "10"
        return env

    def _run_as_owner(
        self, argv: list[str], *, cwd: Path, what: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self._owner_prefix(), *argv],
            cwd=cwd,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            raise PostgresError(f"{what} failed (exit {result.returncode}): {result.stderr.strip()}")
        return result
