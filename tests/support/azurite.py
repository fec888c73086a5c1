"""Azure Blob Storage for the ``azurerm`` Terraform state backend: Azurite (npm ``azurite``, the Azure
Storage emulator, installed by ``.ci/run`` into tests/tools/azurite) set up the way Terraform's backend
can use it, which is more than Azurite's defaults:

- over TLS, with a throwaway CA whose server certificate names ``127.0.0.1``, ``localhost`` and
  ``*.blob.localhost`` (Go trusts it through ``SSL_CERT_FILE``: ``ca_file``);
- a custom account (``AZURITE_ACCOUNTS``; the backend builds ``https://<account>.blob.<suffix>`` URLs,
  which Azurite reads as the account of a production-style URL);
- a metadata host: the backend asks ``https://<metadata_host>/metadata/endpoints?api-version=2022-09-01``
  for the cloud's endpoints; a tiny HTTPS stub here answers with ``localhost:<azurite port>`` as the storage
  suffix, so the blob endpoint is ``https://<account>.blob.localhost:<port>``;
- that name resolvable: nothing resolves ``*.localhost`` here (no DNS; Go reads only /etc/hosts), so the
  stub is also an HTTP CONNECT proxy that connects ``*.localhost`` names to 127.0.0.1, which the runner's
  Terraform uses through ``HTTPS_PROXY`` (``backend_environment``). It connects nowhere else.

Stand-ins, said plainly: Azurite emulates the Blob API (shared-key authentication, blob leases: the
backend's lock is a lease on the state blob), the stub plays Azure's metadata service and DNS.

Usage::

    with start_azurite(tmp_path) as storage:       # EmulatorMissingError without node or azurite
        storage.container_client("tfstate")        # azure-storage-blob, for the test's own look
        storage.backend_environment()              # ARM_* / SSL_CERT_FILE / HTTPS_PROXY for the runner
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import http.server
import ipaddress
import json
import os
import secrets
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from azure.storage.blob import BlobServiceClient, ContainerClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.emulators import Emulator, EmulatorError, EmulatorMissingError
from tests.support.postgres import free_port

__all__ = ["ACCOUNT", "AzureStorage", "find_azurite", "start_azurite"]

AZURITE_ENV = "PO_TEST_AZURITE"
#: Where ``.ci/run`` installs the pinned Azurite (``npm ci`` of tests/tools/azurite/package-lock.json).
TOOLS_DIR = Path(__file__).resolve().parent.parent / "tools" / "azurite"
ACCOUNT = "postatestore"
READY_TIMEOUT_SECONDS = 30.0


def find_azurite() -> tuple[Path, Path] | None:
    """(node, Azurite's blob ``main.js``): $PO_TEST_AZURITE or tests/tools/azurite/node_modules."""
    node = shutil.which("node")
    override = os.environ.get(AZURITE_ENV)
    main = (
        Path(override)
        if override
        else TOOLS_DIR / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    )
    if node is None or not main.is_file():
        return None
    return Path(node), main


# --- certificates ---------------------------------------------------------------------------------------


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, localhost and *.blob.localhost: (ca, cert, key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "azurite test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("*.blob.localhost"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = (directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


# --- the metadata host and name resolution ----------------------------------------------------------------


class _Stub(http.server.ThreadingHTTPServer):
    daemon_threads = True
    storage_suffix = ""


class _StubHandler(http.server.BaseHTTPRequestHandler):
    """``GET /metadata/endpoints`` (Azure's metadata service, 2022-09-01 shape) and ``CONNECT`` to
    ``*.localhost`` names (connected to 127.0.0.1: the name resolution nothing else here does)."""

    server: _Stub

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if not self.path.startswith("/metadata/endpoints"):
            self.send_error(404)
            return
        host = self.headers.get("Host", "")
        body = json.dumps(
            {
                "name": "AzuriteTest",
                "resourceManager": f"https://{host}/",
                "microsoftGraphResourceId": f"https://{host}/",
                "authentication": {
                    "loginEndpoint": f"https://{host}/",
                    "audiences": [f"https://{host}/"],
                    "tenant": "common",
                    "identityProvider": "AAD",
                },
                "suffixes": {"storage": self.server.storage_suffix},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        host, _, port = self.path.rpartition(":")
        if not (host == "localhost" or host.endswith(".localhost")) or not port.isdigit():
            self.send_error(403, "this stand-in connects *.localhost names only")
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
        except OSError:
            self.send_error(502)
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        client = self.connection
        with upstream:
            sockets = [client, upstream]
            while True:
                readable, _, _ = select.select(sockets, [], [], 60)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is client else client).sendall(data)


def _serve(server: http.server.HTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    return thread


# --- Azurite --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class AzureStorage:
    """A running Azurite blob service with its TLS CA, metadata host and name-resolving proxy."""

    account: str
    key: str
    port: int
    ca_file: Path
    metadata_host: str
    proxy_url: str
    emulator: Emulator
    _servers: list[http.server.HTTPServer] = field(default_factory=list)

    @property
    def blob_url(self) -> str:
        """Path-style (``https://127.0.0.1:PORT/<account>``), for the test's own SDK client."""
        return f"https://127.0.0.1:{self.port}/{self.account}"

    def service_client(self) -> BlobServiceClient:
        connection = (
            f"DefaultEndpointsProtocol=https;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_url};"
        )
        return BlobServiceClient.from_connection_string(connection, connection_verify=str(self.ca_file))

    def container_client(self, name: str) -> ContainerClient:
        return self.service_client().get_container_client(name)

    def backend_environment(self) -> dict[str, str]:
        """What the runner's Terraform needs besides the backend block: the metadata host, trust in the
        CA, and the proxy resolving ``<account>.blob.localhost`` (the access key goes in as a secret)."""
        return {
            "ARM_METADATA_HOSTNAME": self.metadata_host,
            "SSL_CERT_FILE": str(self.ca_file),
            "HTTPS_PROXY": self.proxy_url,
            "NO_PROXY": "",
        }

    def stop(self) -> None:
        """Stop the stub's servers and Azurite (by its PID). Idempotent."""
        _live.discard(self)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers = []
        self.emulator.stop()

    def __enter__(self) -> AzureStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_live: set[AzureStorage] = set()


@atexit.register
def _stop_leftovers() -> None:
    for storage in list(_live):
        with contextlib.suppress(Exception):
            storage.stop()


def start_azurite(work_dir: Path) -> AzureStorage:
    """Azurite's blob service over TLS with account ``ACCOUNT``, and the stub; EmulatorMissingError
    without node or Azurite."""
    found = find_azurite()
    if found is None:
        raise EmulatorMissingError(
            "Azurite not found: run `npm ci --prefix tests/tools/azurite` (Node.js 20; .ci/run does it), "
            f"or set {AZURITE_ENV} to Azurite's dist/src/blob/main.js"
        )
    node, main = found
    ca, cert, key_file = _certificates(work_dir / "tls")
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    port = free_port()
    data = work_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / f"azurite-{port}.log"
    argv = [
        str(node),
        str(main),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data)),
        *("--cert", str(cert), "--key", str(key_file)),
        *("--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"),
    ]
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"},
            cwd=work_dir,
            start_new_session=True,
        )
    emulator = Emulator("azurite", process, port, log_file)
    try:
        _wait_ready(emulator, ca)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key_file)
        metadata = _Stub(("127.0.0.1", 0), _StubHandler)
        metadata.storage_suffix = f"localhost:{port}"
        metadata.socket = context.wrap_socket(metadata.socket, server_side=True)
        proxy = _Stub(("127.0.0.1", 0), _StubHandler)
    except BaseException:
        emulator.stop()
        raise
    storage = AzureStorage(
        account=ACCOUNT,
        key=key,
        port=port,
        ca_file=ca,
        metadata_host=f"127.0.0.1:{metadata.server_address[1]}",
        proxy_url=f"http://127.0.0.1:{proxy.server_address[1]}",
        emulator=emulator,
        _servers=[metadata, proxy],
    )
    _serve(metadata)
    _serve(proxy)
    _live.add(storage)
    return storage


def _wait_ready(emulator: Emulator, ca: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    url = f"https://127.0.0.1:{emulator.port}/{ACCOUNT}?comp=list"
    while time.monotonic() < deadline:
        if not emulator.running:
            raise EmulatorError(
                f"azurite exited with code {emulator.process.returncode} during start-up\n"
                f"--- {emulator.log_file} ---\n{emulator.log_tail()}"
            )
        with contextlib.suppress(httpx.TransportError):
            httpx.get(url, verify=ssl.create_default_context(cafile=str(ca)), timeout=1.0)
            return  # any answer (403 without credentials): it serves
        time.sleep(0.1)
    emulator.stop()
    raise EmulatorError(f"azurite did not answer within {READY_TIMEOUT_SECONDS} s\n{emulator.log_tail()}")
