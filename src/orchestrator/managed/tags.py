"""The tags a managed runner registers with: ``linux`` on Linux, ``docker`` when a Docker daemon answers,
and ``RUNNER_TAGS``. Never ``kubernetes`` by itself, not even inside a cluster (``KUBERNETES_SERVICE_HOST``
set, kubectl installed): cluster-inventory deployments stay on the customers' runners unless an operator
adds the tag deliberately. The server adds ``managed``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

#: Where a Docker daemon listens when ``DOCKER_HOST`` does not say otherwise.
DEFAULT_DOCKER_SOCKET: Final = Path("/var/run/docker.sock")
#: How long the daemon may take to answer ``/_ping``.
PING_TIMEOUT_SECONDS: Final = 2.0
_PING: Final = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"


def _pinged(family: socket.AddressFamily, address: str | tuple[str, int], timeout: float) -> bool:
    """A Docker daemon at ``address`` answers ``GET /_ping`` with 200."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.sendall(_PING)
            status_line = sock.makefile("rb").readline(200)
    except OSError:
        return False
    parts = status_line.split()
    return len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1] == b"200"


def docker_answers(
    environ: Mapping[str, str],
    *,
    default_socket: Path = DEFAULT_DOCKER_SOCKET,
    timeout: float = PING_TIMEOUT_SECONDS,
) -> bool:
    """A Docker daemon answers at ``DOCKER_HOST`` (``unix://`` or plain ``tcp://``) or at the default
    socket. A daemon that wants TLS (``DOCKER_TLS_VERIFY``) is not asked: no ``docker`` tag."""
    host = environ.get("DOCKER_HOST", "").strip()
    if not host:
        return _pinged(socket.AF_UNIX, str(default_socket), timeout)
    parts = urlsplit(host)
    if parts.scheme == "unix":
        return _pinged(socket.AF_UNIX, parts.path, timeout)
    if parts.scheme == "tcp" and parts.hostname and not environ.get("DOCKER_TLS_VERIFY"):
        return _pinged(
            socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET,
            (parts.hostname, parts.port or 2375),
            timeout,
        )
    return False


def detect_tags(
    environ: Mapping[str, str],
    extra: Iterable[str] = (),
    *,
    platform: str = sys.platform,
    default_socket: Path = DEFAULT_DOCKER_SOCKET,
) -> list[str]:
    """The tags to register with: detected ones, then ``extra`` (``RUNNER_TAGS``), each once."""
    detected = []
    if platform.startswith("linux"):
        detected.append("linux")
    if docker_answers(environ, default_socket=default_socket):
        detected.append("docker")
    return list(dict.fromkeys([*detected, *extra]))
