"""A real OpenSSH server on loopback for the ``vm`` runner over SSH: ``sshd -f CONFIG`` as this test's user.

Usage::

    with running_sshd(tmp_path) as server:      # skips (fails in CI) when sshd is not installed
        server.host, server.port                 # 127.0.0.1 and a free high port
        server.username                          # the login: this process's user (root in CI)
        server.host_public_key                   # its host key, OpenSSH format (the runner's pin)
        server.private_key                       # a client key it accepts (OpenSSH format)

The server has its own host key and ``authorized_keys`` in ``tmp_path``, listens on 127.0.0.1 only, takes
public keys only (no PAM, no passwords), and ``StrictModes no`` (the files are in a temporary directory).
It is started by absolute path (sshd requires it) in the foreground (``-D``), logs to a file (``-E``),
and is stopped by its PID (SIGTERM, then SIGKILL), never by name.

Keys are made with ``cryptography`` (Ed25519), not ``ssh-keygen``: only the server itself is needed.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tests.support.postgres import free_port
from tests.support.tools import tools_required

__all__ = ["SshKeyPair", "SshServer", "new_key_pair", "running_sshd", "sshd_path", "vm_runner_body"]

#: Where Debian's ``openssh-server`` puts the daemon.
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
#: The privilege separation directory sshd needs when it runs as root (the system service makes it).
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT_SECONDS = 15.0
#: This checkout's virtualenv: its ``po-runner`` is what the host runs.
VENV_BIN = str(Path(sys.executable).parent)


@dataclass(frozen=True)
class SshKeyPair:
    #: OpenSSH private key format (``-----BEGIN OPENSSH PRIVATE KEY-----``), unencrypted.
    private_key: str
    #: ``ssh-ed25519 AAAA...``
    public_key: str


def new_key_pair() -> SshKeyPair:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return SshKeyPair(private_key=private, public_key=public)


def sshd_path() -> Path | None:
    for candidate in SSHD_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    found = shutil.which("sshd")
    return Path(found) if found else None


@dataclass
class SshServer:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    username: str
    host_keys: SshKeyPair
    client_keys: SshKeyPair
    log_file: Path

    @property
    def host_public_key(self) -> str:
        return self.host_keys.public_key

    @property
    def private_key(self) -> str:
        return self.client_keys.private_key

    def connection(self, **overrides: object) -> dict[str, object]:
        """A runner's ``connection`` for this server."""
        return {
            "type": "ssh",
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "host_public_key": self.host_public_key,
            "private_key": self.private_key,
            **overrides,
        }

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)


def _missing(message: str) -> NoReturn:
    if tools_required():
        pytest.fail(message)
    pytest.skip(message)


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(("127.0.0.1", port))
            return sock.recv(4).startswith(b"SSH-")
        except OSError:
            return False


@contextlib.contextmanager
def running_sshd(directory: Path) -> Iterator[SshServer]:
    """Start sshd in ``directory`` (made if missing); skip (fail in CI) when it is not installed."""
    sshd = sshd_path()
    if sshd is None:
        _missing("sshd is not installed (Debian: apt-get install openssh-server)")
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    host_keys, client_keys = new_key_pair(), new_key_pair()
    _write_private(directory / "host_ed25519", host_keys.private_key)
    (directory / "authorized_keys").write_text(client_keys.public_key + "\n")
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {directory / 'host_ed25519'}",
                f"PidFile {directory / 'sshd.pid'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "UsePAM no",
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log_file = directory / "sshd.log"
    process = subprocess.Popen(
        [str(sshd), "-D", "-f", str(config), "-E", str(log_file)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = SshServer(
        process=process,
        host="127.0.0.1",
        port=port,
        username=getpass.getuser(),
        host_keys=host_keys,
        client_keys=client_keys,
        log_file=log_file,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start:\n{server.log_tail()}")
            time.sleep(0.05)
        yield server
    finally:
        server.stop()


def vm_runner_body(
    server: SshServer, tmp_path: Path, *, secrets: dict[str, str] | None = None, **connection: Any
) -> dict[str, Any]:
    """A ``vm`` runner over SSH to ``server`` running this checkout's ``po-runner`` with the embedded
    engine, its runs in ``tmp_path/vm-runs``, its state in the orchestrator; ``connection`` overrides."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    job: dict[str, Any] = {
        "work_dir": str(tmp_path / "vm-runs"),
        "environment": {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "IAC_BACKEND": "embedded",
            "TF_CLI_CONFIG_FILE": str(tf_config),
            "CHECKPOINT_DISABLE": "1",
        },
    }
    if secrets:
        job["secrets"] = secrets
    return {
        "runner_configuration": {"type": "vm", "connection": server.connection(**connection), "job": job},
        "state_storage_configuration": {"type": "orchestrator"},
    }
