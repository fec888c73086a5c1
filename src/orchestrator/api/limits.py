"""Request body size limit for the user API (the runner gateway enforces its own, larger limits)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_API_BODY_BYTES = 1024 * 1024


class BodyLimitMiddleware:
    """Answer 413 to a body over ``max_bytes`` under ``prefix``, before the route reads it whole."""

    def __init__(self, app: ASGIApp, *, prefix: str = "/orgs", max_bytes: int = MAX_API_BODY_BYTES) -> None:
        self.app = app
        self.prefix = prefix
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(send)
                return
        received = 0
        too_large = started = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    raise _TooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            # A body without Content-Length (chunked) is found too large while the app reads it: whatever
            # the app answers then (FastAPI makes it a 400 "error parsing the body") gives way to our 413.
            if too_large:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLargeError:
            pass
        if too_large and not started:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {"error": "API-413", "message": f"request body is larger than {self.max_bytes} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLargeError(Exception):
    pass
