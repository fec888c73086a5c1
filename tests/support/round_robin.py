"""One address in front of several `orchestrator serve` replicas: a TCP proxy on 127.0.0.1 that hands each
new connection to the next backend in turn (round robin), as a load balancer without health checks does.

A backend that refuses the connection (killed, or stopped: uvicorn closes its port first) is skipped and
the next one tried, so a dead replica's share goes to the others; the connections open to a replica when
it dies are cut (the client sees its connection closed and retries, as runners, agents and ``octl`` do).
Requests are spread per connection, not per request: a client that keeps its connection alive stays on
one replica until that connection ends (the tests' clients open one per request to spread theirs).

Usage::

    front = RoundRobin([server.port for server in servers])
    front.start()
    ...                                   # front.url for every client, and as the servers' PO_PUBLIC_URL
    front.stop()
    front.connections                     # per backend port: connections handed to it
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections import Counter
from collections.abc import Sequence

from tests.support.postgres import free_port

#: How long a backend gets to accept a connection before the next one is tried.
CONNECT_TIMEOUT_SECONDS = 2.0


class RoundRobin:
    """A round-robin TCP front for ``backend_ports`` on 127.0.0.1 (see the module)."""

    def __init__(self, backend_ports: Sequence[int], port: int | None = None) -> None:
        if not backend_ports:
            raise ValueError("a front needs at least one backend")
        self.backend_ports = list(backend_ports)
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        #: Per backend port: the connections handed to it.
        self.connections: Counter[int] = Counter()
        #: Connection attempts a backend refused (or did not accept in time), per backend port.
        self.refused: Counter[int] = Counter()
        #: Client connections no backend took (closed at once).
        self.dropped = 0
        self._turn = itertools.count()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> RoundRobin:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(512)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="round-robin").start()
        return self

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            open_connections, self._open = self._open, set()
        for conn in open_connections:
            _close(conn)

    def __enter__(self) -> RoundRobin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            # Connecting may wait for a backend that does not answer: not in the accept loop.
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        """A connection to the next backend that accepts one, starting at this connection's turn."""
        first = next(self._turn)
        count = len(self.backend_ports)
        for n in range(count):
            port = self.backend_ports[(first + n) % count]
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_SECONDS)
            except OSError:
                with self._lock:
                    self.refused[port] += 1
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections[port] += 1
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            with self._lock:
                self.dropped += 1
            _close(client)
            return
        with self._lock:
            if self._listener is None:  # stopped meanwhile
                _close(client)
                _close(upstream)
                return
            self._open.update((client, upstream))
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Either side ending ends the exchange (HTTP clients never half-close).
            for conn in (source, sink):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(source)
            source.close()


def _close(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    conn.close()
