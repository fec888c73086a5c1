"""Serve a small Starlette app over TLS on 127.0.0.1 (uvicorn in a thread, a free port), with a server
certificate from a test CA: the cloud stand-ins (tests/support/gcp_standin.py, azure_standin.py) run on it.

The clients under test are the clouds' own libraries (google-auth, azure-identity), which use requests:
``trust(ca, path, monkeypatch)`` writes the CA to a bundle file and points ``REQUESTS_CA_BUNDLE`` at it,
the variable requests documents, so nothing in the libraries is patched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support.kube_api import CertificateAuthority


def trust(ca: CertificateAuthority, path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make requests (in this process and the processes it starts) trust ``ca`` only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(ca.pem)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(path))
    return path


class _CloseConnections:
    """Answers with ``Connection: close``: no idle keep-alive connection is left open when the stand-in
    stops (its event loop would be gone before the client's pool lets go of it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


@contextlib.contextmanager
def serve_tls(app: Starlette, ca: CertificateAuthority, work_dir: Path, name: str) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields ``https://127.0.0.1:PORT``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    serving = ca.issue(name, server=True)
    cert, key = work_dir / f"{name}.crt", work_dir / f"{name}.key"
    cert.write_bytes(serving.cert_pem)
    key.write_bytes(serving.key_pem)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        _CloseConnections(app),
        lifespan="off",
        log_level="critical",
        access_log=False,
        http="h11",
        ws="none",
        loop="asyncio",
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the {name} stand-in did not start")
        time.sleep(0.02)
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
