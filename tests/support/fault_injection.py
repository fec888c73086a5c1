"""An ASGI middleware in front of a real app that records every exchange and injects the faults a real
server does not produce on demand: an error status for the next requests of a route, a dropped
connection, a request held until the test releases it.

Usage (the real gateway behind it, served for a runner process)::

    faults = FaultInjector(create_app(settings))
    faults.fail("POST", "/results", [503, 502])  # the next two results POSTs; the third reaches the app
    with serve_in_thread(faults) as url:
        ...
    [exchange.status for exchange in faults.exchanges]

A fault applies to the next requests whose method is ``method`` and whose path ends with ``suffix``;
each is used once, in the order they were added. Everything else reaches the app unchanged (its body is
buffered, to be recorded).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: How long a held request waits for its release before it goes on to the app anyway.
HOLD_TIMEOUT_SECONDS = 60.0


class DroppedConnection(Exception):  # noqa: N818 (what happened, not an error of the test)
    """Raised after the response started: the server closes the connection mid-answer."""


@dataclass
class Exchange:
    method: str
    path: str
    body: bytes
    #: The status answered; None for a dropped connection.
    status: int | None = None
    #: Answered by an injected fault, not by the app.
    injected: bool = False

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Hold:
    """A request held until :meth:`release`; :attr:`arrived` is set when it comes."""

    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class _Fault:
    method: str
    suffix: str
    status: int | None = None
    drop: bool = False
    hold: Hold | None = None

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and path.endswith(self.suffix)


class FaultInjector:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()

    def fail(self, method: str, suffix: str, statuses: list[int]) -> None:
        """Answer the next ``len(statuses)`` matching requests with these statuses (a JSON error body)."""
        with self._lock:
            self._faults.extend(_Fault(method, suffix, status=status) for status in statuses)

    def drop(self, method: str, suffix: str, times: int = 1) -> None:
        """Start answering the next ``times`` matching requests, then close the connection."""
        with self._lock:
            self._faults.extend(_Fault(method, suffix, drop=True) for _ in range(times))

    def hold(self, method: str, suffix: str) -> Hold:
        """Hold the next matching request (then pass it to the app) until the test releases it."""
        held = Hold()
        with self._lock:
            self._faults.append(_Fault(method, suffix, hold=held))
        return held

    def of(self, method: str, suffix: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == method and e.path.endswith(suffix)]

    def _take(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for index, fault in enumerate(self._faults):
                if fault.matches(method, path):
                    return self._faults.pop(index)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        exchange = Exchange(method=scope["method"], path=scope["path"], body=body)
        self.exchanges.append(exchange)
        fault = self._take(exchange.method, exchange.path)
        if fault is not None and fault.hold is not None:
            fault.hold.arrived.set()
            await asyncio.to_thread(fault.hold.released.wait, HOLD_TIMEOUT_SECONDS)
        elif fault is not None:
            exchange.injected = True
            await _inject(fault, exchange, send)
            return

        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            await send(message)

        await self.app(scope, _replay(body, receive), recording)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _inject(fault: _Fault, exchange: Exchange, send: Send) -> None:
    if fault.drop:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        raise DroppedConnection(f"{exchange.method} {exchange.path}: connection dropped by the test")
    assert fault.status is not None
    exchange.status = fault.status
    data = json.dumps({"error": f"API-{fault.status}", "message": "injected by the test"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": fault.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
