"""The real app under uvicorn in a background thread on 127.0.0.1, a free port (httpx's ``serve_in_thread``).

Usage::

    with serve_in_thread(create_app(settings)) as base_url:
        httpx.get(f"{base_url}/healthz")

When the app must know its own URL (``public_url``, which runners call back), pass a factory instead; it
is called with the base URL once the port is bound::

    with serve_in_thread(factory=lambda url: create_app(settings.model_copy(update={"public_url": url}))):
        ...

The server runs the app's lifespan (migrations, database) in its own event loop; leaving the block
asks it to exit and joins the thread. ``serve_in_loop`` serves an app whose lifespan runs already, in the
test's own event loop (streamed answers, the app's services at hand).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import uvicorn

STARTUP_TIMEOUT_SECONDS = 30.0


class LiveServerError(RuntimeError):
    """The server did not start or stop in time."""


@contextmanager
def serve_in_thread(
    app: Any = None, *, factory: Callable[[str], Any] | None = None, port: int = 0
) -> Iterator[str]:
    """Serve ``app``, or the app ``factory(base_url)`` returns, until the block ends; yields the base URL
    ``http://127.0.0.1:PORT``. ``port``: that port (a server started again where it was), else a free one."""
    if (app is None) == (factory is None):
        raise TypeError("serve_in_thread: give either app or factory")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    if factory is not None:
        try:
            app = factory(base_url)
        except BaseException:
            sock.close()
            raise
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False, http="h11", ws="none", loop="asyncio"
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # reported by the waiting test, not lost in the thread
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"live-server-{port}", daemon=True)
    thread.start()
    try:
        _wait_healthy(base_url, thread, failure)
        yield base_url
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT_SECONDS)
        sock.close()
        if thread.is_alive():
            raise LiveServerError(f"the server at {base_url} did not stop")


def _wait_healthy(base_url: str, thread: threading.Thread, failure: list[BaseException]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if failure:
            raise LiveServerError(f"the server at {base_url} failed to start") from failure[0]
        if not thread.is_alive():
            raise LiveServerError(f"the server at {base_url} exited during start-up")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise LiveServerError(
        f"the server at {base_url} did not answer /healthz within {STARTUP_TIMEOUT_SECONDS} s"
    )


@asynccontextmanager
async def serve_in_loop(app: Any) -> AsyncIterator[str]:
    """Serve ``app``, whose lifespan the caller already runs (the ``app`` fixture), on a free port of
    127.0.0.1 in the running event loop, until the block ends; yields the base URL. Unlike ASGI transports,
    which hand over an answer once it is complete, its answers stream (server-sent events); and the test
    shares the app's event loop, so it may use the app's services meanwhile. Close streaming clients before
    the block ends: the server waits for open requests."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, http="h11", ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not server.started:
            if task.done():
                task.result()
                raise LiveServerError("the server exited during start-up")
            if time.monotonic() > deadline:
                raise LiveServerError("the server did not start")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, STARTUP_TIMEOUT_SECONDS)
        sock.close()
