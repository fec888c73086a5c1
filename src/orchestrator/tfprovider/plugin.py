"""The go-plugin side of Terraform's plugin protocol: the handshake line, TLS, and the gRPC services.

Terraform starts the provider with ``PLUGIN_PROTOCOL_VERSIONS`` (6 must be in it) and, with automatic
mTLS (its default), its own certificate in ``PLUGIN_CLIENT_CERT``. The provider listens on a Unix socket
in a directory only its user can open, prints ``1|6|unix|<socket>|grpc|<certificate>`` (the DER of a
certificate made for this process, base64 without padding) and serves:

- ``tfplugin6.Provider``: the methods of `server.HANDLERS` (others answer ``UNIMPLEMENTED``);
- ``plugin.GRPCController/Shutdown``: answered, then the process exits at once;
- ``plugin.GRPCStdio/StreamStdio``: an empty stream (nothing is printed to forward);
- ``grpc.health.v1.Health/Check``: ``SERVING``.

The certificate is new for every start (`certificate`).

Requests and responses pass as bytes: a message is parsed by the handler that needs it only. Terraform's
certificate is not verified: gRPC's TLS cannot check the P-521 key go-plugin makes (as pyvider found);
the socket's directory (0700) is what keeps other users out. ``SIGINT`` is ignored, as go-plugin's servers
do (Terraform stops its providers itself); ``SIGTERM`` ends the process, and so does Terraform exiting.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

from orchestrator.tfprovider import certificate

#: go-plugin's handshake: core protocol 1, then the plugin protocol version.
CORE_PROTOCOL_VERSION: Final = 1
PROTOCOL_VERSION: Final = 6
#: Terraform's limit for one message (``grpcMaxMessageSize`` in its internal/plugin6).
MAX_MESSAGE_BYTES: Final = 256 << 20
#: HealthCheckResponse{status: SERVING}.
HEALTH_SERVING: Final = b"\x08\x01"
#: How often the provider checks that Terraform, its parent, still runs.
PARENT_CHECK_SECONDS: Final = 2.0
SOCKET_NAME: Final = "plugin.sock"
#: A Unix socket's path has room for 107 bytes; a longer socket directory falls back to /tmp.
MAX_SOCKET_PATH: Final = 100


class PluginError(Exception):
    """The provider cannot serve what Terraform asks for (a protocol version, a transport)."""


def offered_versions(environ: dict[str, str] | os._Environ[str]) -> list[int]:
    return [
        int(part) for part in environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",") if part.strip().isdigit()
    ]


@contextlib.contextmanager
def socket_directory(environ: dict[str, str] | os._Environ[str]) -> Iterator[str]:
    """A new directory only this user can open (``PLUGIN_UNIX_SOCKET_DIR``, else ``TMPDIR`` or /tmp),
    removed with what is in it afterwards. (tempfile and shutil would cost a start more to import than
    this takes.)"""
    parent = environ.get("PLUGIN_UNIX_SOCKET_DIR") or environ.get("TMPDIR") or "/tmp"
    name = f"tfprovider-{os.urandom(6).hex()}"
    if len(os.path.join(parent, name, SOCKET_NAME)) > MAX_SOCKET_PATH:
        parent = "/tmp"
    directory = os.path.join(parent, name)
    os.mkdir(directory, 0o700)
    try:
        yield directory
    finally:
        for name in os.listdir(directory):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def handshake_line(socket_path: str, certificate_der: bytes | None) -> str:
    cert = binascii.b2a_base64(certificate_der, newline=False).decode().rstrip("=") if certificate_der else ""
    return f"{CORE_PROTOCOL_VERSION}|{PROTOCOL_VERSION}|unix|{socket_path}|grpc|{cert}"


class Plugin:
    """One provider process: the gRPC server, until Terraform shuts it down."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()

    def _handlers(self) -> list[Any]:
        import grpc

        from orchestrator.tfprovider.server import HANDLERS

        def unary(handler: Any) -> Any:
            async def call(request: bytes, context: Any) -> bytes:
                answer: bytes = await handler(request)
                return answer

            return grpc.unary_unary_rpc_method_handler(call)

        async def shutdown(request: bytes, context: Any) -> bytes:
            self.stopping.set()
            return b""

        async def stream_stdio(request: bytes, context: Any) -> AsyncIterator[bytes]:
            return
            yield b""  # an async generator that ends at once

        async def health(request: bytes, context: Any) -> bytes:
            return HEALTH_SERVING

        return [
            grpc.method_handlers_generic_handler(
                "tfplugin6.Provider", {method: unary(handler) for method, handler in HANDLERS.items()}
            ),
            grpc.method_handlers_generic_handler(
                "plugin.GRPCController", {"Shutdown": grpc.unary_unary_rpc_method_handler(shutdown)}
            ),
            grpc.method_handlers_generic_handler(
                "plugin.GRPCStdio", {"StreamStdio": grpc.unary_stream_rpc_method_handler(stream_stdio)}
            ),
            grpc.method_handlers_generic_handler(
                "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(health)}
            ),
        ]

    async def serve(self, environ: dict[str, str] | os._Environ[str]) -> None:
        import grpc

        if PROTOCOL_VERSION not in offered_versions(environ):
            raise PluginError(
                f"Terraform offers plugin protocol versions {environ.get('PLUGIN_PROTOCOL_VERSIONS')!r}; "
                f"this provider speaks {PROTOCOL_VERSION} (Terraform 1.0 or later)"
            )
        with socket_directory(environ) as directory:
            socket_path = os.path.join(directory, SOCKET_NAME)
            server = grpc.aio.server(
                handlers=self._handlers(),
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            certificate_der = None
            if environ.get("PLUGIN_CLIENT_CERT", "").strip():
                certificate_der, key_pem = certificate.certificate_and_key()
                credentials = grpc.ssl_server_credentials([(key_pem, certificate.pem(certificate_der))])
                server.add_secure_port(f"unix:{socket_path}", credentials)
            else:  # Terraform asked for no TLS (TF_DISABLE_PLUGIN_TLS): plaintext, an empty field
                server.add_insecure_port(f"unix:{socket_path}")
            await server.start()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
            sys.stdout.write(handshake_line(socket_path, certificate_der) + "\n")
            sys.stdout.flush()
            parent = os.getppid()
            while not self.stopping.is_set():
                try:
                    await asyncio.wait_for(self.stopping.wait(), PARENT_CHECK_SECONDS)
                except TimeoutError:
                    if os.getppid() != parent:  # Terraform is gone
                        break
            await server.stop(grace=1.0)  # the Shutdown answer, and any call still running


def run() -> None:
    """Serve until Terraform shuts the provider down, then exit at once (nothing to tear down)."""
    from orchestrator.tfprovider import session

    session.skip_optional_imports()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(Plugin().serve(os.environ))
    except PluginError as exc:
        print(f"terraform-provider-platform-orchestrator: {exc}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
