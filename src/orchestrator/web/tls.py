"""HTTPS of ``orchestrator serve`` itself (``PO_TLS_CERT_FILE``, ``PO_TLS_KEY_FILE``): one live
``ssl.SSLContext`` whose certificate chain is reloaded in place, and the runner gateway's client
certificate requirement (``PO_TLS_CLIENT_CA_FILE``, ``PO_TLS_CLIENT_AUTH``).

The context is created once and handed to the listening socket; ``ServerTls.reload`` loads a changed
certificate and key into that same context (after loading them into a scratch context first: a half-written
pair, as cert-manager's rotation may leave for a moment, changes nothing and is tried again at the next
check). Connections made afterwards present the new certificate; open connections keep theirs.

A client CA makes the handshake ask for a certificate without requiring one (``CERT_OPTIONAL``): one that
is presented must verify, and the request then carries it in the ASGI ``tls`` extension
(``scope["extensions"]["tls"]["client_cert_chain"]``, filled in by ``server.TlsH11Protocol``).
``ClientCertificateMiddleware`` refuses gateway requests without it, so that probes and the API stay
reachable without one. A reloaded client CA is added to the trusted ones; a CA removed from the file stays
trusted until the server restarts (OpenSSL cannot forget a loaded CA).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.errors import ConfigurationError, UnauthenticatedError
from orchestrator.settings import ServerSettings
from orchestrator.web.errors import error_response

log = structlog.get_logger(__name__)

#: The prefix of the routes a client certificate is required on (``PO_TLS_CLIENT_AUTH=gateway``).
GATEWAY_PREFIX = "/runner-gateway/"

CLIENT_CERTIFICATE_REQUIRED = (
    "the runner gateway requires a client certificate signed by the server's client CA "
    "(PO_TLS_CLIENT_CA_FILE): give the runner or agent one with RUNNER_GATEWAY_CLIENT_CERT_FILE and "
    "RUNNER_GATEWAY_CLIENT_KEY_FILE"
)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from exc


@dataclass(kw_only=True)
class ServerTls:
    """The server's SSL context and the files it is loaded from."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    context: ssl.SSLContext = field(init=False)
    #: Digest of the files' contents last loaded.
    _loaded: str = field(init=False, default="")
    _reload_now: asyncio.Event | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca_file is not None:
            self.context.verify_mode = ssl.CERT_OPTIONAL
        self.reload()

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ServerTls | None:
        """The context of ``settings``' files, or None without ``PO_TLS_CERT_FILE``; ConfigurationError
        naming the file that cannot be loaded."""
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None
        return cls(
            cert_file=settings.tls_cert_file,
            key_file=settings.tls_key_file,
            client_ca_file=settings.tls_client_ca_file,
        )

    def reload(self) -> bool:
        """Load the files into the live context if they changed: True if they were; ConfigurationError
        (the context unchanged) if they cannot be read or do not make a key pair."""
        cert, key = _read(self.cert_file), _read(self.key_file)
        client_ca = _read(self.client_ca_file) if self.client_ca_file is not None else b""
        digest = hashlib.sha256(b"\0".join(hashlib.sha256(part).digest() for part in (cert, key, client_ca)))
        if digest.hexdigest() == self._loaded:
            return False
        # The bytes read once, loaded from a private copy into a scratch context, then into the live one:
        # a file replaced meanwhile cannot leave the live context with a certificate without its key.
        with tempfile.TemporaryDirectory(prefix="po-tls-") as private:
            cert_copy, key_copy = Path(private) / "tls.crt", Path(private) / "tls.key"
            cert_copy.write_bytes(cert)
            key_copy.write_bytes(key)
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                scratch.load_cert_chain(certfile=cert_copy, keyfile=key_copy)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"cannot load the TLS certificate {self.cert_file} with the key {self.key_file}: {exc}"
                ) from exc
            if self.client_ca_file is not None:
                try:
                    scratch.load_verify_locations(cadata=client_ca.decode(errors="replace"))
                except (ssl.SSLError, ValueError) as exc:
                    raise ConfigurationError(
                        f"cannot load PO_TLS_CLIENT_CA_FILE {self.client_ca_file}: {exc}"
                    ) from exc
            self.context.load_cert_chain(certfile=cert_copy, keyfile=key_copy)
            if self.client_ca_file is not None:
                self.context.load_verify_locations(cadata=client_ca.decode(errors="replace"))
        first = not self._loaded
        self._loaded = digest.hexdigest()
        if not first:
            log.info("TLS certificate reloaded", cert_file=str(self.cert_file))
        return True

    def request_reload(self) -> None:
        """SIGHUP: check the files now (the watch loop does it; a no-op before it runs)."""
        if self._reload_now is not None:
            self._reload_now.set()

    async def watch(self, interval_seconds: float) -> None:
        """Reload changed files every ``interval_seconds`` and at each ``request_reload``, until cancelled;
        a pair that does not load is logged and the current one kept."""
        self._reload_now = asyncio.Event()
        while True:
            try:
                async with asyncio.timeout(interval_seconds):
                    await self._reload_now.wait()
            except TimeoutError:
                pass
            self._reload_now.clear()
            try:
                self.reload()
            except ConfigurationError as exc:
                log.warning("TLS files not reloaded; the current certificate stays", problem=exc.message)


class ClientCertificateMiddleware:
    """Refuse (401) runner gateway requests whose connection presented no verified client certificate."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(GATEWAY_PREFIX):
            tls = scope.get("extensions", {}).get("tls") or {}
            if not tls.get("client_cert_chain"):
                await error_response(UnauthenticatedError(CLIENT_CERTIFICATE_REQUIRED))(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: What a PEM certificate starts with.
_PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"


def own_certificate(cert_file: Path) -> str | None:
    """The PEM text of the server's own certificate file (read at each launch: it may have been rotated),
    which its local runs trust; None when it cannot be read (the run then trusts the system CAs only)."""
    try:
        text = cert_file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("local runs do not get the server's certificate", file=str(cert_file), problem=str(exc))
        return None
    return text if _PEM_CERTIFICATE in text else None
