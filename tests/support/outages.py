"""Outages for tests: a real ``orchestrator serve`` process to kill (``SIGKILL``) or stop (``SIGTERM``) and
start again, a TCP proxy that can refuse connections (an unreachable backend), what the database holds
of an environment's state, and the processes of a local run.

Nothing is simulated inside the server: it is the real command, killed for real; the proxy only stands
between a client and a real server (moto, the orchestrator) and closes its port, as a dead host would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from orchestrator.launchers import processes
from orchestrator.secretbox import SecretBox, decode_key, load_or_create_key
from orchestrator.store import db
from orchestrator.store import states as state_store
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.postgres import free_port

#: ``python -c`` code that runs ``orchestrator serve`` unable to import the modules named by its arguments,
#: as if they were not installed: ``None`` in ``sys.modules`` makes every import of a name (and of its
#: submodules) raise ModuleNotFoundError naming it, the import system's documented way to block a module.
#: Nothing of the libraries or of the orchestrator is touched, and only this process is affected.
UNIMPORTABLE_PRELUDE = """
import runpy, sys
for name in sys.argv[1:]:
    sys.modules[name] = None
sys.argv = ["orchestrator", "serve"]
runpy.run_module("orchestrator.cli.server", run_name="__main__", alter_sys=True)
"""


class ServerProcess:
    """``orchestrator serve`` as a real process on a fixed port, started again after each outage.

    Local runs execute as the test's user in ``<data dir>/../runs``, unless ``environment`` says
    otherwise (``PO_LOCAL_RUN_USER``, ``PO_LOCAL_RUNS_DIR``). A free port unless :meth:`at_port` says
    which (a server that takes over another's address). ``unimportable``: modules the server
    process cannot import, as if they were not installed (:data:`UNIMPORTABLE_PRELUDE`)."""

    def __init__(
        self,
        database_url: str,
        data_dir: Path,
        *,
        unimportable: Sequence[str] = (),
        https_ca: str | None = None,
        **environment: str,
    ) -> None:
        self.unimportable = tuple(unimportable)
        self.port = free_port()
        # ``https_ca`` (PEM): the server serves HTTPS (PO_TLS_* in ``environment``) with a certificate of it.
        self.verify: ssl.SSLContext | bool = True
        if https_ca is not None:
            self.verify = ssl.create_default_context(cadata=https_ca)
        self.url = f"{'https' if https_ca is not None else 'http'}://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.runs_dir = Path(environment.get("PO_LOCAL_RUNS_DIR", data_dir.parent / "runs"))
        self.database_url = database_url
        self.env = {
            **os.environ,
            "PO_DATABASE_URL": database_url,
            "PO_DATA_DIR": str(data_dir),
            "PO_LISTEN": f"127.0.0.1:{self.port}",
            "PO_PUBLIC_URL": self.url,
            "PO_BOOTSTRAP_TOKEN": BOOTSTRAP_TOKEN,
            "PO_ALLOW_LOCAL_RUNNERS": "true",
            "PO_LOCAL_RUN_USER": "",
            "PO_LOCAL_RUNS_DIR": str(self.runs_dir),
            "PO_STATUS_CHECK_INTERVAL_SECONDS": "0.5",
            "PO_LOG_LEVEL": "warning",
            **environment,
        }
        self.log = data_dir.parent / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def at_port(self, port: int) -> ServerProcess:
        """Serve (and name itself, ``PO_PUBLIC_URL``) at ``port`` instead; before :meth:`start`."""
        self.port = port
        self.url = f"{self.url.split('://')[0]}://127.0.0.1:{port}"
        self.env.update(PO_LISTEN=f"127.0.0.1:{port}", PO_PUBLIC_URL=self.url)
        self.log = self.data_dir.parent / f"server-{port}.log"
        return self

    def start(self, timeout_seconds: float = 60) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = (
            [sys.executable, "-c", UNIMPORTABLE_PRELUDE, *self.unimportable]
            if self.unimportable
            else [sys.executable, "-m", "orchestrator.cli.server", "serve"]
        )
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command,
                env=self.env,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server did not start: {self.log.read_text()[-3000:]}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9``: no shutdown at all."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout_seconds: float = 60) -> None:
        """SIGTERM: uvicorn's graceful shutdown (open requests finish, then the lifespan ends)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            self.kill()

    def stop(self) -> None:
        if self.running:
            self.terminate(30)

    def key(self) -> bytes:
        configured = self.env.get("PO_ENCRYPTION_KEY")
        return decode_key(configured) if configured else load_or_create_key(self.data_dir)


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port``; ``down()`` closes its port and cuts the open
    connections (the backend is unreachable: connection refused), ``up()`` listens on it again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def up(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            open_connections, self._connections = self._connections, set()
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._connections.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (source, sink):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._connections.discard(source)
            source.close()


@dataclass
class StoredState:
    """What the orchestrator's database holds of environments' Terraform state (state storage
    ``orchestrator``): the newest version, opened with the server key, and the lock."""

    database_url: str
    key: bytes

    def _run(self, query: Callable[[Any], Any]) -> Any:
        async def go() -> Any:
            engine = db.create_engine(self.database_url)
            try:
                async with engine.connect() as conn:
                    return await query(conn)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def latest(self, env_uuid: str) -> dict[str, Any] | None:
        found = self._run(lambda conn: state_store.latest(conn, uuid.UUID(env_uuid)))
        if found is None:
            return None
        state: dict[str, Any] = json.loads(SecretBox(self.key).open(found[1], context=f"tfstate:{env_uuid}"))
        return state

    def versions(self, env_uuid: str) -> list[int]:
        found: list[int] = self._run(lambda conn: state_store.versions(conn, uuid.UUID(env_uuid)))
        return found

    def lock(self, env_uuid: str) -> dict[str, Any] | None:
        held: dict[str, Any] | None = self._run(lambda conn: state_store.get_lock(conn, uuid.UUID(env_uuid)))
        return held


def resource_ids(state: Mapping[str, Any] | None, kind: str = "terraform_data") -> dict[str, str]:
    """``address -> id`` of the state's resources of ``kind`` (every instance), tainted ones included."""
    found: dict[str, str] = {}
    for resource in (state or {}).get("resources", []):
        if resource.get("type") != kind or resource.get("mode") != "managed":
            continue
        prefix = f"{resource['module']}." if resource.get("module") else ""
        for instance in resource.get("instances", []):
            index = instance.get("index_key")
            suffix = "" if index is None else f"[{json.dumps(index)}]"
            found[f"{prefix}{kind}.{resource['name']}{suffix}"] = instance["attributes"]["id"]
    return found


def run_handle(run_dir: Path) -> tuple[int, int]:
    """(pid, start ticks) of a local run's runner, from its pid file."""
    _, _, pid, started, _ = (run_dir / "runner.pid").read_text().split(":", 4)
    return int(pid), int(started)


def zygote_of(server: ServerProcess) -> int | None:
    """The pid of the server's zygote (its child ``po-runner zygote``, ``PO_LOCAL_ZYGOTE``), if it has one
    (the runners it forked have its command line too, but not the server as their parent)."""
    if server.process is None:
        return None
    for pid in _children(server.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.cli.runner" in command and b"zygote" in command:
            return pid
    return None


def _children(parent: int) -> list[int]:
    """The live (not zombie) children of ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        info = processes.read_stat(int(entry.name))
        if info is not None and info.state != "Z" and _parent_of(info.pid) == parent:
            found.append(info.pid)
    return found


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def run_processes(run_dir: Path) -> list[int]:
    """The live processes of a local run (its runner, and every process of its session)."""
    pid, started = run_handle(run_dir)
    return processes.members(pid, started)


def wait_for(condition: Callable[[], Any], timeout_seconds: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it answers something true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
